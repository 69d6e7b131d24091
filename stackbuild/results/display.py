"""What a person sees while a deploy or a fleet rollout runs: the flow emits events, a `Display`
owns the terminal and the step log.

- live (`--progress`; by default when stderr is a terminal): one line per host, redrawn by rich:
  its stage, the step running, how long the stage has taken, its verdict. Notes print above it;
  it is erased at the end, where the caller prints its summary.
- plain (a pipe, CI, tests, `--no-progress`): the notes, and one line per host each time its
  stage changes (prepare, start, gate, promote or rollback; recover); never a line per step.

Every event also goes to the step log (steplog.py) with its time: each step as it starts and
as it ends with its whole detail, each note, the full reports. The display is fed from the
hosts' threads at once, so everything it does holds one lock.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from types import TracebackType
from typing import TYPE_CHECKING

from stackbuild.results.steplog import StepLog

if TYPE_CHECKING:  # rich is imported when a view is drawn: the flow's modules import the events
    from rich.console import Console, RenderableType
    from rich.live import Live


@dataclass(frozen=True)
class Note:
    """A line for the person (and the log); about one host when `host` is set."""

    text: str
    host: str = ""


@dataclass(frozen=True)
class Log:
    """A line (or lines) for the log only: a host's full report, what a rollout's host recorded."""

    text: str
    host: str = ""


@dataclass(frozen=True)
class Step:
    """A step of a host's deploy starting (`ok` None) or ending. `phase`: a rollout's own step on
    the host (converge, preflight, pull, soak, revert), which the rollout announces for all hosts
    in one line, so plain output leaves it out."""

    host: str
    name: str
    ok: bool | None = None
    seconds: float = 0.0
    detail: str = ""
    phase: bool = False


@dataclass(frozen=True)
class Result:
    """A host's deploy decided."""

    host: str
    outcome: str
    verdict: str | None = None


Event = Note | Log | Step | Result
Sink = Callable[[Event], None]


def bind(sink: Sink, host: str) -> Sink:
    """`sink` with every event stamped as about `host` (a rollout's host name, a deploy's address)."""
    return lambda ev: sink(replace(ev, host=host))


# The deploy flow's steps (host/deploy.py, host/converge.py) by the stage a person follows; None:
# the step belongs to the stage it follows ("ready" after "start" or after "switch"). The
# side-by-side switch is part of the promotion: the candidate moves onto the serving port. A step
# not named here is a stage of its own, so a new step shows up rather than hides.
STAGES: dict[str, str | None] = {
    "lock": "prepare", "state": "prepare", "preflight": "prepare", "pull": "prepare",
    "stage unit": "prepare", "kernel check": "prepare", "baseline": "prepare", "mark pending": "prepare",
    "secrets": "prepare", "outage plan": "prepare",
    # in or out of the gateway: part of whatever it serves (bring-up while preparing, rejoin after
    # the promotion, after a recovery or a rollback)
    "gateway": None,
    "start": "start", "ready": None,
    "gate": "gate",
    "switch": "promote", "promote": "promote", "channel": "promote",
    "restore": "rollback", "verify serving": "rollback",
    # what an interrupted run left, put back first (or after a lost connection): worth its own line
    "recover": "recover", "recovered": "recover",
}


def stage_of(step: str, current: str) -> str:
    stage = STAGES.get(step, step)
    return (current or step) if stage is None else stage


def stage_times(steps: Iterable[tuple[str, float]]) -> list[tuple[str, float]]:
    """(step, seconds) in order -> (stage, seconds) in the order the stages were first entered."""
    out: dict[str, float] = {}
    current = ""
    for name, seconds in steps:
        current = stage_of(name, current)
        out[current] = out.get(current, 0.0) + seconds
    return list(out.items())


def clock_text(seconds: float) -> str:
    s = max(0, int(seconds))
    return f"{s}s" if s < 60 else f"{s // 60}m{s % 60:02d}s"


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass
class Row:
    host: str
    stage: str = "waiting"
    step: str = ""
    since: float = 0.0  # when the stage began, on the display's clock
    took: float | None = None  # the stage's time once the host has nothing running
    verdict: str = ""


class Display:
    """The one owner of the terminal for a run. Call it with events (it is a `Sink`); use it as a
    context manager around the part of the run that emits them (the live view runs inside)."""

    def __init__(self, *, echo: Callable[[str], None], live: bool = False, log: StepLog | None = None,
                 title: str = "", progress: Callable[[str], None] = _stderr, console: Console | None = None,
                 clock: Callable[[], float] = time.monotonic, stdout_is_terminal: bool | None = None) -> None:
        self.echo = echo  # notes (stdout)
        self.progress = progress  # plain stage lines (stderr)
        self.log = log
        self.title = title
        self.clock = clock
        self.rows: dict[str, Row] = {}
        self._lock = threading.RLock()  # the rows and the log
        self._out = threading.Lock()  # one event's lines printed together
        self._console = console
        self._live: Live | None = None
        self._want_live = live
        # a note printed on the terminal while the live view is drawn must go through rich, above
        # the view: click.echo writes to the stream it wrapped first, past rich's redirection
        self._notes_above = sys.stdout.isatty() if stdout_is_terminal is None else stdout_is_terminal

    # --- lifecycle ------------------------------------------------------------
    def __enter__(self) -> Display:
        if self._want_live:
            from rich.console import Console
            from rich.live import Live

            console = self._console or Console(stderr=True)
            # stdout goes above the live view only when it is the same terminal; a piped stdout
            # is left alone (rich would send its lines to the terminal instead)
            self._live = Live(get_renderable=self.view, console=console, refresh_per_second=4, transient=True,
                              redirect_stdout=self._notes_above)
            self._live.start(refresh=True)
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        """The live view stops; the display prints plain from here (the log stays its opener's)."""
        live, self._live = self._live, None
        if live is not None:
            live.stop()

    # --- events ---------------------------------------------------------------
    def hosts(self, names: Iterable[str]) -> None:
        """Rows for these hosts up front, in this order (a rollout's plan), each waiting."""
        with self._lock:
            for h in names:
                self.rows.setdefault(h, Row(h, since=self.clock()))

    def note(self, text: str) -> None:
        self(Note(text))

    def __call__(self, ev: Event) -> None:
        # The rows and the log under one lock, the printing after it under another: printing above
        # the live view redraws it, and the redraw (rich's thread too) reads the rows.
        with self._lock:
            said, plain = self._take(ev)
        with self._out:
            live = self._live
            for line in said:
                if live is not None and self._notes_above:
                    live.console.print(line, markup=False, highlight=False, soft_wrap=True)
                else:
                    self.echo(line)
            for line in plain:
                self.progress(line)

    def _take(self, ev: Event) -> tuple[list[str], list[str]]:
        """Update the rows and the log; (the notes' lines, the plain stage lines) to print."""
        if isinstance(ev, Note):
            self._write(ev.text, ev.host)
            return [f"[{ev.host}] {ln}" if ev.host else ln for ln in ev.text.splitlines() or [""]], []
        if isinstance(ev, Log):
            self._write(ev.text, ev.host)
        elif isinstance(ev, Step):
            return [], self._step(ev)
        else:
            row = self._row(ev.host)
            row.verdict = ev.outcome + (f" ({ev.verdict})" if ev.verdict else "")
            row.took = self.clock() - row.since
            self._write(f"result: {row.verdict}", ev.host)
        return [], []

    def _write(self, text: str, host: str) -> None:
        if self.log is not None:
            self.log.write(text, host)

    def _row(self, host: str) -> Row:
        if host not in self.rows:
            self.rows[host] = Row(host, since=self.clock())
        return self.rows[host]

    def _step(self, ev: Step) -> list[str]:
        row = self._row(ev.host)
        plain = []
        if ev.ok is None:
            self._write(f"{ev.name} ...", ev.host)
            stage = ev.name if ev.phase else stage_of(ev.name, row.stage if row.stage != "waiting" else "")
            if stage != row.stage or row.took is not None:
                row.since = self.clock()
                if not ev.phase and stage != row.stage and self._live is None:
                    plain.append(f"[{ev.host}] {stage}")
            row.stage, row.step, row.took = stage, ev.name, None
            return plain
        self._write(f"{ev.name} {'ok' if ev.ok else 'FAILED'} {ev.seconds:.2f}s {ev.detail}".rstrip(), ev.host)
        row.step = f"{ev.name} {'ok' if ev.ok else 'FAILED'}"
        if ev.phase:
            row.took = self.clock() - row.since
        return plain

    # --- the live view ----------------------------------------------------------
    def view(self) -> RenderableType:
        """The live view: the title, then one line per host."""
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        with self._lock:
            t = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
            for col in ("host", "stage", "step", "elapsed", "verdict"):
                t.add_column(col, no_wrap=True, overflow="ellipsis")
            now = self.clock()
            for r in self.rows.values():
                took = r.took if r.took is not None else now - r.since
                t.add_row(r.host, r.stage, r.step, "" if r.stage == "waiting" else clock_text(took), r.verdict)
            return Group(Text(self.title, style="bold"), t) if self.title else t
