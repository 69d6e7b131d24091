"""One live rollout per stack and ledger: a second one is refused, naming the first (issue #29).

A rollout that was killed is resumed by the next run of the same command (session.py); one that
is still running is not "interrupted", and two rollouts driving the same hosts would break each
other's steps. The running one holds an advisory lock (flock) on a file beside the ledger for as
long as it lives: the kernel drops it when the process dies, however it dies, so a killed rollout
never blocks the next run. The file says which rollout holds it, for the refusal's message.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from stackbuild.errors import InfraError


class RolloutLive(InfraError):
    """Another rollout of the same stack is running (exit 4)."""


def live_marker_path(ledger: Path, stack_label: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", stack_label)
    return ledger.with_name(f"{ledger.name}.rollout-{safe}.lock")


def _holder(fh: IO[str]) -> str:
    fh.seek(0)
    try:
        d = json.loads(fh.read() or "{}")
        return (f"rollout {d.get('rollout') or '(starting)'} by pid {d.get('pid')} on {d.get('host')}, "
                f"started {time.time() - float(d.get('started', time.time())):.0f}s ago")
    except (ValueError, TypeError):
        return "a rollout that wrote no name yet"


class Held:
    """The lock while this rollout holds it: `name(rollout_id)` once its id is known."""

    def __init__(self, fh: IO[str]) -> None:
        self.fh = fh
        self.started = time.time()

    def name(self, rollout_id: str) -> None:
        self.fh.seek(0)
        self.fh.truncate()
        self.fh.write(json.dumps({"rollout": rollout_id, "pid": os.getpid(), "host": socket.gethostname(),
                                  "started": self.started}))
        self.fh.flush()


@contextmanager
def only_rollout(ledger: Path, stack_label: str) -> Iterator[Held]:
    """Held for the rollout's whole run; a second one of `stack_label` while it lives: RolloutLive."""
    path = live_marker_path(ledger, stack_label)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = path.open("a+", encoding="utf-8")
    except OSError as err:
        raise InfraError(f"cannot open the rollout lock {path}: {err.strerror}; check the ledger's directory") from None
    with fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RolloutLive(
                f"another rollout of {stack_label} is live ({_holder(fh)}); wait for it to end, or stop it "
                "(a killed rollout is resumed by re-running its command)"
            ) from None
        held = Held(fh)
        held.name("")
        try:
            yield held
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
