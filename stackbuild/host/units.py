"""systemd units and containers on the host: stage + verify, install atomically, start/stop, logs.

Small pure helpers build the text and judge tool output; the rest are thin
calls on a `Remote`, each safe to repeat.
"""

from __future__ import annotations

import re

from stackbuild.errors import GateFailed, InfraError, InputError
from stackbuild.host.ssh import READ_FILE_SCRIPT, Remote, sh_argv
from stackbuild.host.state import HostPaths
from stackbuild.render.stack import exec_line

# Where a unit lives says when it runs. The promoted release's unit is a file in /etc/systemd/system,
# enabled (it starts on boot). Anything not committed in the host state runs from /run, a tmpfs that
# is empty after a reboot: a candidate or switch unit in /run/systemd/system, and the main unit while
# it runs a release under test from /run/systemd/system.control, which systemd reads before /etc
# (systemd.unit(5), "System Unit Search Path"; `systemd-analyze unit-paths`). So a host that reboots
# at any step before the commit boots the release its state file names.
INSTALL_SCRIPT = (
    'mkdir -p "$(dirname "$2")" && install -m 0644 "$1" "$2.stackbuild-tmp" && mv -f "$2.stackbuild-tmp" "$2" '
    "&& systemctl daemon-reload"
)
# $1 the unit, then every path it may have a file at: stopped, not enabled, its files gone.
REMOVE_SCRIPT = (
    'u=$1; shift; systemctl stop "$u" 2>/dev/null; systemctl reset-failed "$u" 2>/dev/null; '
    'systemctl disable --quiet "$u" 2>/dev/null; r=; '
    'for p in "$@"; do if [ -e "$p" ]; then rm -f "$p" && r=1; fi; done; '
    'if [ -n "$r" ]; then systemctl daemon-reload; fi; true'
)
# The commit of a release as its unit ($4): its text into /etc (atomic rename), the /run file it ran
# from dropped, enabled (only now: `enable` links the first file found, and /run's must be gone), the
# service's other unit ($7) disabled (a boot starts one release), the new host state ($5) renamed
# over the state file ($6), then what the transaction no longer needs (the rest: the other unit's
# files, the secrets backup) removed, in one host-side command. A client killed or disconnected
# never splits it; only power lost between the renames does, and then the state still carries its
# pending marker, so the next run converges the host.
COMMIT_SCRIPT = (
    'install -m 0644 "$1" "$2.stackbuild-tmp" && mv -f "$2.stackbuild-tmp" "$2" && rm -f "$3" '
    '&& systemctl daemon-reload && systemctl enable --quiet "$4" && { systemctl disable --quiet "$7" 2>/dev/null; '
    'true; } && mv -f "$5" "$6" && shift 7 && rm -f "$@" && systemctl daemon-reload'
)
LOGS_SCRIPT = (
    'echo "== journalctl -u $1"; '
    'journalctl -u "$1" --since "@$3" --no-pager -o cat 2>&1 | tail -n 400; '
    # the unit runs the container with --rm: once it exited, the journal above has its output
    'if docker inspect "$2" >/dev/null 2>&1; then echo "== docker logs $2"; '
    'docker logs --since "$3" "$2" 2>&1 | tail -n 400; fi; true'
)
# The side-by-side switch as one host-side transaction: candidate unit removed, main unit
# stopped, the candidate's main unit installed as the /run override ($5) and started. Run by
# systemd (a oneshot unit), so the host finishes it even when the client or its SSH connection
# dies halfway; the committed unit in /etc is untouched until the commit.
SWITCH_SCRIPT = (
    'systemctl stop "$1" 2>/dev/null; systemctl reset-failed "$1" 2>/dev/null; rm -f "$2"; '
    'systemctl stop "$3"; mkdir -p "$(dirname "$5")" && '
    'install -m 0644 "$4" "$5.stackbuild-tmp" && mv -f "$5.stackbuild-tmp" "$5" && systemctl daemon-reload '
    '&& { systemctl reset-failed "$3" 2>/dev/null; systemctl start "$3"; }'
)
EXISTING_SCRIPT = 'for p in "$@"; do if [ -e "$p" ]; then echo "$p"; fi; done'
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def verify_errors(stderr: str, unit: str, path: str) -> list[str]:
    """Lines of `systemd-analyze verify` output about our unit: all count as errors.

    verify exits 0 on unknown keys and bad values, only warning; lines about
    other units on the host (their own problems) are not ours to judge.
    """
    return [ln.strip() for ln in stderr.splitlines() if ln.strip() and (unit in ln or path in ln)]


def env_file_text(values: dict[str, str]) -> str:
    """An EnvironmentFile where every value is read back literally by systemd."""
    lines = ["# written by stackbuild; mode 0600; secrets only, by name"]
    for name in sorted(values):
        if not _ENV_NAME.match(name):
            raise InputError(f"secret name {name!r}: use letters, digits and _ (an env var name)")
        v = values[name]
        esc = v.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`")
        lines.append(f'{name}="{esc}"')
    return "\n".join(lines) + "\n"


def remote_now(remote: Remote) -> int:
    res = remote.run(["date", "+%s"], what="read the host clock", changes=False)
    text = res.stdout.strip()
    return int(text) if text.isdigit() else 0


def stage_and_verify(remote: Remote, staging_dir: str, unit: str, text: str) -> str:
    """Upload the unit to the staging dir and verify it there; returns its staged path."""
    path = f"{staging_dir}/{unit}"
    remote.run(["mkdir", "-p", staging_dir], what="create the staging dir")
    remote.put_text(text, path, mode=0o644)
    res = remote.run(
        ["systemd-analyze", "verify", path], check=False, what="systemd-analyze verify"
    )
    errors = verify_errors(res.stdout + res.stderr, unit, path)
    if res.returncode != 0 or errors:
        raise InfraError(
            f"{remote.address}: the rendered unit {unit} does not verify; fix the template "
            "or spec value it names (warnings count as errors)",
            command=res.command,
            returncode=res.returncode,
            output="\n".join(errors) or (res.stdout + res.stderr),
        )
    return path


def install(remote: Remote, staged: str, unit_path: str) -> None:
    remote.run(sh_argv(INSTALL_SCRIPT, staged, unit_path), what=f"install {unit_path}")


def commit(remote: Remote, unit: str, unit_paths: tuple[str, str, str], state: tuple[str, str],
           retire: str, drop: tuple[str, ...]) -> None:
    """COMMIT_SCRIPT: unit_paths (staged, /etc, the /run file it ran from): the staged text becomes
    the enabled `unit`, `retire` is disabled; then state (staged, state file) is renamed into place
    and `drop` removed."""
    remote.run(sh_argv(COMMIT_SCRIPT, *unit_paths, unit, *state, retire, *drop),
               what=f"commit {unit} (installed, enabled)")


def switch_unit_text(script: str, args: list[str]) -> str:
    """A oneshot unit running the switch script: `systemctl start` waits for it, systemd owns it."""
    return (
        "# Written by stackbuild: the side-by-side switch, finished by systemd even if the client dies.\n"
        "[Unit]\nDescription=stackbuild switch\n\n"
        f"[Service]\nType=oneshot\nExecStart={exec_line(['/bin/sh', script, *args])}\n"
    )


def switch(remote: Remote, paths: HostPaths, args: list[str]) -> None:
    """Run SWITCH_SCRIPT with `args` as one host-side transaction (a oneshot unit in /run), waiting
    for its end; its unit is removed when it ends (one a killed client left, by converge)."""
    script, unit = f"{paths.staging_dir}/switch.sh", paths.switch_unit
    remote.put_text(SWITCH_SCRIPT + "\n", script, mode=0o700)
    remote.put_text(switch_unit_text(script, args), paths.switch_paths[0])
    remote.run(["systemctl", "daemon-reload"], what="load the switch unit")
    remote.run(["systemctl", "reset-failed", unit], check=False, what="reset-failed")
    try:
        remote.run(["systemctl", "start", unit], what=f"switch {paths.service} to the candidate", timeout=300)
    finally:
        remove(remote, unit, *paths.switch_paths)


def remove(remote: Remote, unit: str, *paths: str) -> None:
    remote.run(sh_argv(REMOVE_SCRIPT, unit, *paths), what=f"remove {unit}")


def existing(remote: Remote, *paths: str) -> list[str]:
    """Which of `paths` exist on the host."""
    res = remote.run(sh_argv(EXISTING_SCRIPT, *paths), what="look for unit files", changes=False)
    return res.stdout.split()


def enable(remote: Remote, unit: str) -> None:
    remote.run(["systemctl", "enable", "--quiet", unit], what=f"enable {unit} (start on boot)")


def start(remote: Remote, unit: str) -> None:
    remote.run(["systemctl", "reset-failed", unit], check=False, what="reset-failed")
    remote.run(["systemctl", "start", unit], what=f"start {unit}", timeout=120)


def stop(remote: Remote, unit: str) -> None:
    remote.run(["systemctl", "stop", unit], check=False, what=f"stop {unit}", timeout=120)


def is_active(remote: Remote, unit: str) -> bool:
    res = remote.run(["systemctl", "is-active", unit], check=False, what="is-active", changes=False)
    return res.stdout.strip() == "active"


def installed_text(remote: Remote, unit_path: str) -> str | None:
    res = remote.run(
        sh_argv(READ_FILE_SCRIPT, unit_path),
        check=False,
        what="read the installed unit",
        changes=False,
    )
    return res.stdout if res.ok else None


def logs_since(remote: Remote, unit: str, container: str, since_epoch: int) -> str:
    res = remote.run(
        sh_argv(LOGS_SCRIPT, unit, container, str(since_epoch)),
        check=False,
        what="capture logs",
        changes=False,
    )
    return without_prestart_noise(res.stdout, container)


def without_prestart_noise(logs: str, container: str) -> str:
    """Drop the unit's own ExecStartPre `docker rm --force` complaint: no container is the normal case."""
    noise = f"Error: No such container: {container}"
    return "\n".join(ln for ln in logs.split("\n") if ln.strip() != noise)


def image_id_argv(image: str) -> list[str]:
    """The host's image id for `image`; exit 1 when the host does not have it."""
    return ["docker", "image", "inspect", "--format", "{{.Id}}", image]


def container_image_argv(container: str) -> list[str]:
    """The image a running container was started from; exit 1 when no such container runs."""
    return ["docker", "inspect", "--format", "{{.Config.Image}}", container]


def ensure_image(remote: Remote, image: str, timeout: float) -> bool:
    """Pull `image` unless the host has it; True when a pull happened."""
    have = remote.run(
        image_id_argv(image),
        check=False,
        what="inspect image",
        changes=False,
    )
    if have.ok:
        return False
    res = remote.run(
        ["docker", "pull", "--quiet", image], check=False, what="docker pull", timeout=timeout
    )
    if not res.ok:
        raise InfraError(
            f"{remote.address}: cannot pull {image} (registry unreachable or image missing); "
            "nothing on the host was changed: check the registry and re-run",
            command=res.command,
            returncode=res.returncode,
            output=res.stdout + res.stderr,
        )
    return True


def kernel_check(remote: Remote, argv: list[str], timeout: float = 600) -> str:
    """Import the image's kernels on the host's GPUs; a failure rejects the candidate (exit 1)."""
    res = remote.run(argv, check=False, timeout=timeout, what="kernel import check", changes=False)
    if not res.ok:
        last = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
        raise GateFailed(f"the candidate's kernels do not import on this host's GPUs: {last[0][:300]}")
    return "kernels import on the host's GPUs"
