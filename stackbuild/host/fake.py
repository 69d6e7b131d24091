"""A scripted in-memory host implementing `Remote`, for unit tests of logic behind SSH.

It interprets the commands the flow really sends (it matches the script
constants the flow uses, not loose patterns), records every argv, and fails
loudly on a command it does not know, so a changed command shows up as a test
failure rather than a silent pass. Tests script failures per command with
`fail_when` and a dropped connection with `drop_on`.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from stackbuild.errors import InfraError
from stackbuild.host.ssh import ConnectionLost, RemoteResult, put_text_script, quote_argv
from stackbuild.host.state import ACQUIRE_SCRIPT, BREAK_SCRIPT, LOCK_AGE_SCRIPT, RELEASE_SCRIPT
from stackbuild.host.units import INSTALL_SCRIPT, REMOVE_SCRIPT

# read_state's script (state.py writes it inline): an absent file reads as empty.
READ_IF_EXISTS_SCRIPT = '[ ! -e "$1" ] || cat "$1"'


class UnknownCommand(AssertionError):
    """The fake was sent a command it does not model: extend the fake, do not skip it."""


@dataclass
class Scripted:
    match: Callable[[list[str]], bool]
    result: RemoteResult | None  # None: the connection drops on this command
    times: int = 1


@dataclass
class FakeHost:
    """In-memory files (path -> text), dirs with mtimes, and a clock for `date +%s`."""

    address: str = "fake@127.0.0.1"
    dry_run: bool = False
    files: dict[str, str] = field(default_factory=dict)
    modes: dict[str, int] = field(default_factory=dict)
    dirs: dict[str, float] = field(default_factory=dict)  # path -> mtime (epoch s)
    now: float = 1_700_000_000.0
    commands: list[list[str]] = field(default_factory=list)
    scripted: list[Scripted] = field(default_factory=list)
    units: dict[str, str] = field(default_factory=dict)  # unit -> "active" | "inactive" | "failed"
    daemon_reloads: int = 0
    images: set[str] = field(default_factory=set)  # on the host
    registry: set[str] = field(default_factory=set)  # pullable
    drop_at: int | None = None  # 1-based index of the command on which the connection dies
    closed: bool = False

    # -- scripting ---------------------------------------------------------------------------
    def fail_when(self, match: Callable[[list[str]], bool], *, rc: int = 1, stdout: str = "",
                  stderr: str = "failed (scripted)", times: int = 1) -> None:
        self.scripted.append(Scripted(match, RemoteResult("", rc, stdout, stderr), times))

    def drop_on(self, n: int) -> None:
        """The connection is lost while running the n-th command from now (1-based)."""
        self.drop_at = len(self.commands) + n

    # -- Remote ------------------------------------------------------------------------------
    def run(self, argv: Sequence[str], *, check: bool = True, timeout: float | None = None,
            what: str = "", changes: bool = True) -> RemoteResult:
        args = [str(a) for a in argv]
        cmd = quote_argv(args)
        self.commands.append(args)
        if self.closed:
            raise ConnectionLost(f"{self.address}: connection closed", command=cmd)
        if self.drop_at is not None and len(self.commands) >= self.drop_at:
            self.drop_at = None
            raise ConnectionLost(f"{self.address}: connection lost during {what or cmd}", command=cmd)
        res = self._scripted(args, cmd) or self._interpret(args, cmd)
        if check and not res.ok:
            raise InfraError(f"{what or 'command'} failed on {self.address}", command=cmd,
                             returncode=res.returncode, output=res.stdout + res.stderr)
        return res

    def put_text(self, text: str, path: str, *, mode: int = 0o644, secret: bool = False) -> None:
        self.commands.append(["<put>", path, f"{mode:04o}"])
        if self.drop_at is not None and len(self.commands) >= self.drop_at:
            self.drop_at = None
            raise ConnectionLost(f"{self.address}: connection lost putting {path}")
        if posixpath.dirname(path) not in self.dirs:
            raise InfraError(f"put {path}: no such directory on {self.address}")
        self.files[path] = text
        self.modes[path] = mode

    def close(self) -> None:
        self.closed = True

    # -- interpretation ----------------------------------------------------------------------
    def _scripted(self, args: list[str], cmd: str) -> RemoteResult | None:
        for s in self.scripted:
            if s.times and s.match(args):
                s.times -= 1
                if s.result is None:
                    raise ConnectionLost(f"{self.address}: connection lost (scripted)", command=cmd)
                return RemoteResult(cmd, s.result.returncode, s.result.stdout, s.result.stderr)
        return None

    def _ok(self, cmd: str, out: str = "") -> RemoteResult:
        return RemoteResult(cmd, 0, out, "")

    def _mkdirs(self, path: str) -> None:
        while path not in ("", "/") and path not in self.dirs:
            self.dirs[path] = self.now
            path = posixpath.dirname(path)

    def _rmtree(self, path: str) -> None:
        for d in [d for d in self.dirs if d == path or d.startswith(path + "/")]:
            del self.dirs[d]
        for f in [f for f in self.files if f.startswith(path + "/")]:
            del self.files[f]

    def _mvtree(self, src: str, dst: str) -> None:
        for d in [d for d in self.dirs if d == src or d.startswith(src + "/")]:
            self.dirs[dst + d[len(src):]] = self.dirs.pop(d)
        for f in [f for f in self.files if f.startswith(src + "/")]:
            self.files[dst + f[len(src):]] = self.files.pop(f)

    def _interpret(self, args: list[str], cmd: str) -> RemoteResult:
        if args[0] == "systemctl" and len(args) == 3:
            return self._systemctl(args[1], args[2], cmd)
        if args[:5] == ["docker", "image", "inspect", "--format", "{{.Id}}"] and len(args) == 6:
            if args[5] in self.images:
                return self._ok(cmd, "sha256:" + hashlib.sha256(args[5].encode()).hexdigest() + "\n")
            return RemoteResult(cmd, 1, "", f"Error: No such image: {args[5]}")
        if args[:3] == ["docker", "pull", "--quiet"] and len(args) == 4:
            if args[3] not in self.registry:
                return RemoteResult(cmd, 1, "", f"Error response from daemon: manifest for {args[3]} not found")
            self.images.add(args[3])
            return self._ok(cmd, args[3] + "\n")
        if args[:2] == ["mkdir", "-p"] and len(args) > 2:
            for d in args[2:]:
                self._mkdirs(d)
            return self._ok(cmd)
        if args[:2] == ["sh", "-c"] and len(args) >= 4 and args[3] == "sh":
            return self._script(args[2], args[4:], cmd)
        raise UnknownCommand(f"FakeHost does not model: {cmd}")

    def _systemctl(self, verb: str, unit: str, cmd: str) -> RemoteResult:
        known = posixpath.join("/etc/systemd/system", unit) in self.files
        if verb == "is-active":
            state = self.units.get(unit, "inactive")
            return RemoteResult(cmd, 0 if state == "active" else 3, state + "\n", "")
        if verb == "reset-failed":
            if self.units.get(unit) == "failed":
                self.units[unit] = "inactive"
            return self._ok(cmd)
        if verb == "stop":
            self.units[unit] = "inactive" if self.units.get(unit) != "failed" else "failed"
            return self._ok(cmd)
        if verb == "start":
            if not known:
                return RemoteResult(cmd, 5, "", f"Failed to start {unit}: Unit {unit} not found.")
            self.units[unit] = "active"
            return self._ok(cmd)
        raise UnknownCommand(f"FakeHost does not model: {cmd}")

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
        if script == INSTALL_SCRIPT:
            staged, dst = p
            if staged not in self.files:
                return RemoteResult(cmd, 1, "", f"install: cannot stat '{staged}'")
            self.files[dst] = self.files[staged]
            self.daemon_reloads += 1
            return self._ok(cmd)
        if script == REMOVE_SCRIPT:
            unit, path = p
            self.units.pop(unit, None)
            if self.files.pop(path, None) is not None:
                self.daemon_reloads += 1
            return self._ok(cmd)
        if script == READ_IF_EXISTS_SCRIPT:
            (path,) = p
            return self._ok(cmd, self.files.get(path, ""))
        if script == LOCK_AGE_SCRIPT:
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
        if script == put_text_script():
            tmp, dst, mode = p
            if tmp not in self.files:
                return RemoteResult(cmd, 1, "", f"chmod: cannot access '{tmp}'")
            self.files[dst] = self.files.pop(tmp)
            self.modes[dst] = int(mode, 8)
            self.modes.pop(tmp, None)
            return self._ok(cmd)
        raise UnknownCommand(f"FakeHost does not model this script: {cmd}")
