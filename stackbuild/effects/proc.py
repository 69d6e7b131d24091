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
    done = Completed(args, cp.returncode, cp.stdout, cp.stderr)
    if check and cp.returncode != 0:
        raise InfraError(
            f"{what or args[0]} failed",
            command=done.command,
            returncode=cp.returncode,
            output=(cp.stdout + cp.stderr),
        )
    return done
