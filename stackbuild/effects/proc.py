"""The one module that runs local subprocesses.

Callers build argv with small pure functions and get a `Completed` back; a
failure raises `InfraError` carrying the command, exit code and output tail.
"""

from __future__ import annotations

import shlex
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from stackbuild.errors import InfraError


@dataclass(frozen=True)
class Completed:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def command(self) -> str:
        return shlex.join(self.argv)


def run(
    argv: Sequence[str],
    *,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    timeout: float | None = 600,
    check: bool = True,
    what: str | None = None,
) -> Completed:
    """Run argv (never through a shell); raise InfraError on failure when `check`."""
    args = tuple(str(a) for a in argv)
    try:
        cp = subprocess.run(
            args,
            cwd=cwd,
            env=dict(env) if env is not None else None,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
    except FileNotFoundError as err:
        raise InfraError(
            f"{what or args[0]}: '{args[0]}' is not installed or not on PATH; install it and retry",
            command=shlex.join(args),
        ) from err
    except subprocess.TimeoutExpired as err:
        out = (err.stdout or b"") if isinstance(err.stdout, bytes) else (err.stdout or "")
        raise InfraError(
            f"{what or args[0]}: timed out after {timeout:.0f}s",
            command=shlex.join(args),
            output=out.decode(errors="replace") if isinstance(out, bytes) else out,
        ) from err
    return checked(Completed(args, cp.returncode, cp.stdout, cp.stderr), check, what)


def checked(done: Completed, check: bool, what: str | None) -> Completed:
    if check and done.returncode != 0:
        raise InfraError(
            f"{what or done.argv[0]} failed",
            command=done.command,
            returncode=done.returncode,
            output=(done.stdout + done.stderr),
        )
    return done


def quiet(argv: Sequence[str], *, timeout: float = 20) -> str | None:
    """stdout of argv when it exits 0, else None (not installed, failed, timed out): for probes."""
    try:
        cp = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return cp.stdout if cp.returncode == 0 else None


@dataclass(frozen=True)
class Streamed:
    returncode: int
    tail: tuple[str, ...]  # the last output lines, newlines kept


def stream(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    log: IO[str],
    timeout: float,
    on_line: Callable[[str], None] | None = None,
    what: str,
    tail_lines: int = 40,
) -> Streamed:
    """Run argv with stdout+stderr merged, each line to `log` (and `on_line`) as it comes.

    A timeout or an interruption kills the child before the error leaves; a non-zero exit
    is the caller's to judge (the tail says why).
    """
    args = [str(a) for a in argv]
    try:
        child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=dict(env), text=True, errors="replace", bufsize=1)
    except OSError as err:
        raise InfraError(f"cannot run {args[0]}: {err}", command=shlex.join(args)) from err
    assert child.stdout is not None
    tail: list[str] = []
    # The deadline holds while output still flows too: a watchdog kills the child, which ends the read.
    fired = threading.Event()

    def expire() -> None:
        fired.set()
        child.kill()

    watchdog = threading.Timer(timeout, expire)
    watchdog.start()
    try:
        for line in child.stdout:
            log.write(line)
            tail.append(line)
            del tail[:-tail_lines]
            if on_line:
                on_line(line.rstrip("\n"))
        rc = child.wait()
    except BaseException:
        child.kill()
        child.wait()
        raise
    finally:
        watchdog.cancel()
    if fired.is_set():
        raise InfraError(f"{what} timed out after {timeout:.0f}s", command=shlex.join(args), output="".join(tail))
    return Streamed(rc, tuple(tail))


class Child:
    """A long-running child process with its output in a file; `stop` always reaps it."""

    def __init__(self, argv: Sequence[str], *, log: IO[bytes]) -> None:
        self.argv = tuple(str(a) for a in argv)
        self._p = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def poll(self) -> int | None:
        """The exit code once it has exited, else None."""
        return self._p.poll()

    def wait(self, timeout: float) -> int:
        """The exit code, waiting up to `timeout` s for it (subprocess.TimeoutExpired past that)."""
        return int(self._p.wait(timeout))

    def stop(self, *, grace_s: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after `grace_s`; the exit code."""
        if self._p.poll() is None:
            self._p.send_signal(signal.SIGTERM)
            try:
                self._p.wait(grace_s)
            except subprocess.TimeoutExpired:
                self._p.kill()
        return int(self._p.wait(5))
