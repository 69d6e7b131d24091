"""`effects.proc.run`'s stand-in for unit tests (moved from effects/proc.py: fakes live apart)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from stackbuild.effects.proc import Completed, checked


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
                return checked(Completed(args, answer.returncode, answer.stdout, answer.stderr), check, what)
        raise AssertionError(f"FakeRun: nothing scripted for {shlex.join(args)}")
