"""A scripted in-memory host implementing `Remote`, for unit tests of logic behind SSH.

It interprets the commands the flow really sends (it matches the script
constants the flow uses, not loose patterns), records every argv, and fails
loudly on a command it does not know, so a changed command shows up as a test
failure rather than a silent pass. Each script's effect on files, units and
images is the real script's, step by step.

Layers: fake_base.py (files, clock, the `Remote` plumbing), fake_systemd.py
(units, docker; `reboot()`), fake_server.py (the servers and their HTTP), this module (the host lease, the
state file, the secrets files, preflight's reads). Tests script failures per
command with `fail_when`, a dropped connection with `drop_on`/`drop_when`, and
how each image's server behaves with `servers` (see `Behaviour`).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from stackbuild.host.gateway import KEY_SCRIPT, POOL_SCRIPT, RECORDS_SCRIPT
from stackbuild.host.pcie import PCIE_SCRIPT, TOPO_P2P_READ
from stackbuild.host.preflight import (
    CDI_SCRIPT,
    DOCKER_INFO,
    LIMITS_SCRIPT,
    NVIDIA_SMI_QUERY,
    TCP_SCRIPT,
    df_argv,
)
from stackbuild.host.secrets import BACKUP_SCRIPT, RESTORE_SCRIPT
from stackbuild.host.ssh import RemoteResult
from stackbuild.host.state import (
    ACQUIRE_SCRIPT,
    BREAK_SCRIPT,
    LEASE_AGE_SCRIPT,
    READ_LEASE_SCRIPT,
    RELEASE_SCRIPT,
    SERVICES_SCRIPT,
)
from stackbuild.render.gateway import pool_text, pool_urls
from stackbuild.testing.fake_base import Client, FakeRemote, Killed, Scripted, UnknownCommand
from stackbuild.testing.fake_server import (
    FAILS_FIRST_GENERATION,
    NEVER_LISTENS,
    SERVES,
    UNHEALTHY,
    Behaviour,
    FakeHttp,
    Proc,
    crashes,
)
from stackbuild.testing.fake_systemd import FakeSystemd, SysUnit

__all__ = [
    "FAILS_FIRST_GENERATION",
    "NEVER_LISTENS",
    "SERVES",
    "UNHEALTHY",
    "Behaviour",
    "Client",
    "FakeHost",
    "FakeHttp",
    "FakeRemote",
    "Killed",
    "Proc",
    "Scripted",
    "SysUnit",
    "UnknownCommand",
    "crashes",
]


@dataclass
class FakeHost(FakeSystemd):
    """The whole fake host. What preflight reads is data: change it to make a check fail."""

    docker_version: str | None = "27.3.1"  # None: the daemon is down
    docker_root: str = "/var/lib/docker"
    runtimes: str = '{"io.containerd.runc.v2":{"path":"runc"},"runc":{"path":"runc"}}'
    cdi_nvidia: bool = False
    gpus_csv: str | None = None  # nvidia-smi's CSV; None: no nvidia-smi on the host
    free_kib: int = 200 * 2**20
    dockerd_limits: str | None = None  # /proc/PID/limits of dockerd; None: not visible
    keys_made: int = 0  # control-plane keys this host made (each one differs)
    p2p_matrix: str | None = None  # `nvidia-smi topo -p2p r`; None: that fails
    pcie_text: str = "== cmdline\nBOOT_IMAGE=/vmlinuz ro\n== iommu\n== acs\n"  # what PCIE_SCRIPT prints

    # -- interpretation ----------------------------------------------------------------------
    def _interpret(self, args: list[str], cmd: str) -> RemoteResult:
        if args == DOCKER_INFO:
            if self.docker_version is None:
                return RemoteResult(cmd, 1, "", "Cannot connect to the Docker daemon at unix:///var/run/docker.sock.")
            return self._ok(cmd, f"{self.docker_version}|{self.docker_root}|{self.runtimes}\n")
        if args == TOPO_P2P_READ:
            if self.p2p_matrix is None:
                return RemoteResult(cmd, 127, "", "bash: line 1: nvidia-smi: command not found")
            return self._ok(cmd, self.p2p_matrix)
        if args == NVIDIA_SMI_QUERY:
            if self.gpus_csv is None:
                return RemoteResult(cmd, 127, "", "bash: line 1: nvidia-smi: command not found")
            return self._ok(cmd, self.gpus_csv)
        if args[:5] == ["docker", "run", "--rm", "--network", "none"] and args[5:9:2] == ["--gpus", "--entrypoint"]:
            return self._kernel_check(args, cmd)
        if len(args) == 3 and args == df_argv(args[2]):
            if args[2] != self.docker_root:
                return RemoteResult(cmd, 1, "", f"df: {args[2]}: No such file or directory")
            used = 50 * 2**20
            return self._ok(cmd, "Filesystem     1024-blocks      Used Available Capacity Mounted on\n"
                                 f"/dev/nvme0n1p2 {used + self.free_kib} {used} {self.free_kib} 20% /\n")
        return super()._interpret(args, cmd)

    def _kernel_check(self, args: list[str], cmd: str) -> RemoteResult:
        """image.smoke.host_kernel_check_argv: the image's kernels imported on the host's GPUs."""
        if len(args) != 12 or args[8] != "python3" or args[10] != "-c":
            raise UnknownCommand(f"FakeHost does not model: {cmd}")
        image = args[9]
        if image not in self.images:
            return RemoteResult(cmd, 125, "", f"docker: Error response from daemon: No such image: {image}")
        if '"nvidia"' not in self.runtimes and not self.cdi_nvidia:
            return RemoteResult(cmd, 125, "", "docker: Error response from daemon: could not select device driver "
                                "\"\" with capabilities: [[gpu]].")
        if image not in self.servers:
            raise UnknownCommand(f"no Behaviour scripted for image {image} (FakeHost.servers)")
        err = self.servers[image].kernel_error
        return RemoteResult(cmd, 1, "", f"Traceback (most recent call last):\n{err}\n") if err else \
            self._ok(cmd, '{"sgl_kernel": "ok"}\n')

    def _script(self, script: str, p: list[str], cmd: str) -> RemoteResult:
        if script == ACQUIRE_SCRIPT:
            lock, owner = p
            self._mkdirs(posixpath.dirname(lock))
            if lock in self.dirs:
                return RemoteResult(cmd, 3, self.files.get(f"{lock}/owner.json", ""), "")
            self.dirs[lock] = self.now
            self.files[f"{lock}/owner.json"] = owner
            return self._ok(cmd, "acquired\n")
        if script == BREAK_SCRIPT:
            lock, seen, stamp = p
            if self.files.get(f"{lock}/owner.json", "") != seen:
                return RemoteResult(cmd, 1, "", "")
            for d in [d for d in self.dirs if d.startswith(lock + ".stale.")]:
                self._rmtree(d)
            self._mvtree(lock, f"{lock}.stale.{stamp}")
            return self._ok(cmd)
        if script == LEASE_AGE_SCRIPT:
            (lock,) = p
            if lock not in self.dirs:
                return RemoteResult(cmd, 1, "", f"stat: cannot stat '{lock}'")
            return self._ok(cmd, f"{int(self.now - self.dirs[lock])}\n")
        if script == RELEASE_SCRIPT:
            lock, owner = p
            if lock not in self.dirs:
                return self._ok(cmd)
            if self.files.get(f"{lock}/owner.json", "") != owner:
                return RemoteResult(cmd, 1, "", "")
            self._rmtree(lock)
            return self._ok(cmd)
        if script == READ_LEASE_SCRIPT:
            (lock,) = p
            return self._ok(cmd, self.files.get(f"{lock}/owner.json", "")) if lock in self.dirs else \
                RemoteResult(cmd, 1, "", "")
        if script == SERVICES_SCRIPT:  # ls -1 of a dir: its entries, one a line
            (top,) = p
            under = [x[len(top) + 1:] for x in [*self.dirs, *self.files] if x.startswith(top + "/")]
            names = sorted({x.split("/")[0] for x in under if not x.startswith(".")})  # ls skips dot entries
            return self._ok(cmd, "".join(f"{n}\n" for n in names)) if top in self.dirs else RemoteResult(cmd, 2, "", "")
        if script in (BACKUP_SCRIPT, RESTORE_SCRIPT):
            return self._secrets(script, p, cmd)
        if script == PCIE_SCRIPT:
            return self._ok(cmd, self.pcie_text)
        if script == CDI_SCRIPT:
            return self._ok(cmd, "nvidia.yaml\n") if self.cdi_nvidia else RemoteResult(cmd, 1, "", "")
        if script == LIMITS_SCRIPT:
            return self._ok(cmd, self.dockerd_limits) if self.dockerd_limits is not None else \
                RemoteResult(cmd, 1, "", "")
        if script == TCP_SCRIPT:
            return self._ok(cmd, self.socket_table())
        if script == POOL_SCRIPT:  # the gateway's pool file: "-URL" out, "+URL" in, the rest kept in order
            path, *edits = p
            self._mkdirs(posixpath.dirname(path), 0o700)
            drop = {e[1:] for e in edits}
            urls = [u for u in pool_urls(self.files.get(path)) if u not in drop] + [e[1:] for e in edits if e[0] == "+"]
            self.files[path], self.modes[path] = pool_text(urls), 0o644
            return self._ok(cmd)
        if script == KEY_SCRIPT:  # the gateway's control-plane key: made once (0600), then printed
            path, mode, var = p
            made = ""
            if mode == "create":
                self._mkdirs(posixpath.dirname(path), 0o700)
                if not self.files.get(path, "").startswith(f"{var}="):
                    self.keys_made += 1
                    self.files[path], made = f"{var}=fake-key-{self.keys_made}-{self.address}\n", "new\n"
                self.modes[path] = 0o600
            text = self.files.get(path, "")
            return self._ok(cmd, made + text.removeprefix(f"{var}=")) if text else RemoteResult(cmd, 1, "", "")
        if script == RECORDS_SCRIPT:
            (top,) = p
            docs = [self.files[f] for f in sorted(self.files) if f.startswith(top + "/") and f.endswith("/state.json")]
            return self._ok(cmd, "".join(f"{d}\n---\n" for d in docs))
        return super()._script(script, p, cmd)

    def _secrets(self, script: str, p: list[str], cmd: str) -> RemoteResult:
        """secrets.py's two scripts, as the shell runs them."""
        if script == BACKUP_SCRIPT:
            op, bak = p
            if bak in self.files or f"{bak}.absent" in self.files:
                return self._ok(cmd)  # the first copy is kept
            self._mkdirs(posixpath.dirname(bak))
            if op in self.files:
                self.files[bak] = self.files[op]
                self.modes[bak] = self.modes.get(op, 0o644)  # cp -p
            else:
                self.files[f"{bak}.absent"] = ""
                self.modes[f"{bak}.absent"] = 0o644
            return self._ok(cmd)
        op, bak, cand = p  # RESTORE_SCRIPT
        if bak in self.files:
            self._move(bak, op)
        elif f"{bak}.absent" in self.files:
            self._rm(op, f"{bak}.absent")
        self._rm(cand)
        return self._ok(cmd)
