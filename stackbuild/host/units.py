"""systemd units and containers on the host: stage + verify, install atomically, start/stop, logs.

Small pure helpers build the text and judge tool output; the rest are thin
calls on a `Remote`, each safe to repeat.
"""

from __future__ import annotations

import re

from stackbuild.errors import GateFailed, InfraError, InputError
from stackbuild.host.ssh import READ_FILE_SCRIPT, Remote, sh_argv

INSTALL_SCRIPT = (
    'install -m 0644 "$1" "$2.stackbuild-tmp" && mv -f "$2.stackbuild-tmp" "$2" '
    "&& systemctl daemon-reload"
)
REMOVE_SCRIPT = (
    'systemctl stop "$1" 2>/dev/null; systemctl reset-failed "$1" 2>/dev/null; '
    'if [ -e "$2" ]; then rm -f "$2" && systemctl daemon-reload; fi; true'
)
LOGS_SCRIPT = (
    'echo "== journalctl -u $1"; '
    'journalctl -u "$1" --since "@$3" --no-pager -o cat 2>&1 | tail -n 400; '
    # the unit runs the container with --rm: once it exited, the journal above has its output
    'if docker inspect "$2" >/dev/null 2>&1; then echo "== docker logs $2"; '
    'docker logs --since "$3" "$2" 2>&1 | tail -n 400; fi; true'
)
# The side-by-side switch as one host-side transaction: candidate unit removed, main unit
# stopped, the new main unit installed and started. Run by systemd (systemd-run), so the host
# finishes it even when the client or its SSH connection dies halfway; the previous unit
# text stays in the state file for a restore.
SWITCH_SCRIPT = (
    'systemctl stop "$1" 2>/dev/null; systemctl reset-failed "$1" 2>/dev/null; rm -f "$2"; '
    'systemctl stop "$3"; '
    'install -m 0644 "$4" "$5.stackbuild-tmp" && mv -f "$5.stackbuild-tmp" "$5" && systemctl daemon-reload '
    '&& { systemctl reset-failed "$3" 2>/dev/null; systemctl start "$3"; }'
)
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


def switch_unit_text(script: str, args: list[str]) -> str:
    """A oneshot unit running the switch script: `systemctl start` waits for it, systemd owns it."""
    from stackbuild.render.stack import exec_line

    return (
        "# Written by stackbuild: the side-by-side switch, finished by systemd even if the client dies.\n"
        "[Unit]\nDescription=stackbuild switch\n\n"
        f"[Service]\nType=oneshot\nExecStart={exec_line(['/bin/sh', script, *args])}\n"
    )


def switch(remote: Remote, staging_dir: str, unit_dir: str, service: str, args: list[str]) -> None:
    """Run SWITCH_SCRIPT with `args` as one host-side transaction (a oneshot unit), waiting for its end."""
    script = f"{staging_dir}/switch.sh"
    unit = f"stackbuild-switch-{service}.service"
    remote.put_text(SWITCH_SCRIPT + "\n", script, mode=0o700)
    remote.put_text(switch_unit_text(script, args), f"{unit_dir}/{unit}")
    remote.run(["systemctl", "daemon-reload"], what="load the switch unit")
    remote.run(["systemctl", "reset-failed", unit], check=False, what="reset-failed")
    remote.run(["systemctl", "start", unit], what=f"switch {service} to the candidate", timeout=300)


def remove(remote: Remote, unit: str, unit_path: str) -> None:
    remote.run(sh_argv(REMOVE_SCRIPT, unit, unit_path), what=f"remove {unit}")


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
