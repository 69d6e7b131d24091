"""The one module that runs local subprocesses.

Callers build argv with small pure functions and get a `Completed` back; a
failure raises `InfraError` carrying the command, exit code and output tail.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

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
    return _checked(Completed(args, cp.returncode, cp.stdout, cp.stderr), check, what)


def _checked(done: Completed, check: bool, what: str | None) -> Completed:
    if check and done.returncode != 0:
        raise InfraError(
            f"{what or done.argv[0]} failed",
            command=done.command,
            returncode=done.returncode,
            output=(done.stdout + done.stderr),
        )
    return done


class FakeRun:
    """`run`'s stand-in for unit tests: answers scripted by argv prefix (the latest match wins), every
    call recorded; an argv nothing answers is a test error, so a test states every command it expects."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []
        self._answers: list[tuple[tuple[str, ...], Completed]] = []

    def on(self, prefix: Sequence[str], returncode: int = 0, stdout: str = "", stderr: str = "") -> FakeRun:
        key = tuple(str(a) for a in prefix)
        self._answers.append((key, Completed(key, returncode, stdout, stderr)))
        return self

    def __call__(
        self,
        argv: Sequence[str],
        *,
        cwd: Path | str | None = None,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
        timeout: float | None = 600,
        check: bool = True,
        what: str | None = None,
    ) -> Completed:
        args = tuple(str(a) for a in argv)
        self.calls.append(args)
        for prefix, answer in reversed(self._answers):
            if args[: len(prefix)] == prefix:
                return _checked(Completed(args, answer.returncode, answer.stdout, answer.stderr), check, what)
        raise AssertionError(f"FakeRun: nothing scripted for {shlex.join(args)}")
