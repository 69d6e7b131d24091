"""Rollouts in the ledger: the `rollouts` and `rollout_hosts` tables (created by the ledger's
migration 3) and the recorder a rollout writes through as each wave settles.

Writes go through the ledger's own write transaction and redaction, so the
same WAL, busy timeout and secret scrubbing apply as for builds and deploys.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from stackbuild.fleet.rollout import HostRow
from stackbuild.results.ledger import Ledger, _now, _opt, redact_text


@dataclass(frozen=True)
class RolloutHostRecord:
    host: str
    wave: int
    outcome: str
    verdict: str | None
    detail: str
    flagged: str | None
    medians: dict[int, float]


@dataclass(frozen=True)
class RolloutRecord:
    id: str
    started_at: str
    finished_at: str | None
    stack: str
    image: str
    digest: str
    policy: str
    plan: list[list[str]]
    outcome: str  # running (or killed while running) | completed | stopped | refused
    cause: str | None
    hosts: list[RolloutHostRecord]


def start_rollout(led: Ledger, *, id: str, stack: str, image: str, digest: str, policy: str,
                  plan: list[list[str]]) -> None:
    """Insert a rollout, or mark a resumed one running again (same id) under `plan`."""
    with led._write() as db:
        db.execute(
            "INSERT INTO rollouts (id, started_at, stack, image, digest, policy, plan_json, outcome, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, 'running', ?)"
            " ON CONFLICT(id) DO UPDATE SET outcome = 'running', finished_at = NULL, policy = excluded.policy,"
            " plan_json = excluded.plan_json, updated_at = excluded.updated_at",
            (id, _now(), stack, redact_text(image), digest, policy, json.dumps(plan), _now()),
        )
        # resumed with another plan (an inventory edited in between): rows of hosts it no longer has go
        keep = sorted({redact_text(h) for wave in plan for h in wave})
        db.execute(f"DELETE FROM rollout_hosts WHERE rollout_id = ? AND host NOT IN ({', '.join('?' * len(keep))})",
                   (id, *keep))


def record_host(led: Ledger, rollout_id: str, *, host: str, wave: int, outcome: str, verdict: str | None,
                detail: str, flagged: str | None, medians: Mapping[int, float]) -> None:
    with led._write() as db:
        db.execute(
            "INSERT OR REPLACE INTO rollout_hosts (rollout_id, host, wave, outcome, verdict, detail,"
            " flagged, medians_json, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (rollout_id, redact_text(host), wave, outcome, verdict, redact_text(detail[:1000]),
             flagged, json.dumps({str(k): v for k, v in medians.items()}), _now()),
        )


def finish_rollout(led: Ledger, rollout_id: str, outcome: str, cause: str | None) -> None:
    with led._write() as db:
        now = _now()
        db.execute("UPDATE rollouts SET outcome = ?, cause = ?, finished_at = ?, updated_at = ? WHERE id = ?",
                   (outcome, _opt(cause), now, now, rollout_id))


def rollouts(led: Ledger) -> list[RolloutRecord]:
    """Oldest first by last activity: a resumed rollout moves to the end."""
    rows = led._db.execute(
        "SELECT id, started_at, finished_at, stack, image, digest, policy, plan_json, outcome, cause"
        " FROM rollouts ORDER BY updated_at, id").fetchall()
    out = []
    for r in rows:
        hosts = led._db.execute(
            "SELECT host, wave, outcome, verdict, detail, flagged, medians_json FROM rollout_hosts"
            " WHERE rollout_id = ? ORDER BY wave, host", (r[0],)).fetchall()
        out.append(RolloutRecord(
            id=r[0], started_at=r[1], finished_at=r[2], stack=r[3], image=r[4], digest=r[5], policy=r[6],
            plan=json.loads(r[7]), outcome=r[8], cause=r[9],
            hosts=[RolloutHostRecord(h[0], h[1], h[2], h[3], h[4] or "", h[5],
                                     {int(k): v for k, v in json.loads(h[6]).items()}) for h in hosts]))
    return out


class LedgerRecorder:
    """Writes the rollout's rows as they settle (a killed rollout leaves what it knew)."""

    def __init__(self, path: Path, rollout_id: str) -> None:
        self.path, self.id = path, rollout_id

    def host(self, row: HostRow) -> None:
        with Ledger(self.path) as db:
            record_host(db, self.id, host=row.host, wave=row.wave, outcome=row.outcome, verdict=row.verdict,
                        detail=row.detail, flagged=row.flagged, medians=row.medians)

    def finish(self, outcome: str, cause: str | None) -> None:
        with Ledger(self.path) as db:
            finish_rollout(db, self.id, outcome, cause)
