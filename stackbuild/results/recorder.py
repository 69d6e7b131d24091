"""The one recorder: every build, gate run, deploy and fleet rollout reaches the ledger through
here, and the report (writer.py) is refreshed after each.

Error policy, one for every command:

- Before the operation, `check()` opens (creates, migrates) the ledger. A ledger that cannot be
  opened is an InputError (exit 2) while nothing is built, measured or touched yet; a rollout's
  row is written then too (`start_rollout`), so a re-run always finds the id to resume.
- Once the operation has an outcome, a ledger or report that cannot be written is one warning
  line, after the outcome, and never changes the exit code.

Why not the opposite: the exit code says what happened to the image, the candidate or the host,
and automation acts on it. A candidate that was promoted stays promoted whether or not its row
landed; an exit code that said otherwise would make a pipeline retry or roll back a host that is
fine (the fleet used to ask each host what it ran after such an error, because the code could not
be trusted). Nothing decides from the ledger alone: a deploy's baseline is the incumbent's result
stored on the host (host/decide.py), a resumed rollout reads each host's own state. The ledger is
the history the report is written from, and `stackbuild report` rewrites the report at any time.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, Unpack

from stackbuild.errors import StackbuildError
from stackbuild.gate.result import GateResult
from stackbuild.image.build import BuildResult
from stackbuild.results.ledger import DeployFields, Ledger
from stackbuild.results.writer import update_report
from stackbuild.spec.stack import Stack

# What a write after the outcome may fail with: the file gone, locked past the busy timeout, the disk full.
_WRITE_ERRORS = (StackbuildError, OSError, sqlite3.Error)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _why(err: BaseException) -> str:
    return (str(err) or type(err).__name__).splitlines()[0][:200]


class HostRow(Protocol):
    """One host's line of a rollout, as the fleet keeps it (fleet/rollout.HostRow)."""

    @property
    def host(self) -> str: ...
    @property
    def wave(self) -> int: ...
    @property
    def outcome(self) -> str: ...
    @property
    def verdict(self) -> str | None: ...
    @property
    def detail(self) -> str: ...
    @property
    def flagged(self) -> str | None: ...
    @property
    def medians(self) -> Mapping[int, float]: ...


@dataclass
class Recorder:
    path: Path
    note: Callable[[str], None] = field(default=_stderr)  # where "recorded" lines and warnings go
    warn: Callable[[str], None] | None = None  # where warnings go instead (a rollout logs the rest)
    # Refresh the report after each record. A rollout's hosts do not: their threads would draw the
    # plot at once (pyplot is not thread-safe) and a host's row is not the end; the rollout refreshes
    # it once when it ends.
    report: bool = True

    def check(self) -> None:
        """Open the ledger now (InputError if it cannot be): before the operation, not after it."""
        with Ledger(self.path):
            pass

    def build(self, stack: Stack, built: BuildResult) -> None:
        """An image built (or first seen by this ledger), with its lock; the same digest again is not a new row."""
        def write(db: Ledger) -> bool:
            if db.has_build(built.image, built.digest):
                return False
            db.record_build(stack=stack.name, variant=stack.variant, image=built.image, digest=built.digest,
                            content_hash=built.hash, lock=built.lock)
            return True

        self._record(f"the build of {built.image}", write)

    def gate(self, result: GateResult) -> None:
        self._record(result.name, lambda db: db.record_gate(result))

    def deploy(self, gate: GateResult | None, **row: Unpack[DeployFields]) -> None:
        """A deploy's row, with the gate run it was decided by (None: it never reached the gate)."""
        def write(db: Ledger) -> None:
            if gate is not None:
                db.record_gate(gate)
            db.record_deploy(**row)

        self._record(f"the deploy of {row['image']} to {row['host']} ({row['outcome']})", write)

    def start_rollout(self, *, id: str, stack: str, image: str, digest: str, policy: str,
                      plan: list[list[str]]) -> RolloutLog:
        """Before any host is touched: a ledger that cannot take the row stops the rollout here."""
        with Ledger(self.path) as db:
            db.start_rollout(id=id, stack=stack, image=image, digest=digest, policy=policy, plan=plan)
        return RolloutLog(self, id)

    def refresh(self) -> Path | None:
        """Rewrite the report next to the ledger; its path, or None (warned) when it could not be written."""
        try:
            out = update_report(self.path)
        except _WRITE_ERRORS as err:
            (self.warn or self.note)(
                f"stackbuild: report: not updated ({_why(err)}); `stackbuild report` writes it again")
            return None
        self.note(f"report: {out}")
        return out

    def _record(self, what: str, write: Callable[[Ledger], object], *, quiet: bool = False) -> None:
        try:
            with Ledger(self.path) as db:
                wrote = write(db)
        except _WRITE_ERRORS as err:
            (self.warn or self.note)(
                f"stackbuild: ledger: {what} NOT recorded in {self.path} ({_why(err)}); the outcome stands")
            return
        if wrote is False or quiet:
            return
        self.note(f"ledger: recorded {what} in {self.path}")
        if self.report:
            self.refresh()


@dataclass
class RolloutLog:
    """A started rollout's rows, written as each host settles (a killed rollout leaves what it knew);
    its end refreshes the report with the deploys of every host."""

    recorder: Recorder
    id: str

    def host(self, row: HostRow) -> None:
        self.recorder._record(
            f"rollout {self.id}'s row of {row.host}",
            lambda db: db.record_rollout_host(self.id, host=row.host, wave=row.wave, outcome=row.outcome,
                                              verdict=row.verdict, detail=row.detail, flagged=row.flagged,
                                              medians=row.medians),
            quiet=True)

    def finish(self, outcome: str, cause: str | None) -> None:
        self.recorder._record(f"rollout {self.id} ({outcome})", lambda db: db.finish_rollout(self.id, outcome, cause))
