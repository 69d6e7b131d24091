"""The plumbing of the scripted in-memory host (see fake.py): a `Remote` over files, dirs and a clock.

Each layer of the fake (this one, fake_systemd.py, fake.py) interprets the commands
its part of the flow sends and hands anything else to the layer below; the bottom
layer raises `UnknownCommand`, so a command nobody models fails the test instead of
passing silently.
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from stackbuild.effects.readiness import Pace
from stackbuild.errors import InfraError
from stackbuild.host.ssh import (
    READ_FILE_SCRIPT,
    READ_IF_EXISTS_SCRIPT,
    ConnectionLost,
    RemoteResult,
    put_text_script,
    quote_argv,
)


class UnknownCommand(AssertionError):
    """The fake was sent a command it does not model: extend the fake, do not skip it."""


# Above Linux's largest pid_max (2**22): no process has it, so a lock naming it is a dead owner's.
DEAD_PID = 2**22 + 1


class Killed(BaseException):
    """The stackbuild process driving the fake host was SIGKILLed: nothing after this runs, no
    `finally` or `except Exception` of the flow gets a word in (it is not an Exception)."""


@dataclass
class Client:
    """The stackbuild process sending a fake host (or a fleet's fake hosts, sharing one) its commands.

    `die_before(address, argv)` true: the process dies before sending that command; `die_after`:
    the host ran it, the process died waiting for the answer. A dead client sends nothing more;
    the next run is a new Client.
    """

    dead: bool = False
    die_before: Callable[[str, list[str]], bool] | None = None
    die_after: Callable[[str, list[str]], bool] | None = None

    def kill(self, where: str) -> Killed:
        self.dead = True
        return Killed(where)


@dataclass
class Scripted:
    match: Callable[[list[str]], bool]
    result: RemoteResult | None  # None: the connection drops on this command
    times: int = 1


@dataclass
class FakeRemote:
    """In-memory files (path -> text, with modes), dirs with mtimes, and the host's clock.

    `now` is the host's clock (`date +%s`, file times) and, through `pace()`, the poller's:
    sleeping advances it, so deadlines pass without real waiting.
    """

    address: str = "fake@127.0.0.1"
    dry_run: bool = False
    files: dict[str, str] = field(default_factory=dict)
    modes: dict[str, int] = field(default_factory=dict)
    dirs: dict[str, float] = field(default_factory=dict)  # path -> mtime (epoch s)
    now: float = 1_700_000_000.0
    commands: list[list[str]] = field(default_factory=list)
    scripted: list[Scripted] = field(default_factory=list)
    drop_at: int | None = None  # 1-based index of the command on which the connection dies
    closed: bool = False
    connections: int = 1
    client: Client = field(default_factory=Client)

    # -- time --------------------------------------------------------------------------------
    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def pace(self, interval_s: float = 0.5) -> Pace:
        """The readiness poller's pace on this host's clock."""
        return Pace(interval_s=interval_s, clock=self.clock, sleep=self.sleep)

    # -- scripting ---------------------------------------------------------------------------
    def fail_when(self, match: Callable[[list[str]], bool], *, rc: int = 1, stdout: str = "",
                  stderr: str = "failed (scripted)", times: int = 1) -> None:
        self.scripted.append(Scripted(match, RemoteResult("", rc, stdout, stderr), times))

    def drop_on(self, n: int) -> None:
        """The connection is lost while running the n-th command from now (1-based)."""
        self.drop_at = len(self.commands) + n

    def drop_when(self, match: Callable[[list[str]], bool]) -> None:
        """The connection is lost on the first command `match` accepts."""
        self.scripted.append(Scripted(match, None))

    def reconnect(self) -> FakeRemote:
        """A fresh connection to the same host (same files, units, clock)."""
        self.closed = False
        self.connections += 1
        self.commands.append(["<connect>"])
        return self

    # -- Remote ------------------------------------------------------------------------------
    def run(self, argv: Sequence[str], *, check: bool = True, timeout: float | None = None,
            what: str = "", changes: bool = True) -> RemoteResult:
        args = [str(a) for a in argv]
        cmd = quote_argv(args)
        self._die_if_due(args, self.client.die_before)
        self.commands.append(args)
        self._lose_connection_if_due(what or cmd, cmd)
        self._tick()
        res = self._scripted(args, cmd) or self._interpret(args, cmd)
        self._die_if_due(args, self.client.die_after)
        if check and not res.ok:
            raise InfraError(f"{what or 'command'} failed on {self.address}", command=cmd,
                             returncode=res.returncode, output=res.stdout + res.stderr)
        return res

    def put_text(self, text: str, path: str, *, mode: int = 0o644, secret: bool = False) -> None:
        args = ["<put>", path, f"{mode:04o}"]
        self._die_if_due(args, self.client.die_before)
        self.commands.append(args)
        self._lose_connection_if_due(f"putting {path}", "")
        if posixpath.dirname(path) not in self.dirs:
            raise InfraError(f"put {path}: no such directory on {self.address}")
        self.files[path] = text
        self.modes[path] = mode
        self._die_if_due(args, self.client.die_after)

    def _die_if_due(self, args: list[str], when: Callable[[str, list[str]], bool] | None) -> None:
        if self.client.dead:
            self._orphan_locks()
            raise Killed(f"{self.address}: the client is dead")
        if when is not None and when(self.address, args):
            self._orphan_locks()
            raise self.client.kill(f"{self.address}: killed at {args}")

    def _orphan_locks(self) -> None:
        """The killed client's process is gone: the host leases it held name a pid no process has.
        (The tests' client is this very process, whose pid stays alive; a lock is its run's, not its
        pid's, so without this a re-run would wait for a "live" killer.)"""
        for path, text in list(self.files.items()):
            if path.endswith("/lock/owner.json") and text:
                try:
                    d = json.loads(text)
                except ValueError:
                    continue
                if isinstance(d, dict) and d.get("pid") == os.getpid():
                    self.files[path] = json.dumps({**d, "pid": DEAD_PID}, sort_keys=True)

    def close(self) -> None:
        self.closed = True

    def _lose_connection_if_due(self, what: str, cmd: str) -> None:
        if self.closed:
            raise ConnectionLost(f"{self.address}: connection closed", command=cmd)
        if self.drop_at is not None and len(self.commands) >= self.drop_at:
            self.drop_at = None
            self.closed = True  # a lost connection stays lost: reconnect() for a new one
            raise ConnectionLost(f"{self.address}: connection lost during {what}", command=cmd)

    def _scripted(self, args: list[str], cmd: str) -> RemoteResult | None:
        for s in self.scripted:
            if s.times and s.match(args):
                s.times -= 1
                if s.result is None:
                    self.closed = True
                    raise ConnectionLost(f"{self.address}: connection lost (scripted)", command=cmd)
                return RemoteResult(cmd, s.result.returncode, s.result.stdout, s.result.stderr)
        return None

    def _tick(self) -> None:
        """Let what happens on the host with time alone happen (layers above: servers crash, listen)."""

    # -- files -------------------------------------------------------------------------------
    def _ok(self, cmd: str, out: str = "") -> RemoteResult:
        return RemoteResult(cmd, 0, out, "")

    def _mkdirs(self, path: str, mode: int | None = None) -> None:
        if mode is not None and path not in self.dirs:
            self.modes[path] = mode  # mkdir -p -m: the mode applies to the last dir only
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

    def _move(self, src: str, dst: str) -> None:
        """mv -f of one file: the mode travels with it."""
        self.files[dst] = self.files.pop(src)
        self.modes[dst] = self.modes.pop(src, 0o644)

    def _rm(self, *paths: str) -> None:
        for p in paths:
            self.files.pop(p, None)
            self.modes.pop(p, None)

    def _interpret(self, args: list[str], cmd: str) -> RemoteResult:
        if args[:2] == ["mkdir", "-p"] and len(args) > 2:
            rest, mode = args[2:], None
            if rest[0] == "-m" and len(rest) > 2:
                mode, rest = int(rest[1], 8), rest[2:]
            for d in rest:
                self._mkdirs(d, mode)
            return self._ok(cmd)
        if args[0] == "cat" and len(args) == 2:  # the incumbent's stored gate result (decide.py)
            if args[1] not in self.files:
                return RemoteResult(cmd, 1, "", f"cat: {args[1]}: No such file or directory")
            return self._ok(cmd, self.files[args[1]])
        if args[:2] == ["sh", "-c"] and len(args) >= 4 and args[3] == "sh":
            return self._script(args[2], args[4:], cmd)
        raise UnknownCommand(f"FakeHost does not model: {cmd}")

    def _script(self, script: str, p: list[str], cmd: str) -> RemoteResult:
        if script == put_text_script():
            tmp, dst, mode = p
            if tmp not in self.files:
                return RemoteResult(cmd, 1, "", f"chmod: cannot access '{tmp}'")
            self._move(tmp, dst)
            self.modes[dst] = int(mode, 8)
            return self._ok(cmd)
        if script == READ_IF_EXISTS_SCRIPT:
            (path,) = p
            return self._ok(cmd, self.files.get(path, ""))
        if script == READ_FILE_SCRIPT:
            (path,) = p
            return self._ok(cmd, self.files[path]) if path in self.files else RemoteResult(cmd, 1, "", "")
        raise UnknownCommand(f"FakeHost does not model this script: {cmd}")

