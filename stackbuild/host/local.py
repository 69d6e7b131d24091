"""A local stand-in GPU host: the systemd+sshd test-host container on 127.0.0.1 (demo, tests).

It shares the machine's Docker daemon (socket mounted), so the units it starts
run sibling containers with --network host. Its own key pair and a
known_hosts entry scanned from it live in a directory the caller owns.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from stackbuild.effects import proc
from stackbuild.effects.net import free_port
from stackbuild.errors import InfraError

DOCKER = "/usr/bin/docker"
TESTHOST_IMAGE = "local/stackbuild-testhost:bookworm"


@dataclass(frozen=True)
class LocalHost:
    container: str
    port: int
    key: Path
    known_hosts: Path

    @property
    def target(self) -> str:
        return f"root@127.0.0.1:{self.port}"


def run_argv(name: str, port: int, pubkey: str, image: str) -> list[str]:
    """`docker run` of a systemd+sshd host (flags verified in notes/local-infra.md)."""
    return [
        DOCKER,
        "run",
        "-d",
        "--name",
        name,
        "--network",
        "host",
        "--cap-add",
        "SYS_ADMIN",
        "-v",
        "/sys/fs/cgroup:/sys/fs/cgroup:rw",
        "--tmpfs",
        "/run",
        "--tmpfs",
        "/run/lock",
        "-v",
        "/var/run/docker.sock:/var/run/docker.sock",
        "-v",
        f"{DOCKER}:/usr/bin/docker:ro",
        "-e",
        f"SSHD_PORT={port}",
        "-e",
        f"SSH_AUTHORIZED_KEY={pubkey.strip()}",
        "--label",
        "dev.stackbuild.localhost=1",
        image,
    ]


def start(
    directory: Path,
    *,
    name: str | None = None,
    port: int | None = None,
    image: str = TESTHOST_IMAGE,
    timeout_s: float = 60,
) -> LocalHost:
    """Start (or reuse, when `name` runs with our key) a host container; wait for sshd."""
    directory.mkdir(parents=True, exist_ok=True)
    key = directory / "id_ed25519"
    if not key.exists():
        proc.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], what="ssh-keygen")
    pubkey = key.with_suffix(".pub").read_text().strip()
    name = name or f"stackbuild-host-{secrets.token_hex(3)}"
    known = directory / "known_hosts"
    fmt = "{{.State.Running}}|{{range .Config.Env}}{{println .}}{{end}}"
    running = proc.run([DOCKER, "inspect", "--format", fmt, name], check=False)
    env = dict(
        ln.split("=", 1) for ln in running.stdout.partition("|")[2].splitlines() if "=" in ln
    )
    reused = running.stdout.startswith("true") and env.get("SSH_AUTHORIZED_KEY") == pubkey
    if reused:
        port = int(env.get("SSHD_PORT", "0"))
    else:
        if running.returncode == 0:
            proc.run([DOCKER, "rm", "-f", name], check=False)
        port = port or free_port()
        proc.run(run_argv(name, port, pubkey, image), what=f"start the host container {name}")
    try:
        keys = wait_up(name, port, timeout_s)
    except InfraError:
        if not reused:  # a host this call made and that never came up is not left behind
            proc.run([DOCKER, "rm", "-f", name], check=False)
        raise
    known.write_text(known_hosts_text(port, keys))
    return LocalHost(name, port, key, known)


def known_hosts_text(port: int, keys: list[str]) -> str:
    """known_hosts lines for 127.0.0.1:port from the host's own `TYPE BASE64` public keys."""
    return "".join(f"[127.0.0.1]:{port} {k}\n" for k in keys)


def parse_pubkeys(text: str) -> list[str]:
    """`TYPE BASE64` of each `ssh_host_*_key.pub` line (the comment dropped)."""
    return [" ".join(ln.split()[:2]) for ln in text.splitlines() if len(ln.split()) >= 2]


def wait_up(name: str, port: int, timeout_s: float = 60) -> list[str]:
    """Wait until the container's systemd is running and its own sshd answers on the port.

    The keys are read from inside the container and must be the ones the port
    serves, so a port another sshd took in a race is never trusted. Returns them.
    """
    deadline = time.monotonic() + timeout_s
    state = seen = ""
    keys: list[str] = []
    while time.monotonic() < deadline:
        # generated once at first boot: read until they exist, then keep them
        keys = keys or parse_pubkeys(_exec(name, "cat /etc/ssh/ssh_host_*_key.pub 2>/dev/null"))
        state = _exec(name, "systemctl is-system-running 2>/dev/null").strip()
        if state == "degraded":
            raise InfraError(f"host container {name}: systemd is degraded; see `docker exec {name} "
                             "systemctl --failed`", output=_exec(name, "systemctl --failed --no-pager"))
        if keys and state == "running":
            scan = proc.run(["ssh-keyscan", "-p", str(port), "127.0.0.1"], check=False, timeout=10)
            seen = scan.stdout
            if any(k in seen for k in keys):
                return keys
        time.sleep(0.3)
    logs = proc.run([DOCKER, "logs", "--tail", "30", name], check=False)
    why = "another sshd answers there" if seen.strip() else f"systemd {state or 'not answering'}"
    raise InfraError(
        f"host container {name}: its sshd did not answer on 127.0.0.1:{port} within {timeout_s:.0f}s ({why})",
        output=logs.stdout + logs.stderr,
    )


def _exec(name: str, script: str) -> str:
    return proc.run([DOCKER, "exec", name, "sh", "-c", script], check=False, timeout=30).stdout


def stop(host: LocalHost, services: tuple[str, ...] = ()) -> None:
    """Remove the host and the sibling containers its units started."""
    for svc in services:
        proc.run(
            [DOCKER, "exec", host.container, "systemctl", "stop", svc, f"{svc}-candidate"], check=False, timeout=120
        )
        proc.run([DOCKER, "rm", "-f", svc, f"{svc}-candidate"], check=False)
    proc.run([DOCKER, "rm", "-f", host.container], check=False)
