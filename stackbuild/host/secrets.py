"""The host's secrets file belongs to the operator; a deploy only merges into it, and can undo that.

`/etc/stackbuild/<service>.env` is what the main unit reads. A deploy adds or
updates only the names it was given values for (an empty or absent value
changes nothing), keeps every other line as the operator wrote it, and first
keeps a copy of the file the incumbent ran with, so a rollback (or the recovery
after a crash) puts that exact file back. Under side-by-side the candidate
reads its own file until the switch, so an incumbent that restarts meanwhile
still gets its own values.
"""

from __future__ import annotations

import re

from stackbuild.host import units
from stackbuild.host.ssh import READ_FILE_SCRIPT, Remote, sh_argv
from stackbuild.host.state import HostPaths

ENV_DIR = "/etc/stackbuild"

# Keep the first copy: a second deploy step (or a retried one) must not overwrite the
# incumbent's file with an already-merged one. "$2.absent" records that there was none.
BACKUP_SCRIPT = (
    '{ [ -e "$2" ] || [ -e "$2.absent" ]; } && exit 0; mkdir -p "$(dirname "$2")" && '
    'if [ -e "$1" ]; then cp -p "$1" "$2.tmp" && mv -f "$2.tmp" "$2"; else : > "$2.absent"; fi'
)
RESTORE_SCRIPT = (
    'if [ -e "$2" ]; then mv -f "$2" "$1"; elif [ -e "$2.absent" ]; then rm -f "$1" "$2.absent"; fi; rm -f "$3"'
)


def env_file(service: str) -> str:
    return f"{ENV_DIR}/{service}.env"


def candidate_env_file(service: str) -> str:
    return f"{ENV_DIR}/{service}-candidate.env"


def backup_file(paths: HostPaths) -> str:
    return f"{paths.base}/secrets.incumbent.env"


def _assigned(line: str) -> str | None:
    m = re.match(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=", line)
    return m.group(1) if m else None


def merge(existing: str | None, values: dict[str, str]) -> str | None:
    """The operator's file with `values` set; None when nothing would change.

    Empty values count as not given: a shell without the variable must never
    blank the operator's. Other lines (names, comments, order) stay as they are.
    """
    given = {k: v for k, v in values.items() if v}
    if not given:
        return None
    new_lines = units.env_file_text(given).splitlines()[1:]
    by_name = dict(zip(sorted(given), new_lines, strict=True))
    out: list[str] = []
    done: set[str] = set()
    lines = (existing or "").splitlines() or ["# written by stackbuild; mode 0600; secrets by name"]
    for line in lines:
        name = _assigned(line)
        if name in by_name:
            if name not in done:
                out.append(by_name[name])
                done.add(name)
            continue  # a later duplicate would override ours when systemd reads the file
        out.append(line)
    out += [by_name[n] for n in sorted(given) if n not in done]
    text = "\n".join(out) + "\n"
    return None if existing is not None and text == existing else text


def names_in(text: str | None) -> set[str]:
    return {n for ln in (text or "").splitlines() if (n := _assigned(ln))}


def read(remote: Remote, path: str) -> str | None:
    res = remote.run(sh_argv(READ_FILE_SCRIPT, path), check=False, what="read the secrets file", changes=False)
    return res.stdout if res.ok else None


def stage(
    remote: Remote, paths: HostPaths, wanted: tuple[str, ...], values: dict[str, str], *, target: str
) -> list[str]:
    """Merge the given values into `target` (the operator's file or the candidate's copy of it).

    Returns the wanted names that neither the caller nor the host's file has.
    Writing the operator's file first keeps a copy for `restore`.
    """
    op = env_file(paths.service)
    existing = read(remote, op)
    text = merge(existing, {n: values[n] for n in wanted if n in values})
    missing = [n for n in wanted if not values.get(n) and n not in names_in(existing)]
    remote.run(["mkdir", "-p", "-m", "0700", ENV_DIR], what="create the secrets dir")
    if target == op:
        if text is not None:
            remote.run(sh_argv(BACKUP_SCRIPT, op, backup_file(paths)), what="keep the incumbent's secrets file")
            remote.put_text(text, op, mode=0o600, secret=True)
    elif text is not None or existing is not None:
        remote.put_text(text if text is not None else existing or "", target, mode=0o600, secret=True)
    return missing


def restore(remote: Remote, paths: HostPaths) -> None:
    """Put back the file the incumbent ran with (if a deploy changed it) and drop the candidate's copy."""
    remote.run(
        sh_argv(RESTORE_SCRIPT, env_file(paths.service), backup_file(paths), candidate_env_file(paths.service)),
        what="restore the incumbent's secrets file",
    )


def transaction_files(paths: HostPaths) -> tuple[str, ...]:
    """What a deploy keeps only until it commits (the backup, its absence marker, the candidate's copy)."""
    return backup_file(paths), f"{backup_file(paths)}.absent", candidate_env_file(paths.service)
