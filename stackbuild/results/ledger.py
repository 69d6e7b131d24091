"""The ledger: every build, deploy, gate run and fleet rollout, in one embedded SQLite file.

Writers are separate processes (a deploy and a gate may finish at the same
moment) and threads (a fleet's hosts), so the file runs in WAL mode with a busy
timeout and every write takes the write lock up front with BEGIN IMMEDIATE. The
schema is versioned: a `schema_version` table holds the number and
`schema.MIGRATIONS` is the ordered list that brings any older file up to date.
Everything stored passes through `redact` first, so tokens and passwords that
leak into a cause, a lock or a URL never reach the file. Commands write through
`recorder.Recorder`, which owns what happens when a write fails.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Required, TypedDict, Unpack, get_args

from stackbuild.errors import InputError
from stackbuild.gate.plan import noise_from, plan_text
from stackbuild.gate.result import GateResult
from stackbuild.results.redact import redact, redact_text
from stackbuild.results.schema import MIGRATIONS, SCHEMA_VERSION
from stackbuild.spec.profile import GateProfile

DeployOutcome = Literal["promoted", "rolled-back", "refused", "failed"]

BUSY_TIMEOUT_S = 30.0


def _json(value: Any) -> str:
    return json.dumps(redact(value), sort_keys=True)


def _opt(text: str | None) -> str | None:
    return None if text is None else redact_text(text)


# --- records read back ----------------------------------------------------------


@dataclass(frozen=True)
class BuildRecord:
    id: int
    recorded_at: str
    stack: str
    variant: str | None
    image: str
    digest: str | None
    content_hash: str
    lock: dict[str, Any]


@dataclass(frozen=True)
class DeployRecord:
    id: int
    recorded_at: str
    host: str
    stack: str
    variant: str | None
    config: str
    image: str
    digest: str | None
    strategy: str
    outcome: DeployOutcome
    crash_signature: str | None
    durations: dict[str, float]
    downtime_s: float | None
    cause: str | None
    fingerprint: str | None = None
    host_class: str | None = None


@dataclass(frozen=True)
class GateRecord:
    id: int
    recorded_at: str
    host_class: str
    result: GateResult = field(repr=False)


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


class DeployFields(TypedDict, total=False):
    """One deploy's row. `config` names it in the results table (default: variant, else stack);
    `fingerprint`/`host_class` file a deploy that never reached the gate under the workload it was
    meant for."""

    host: Required[str]
    stack: Required[str]
    image: Required[str]
    strategy: Required[str]
    outcome: Required[DeployOutcome]
    variant: str | None
    digest: str | None
    crash_signature: str | None
    durations: Mapping[str, float] | None
    downtime_s: float | None
    cause: str | None
    config: str | None
    fingerprint: str | None
    host_class: str | None


def host_class_of(host: Mapping[str, str]) -> str:
    """The hardware a number was measured on: GPU count x model, or the engine for the sim."""
    gpu = host.get("gpu_model") or host.get("gpu") or host.get("gpu_name")
    count = host.get("gpu_count") or host.get("gpus")
    if gpu:
        return f"{count}x {gpu}" if count else gpu
    if "sim.speed" in host:  # the simulator: comparable only at the same --speed
        return f"simulator at --speed {host['sim.speed']}"
    engine = host.get("engine") or host.get("backend")
    return engine if engine else "unknown host"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


class Ledger:
    """One open ledger file. Cheap to open; open one per command, close when done."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except (OSError, sqlite3.Error) as err:
            raise InputError(
                f"{self.path}: cannot open the ledger ({err}); pass --ledger with a writable path"
            ) from err
        try:
            self._db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA foreign_keys = ON")
            self._migrate()
        except sqlite3.DatabaseError as err:
            self._db.close()
            raise InputError(
                f"{self.path}: not a stackbuild ledger ({err}); pass --ledger with another path"
            ) from err

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        # IMMEDIATE takes the write lock now, so two writers queue on the busy
        # timeout instead of one failing halfway with "database is locked".
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    @property
    def schema_version(self) -> int:
        row = self._db.execute("SELECT version FROM schema_version").fetchone()
        return int(row[0]) if row else 0

    def _current(self) -> bool:
        """Is the schema at this stackbuild's version already? (A read: opening a current ledger,
        the common case, takes no write lock.)"""
        try:
            return self.schema_version == SCHEMA_VERSION
        except sqlite3.OperationalError:  # no schema_version table yet: a new file
            return False

    def _migrate(self, target: int = SCHEMA_VERSION) -> None:
        if target == SCHEMA_VERSION and self._current():
            return
        with self._write() as db:
            db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            # Read inside the lock: another process may have migrated meanwhile.
            current = self.schema_version
            if current > SCHEMA_VERSION:
                raise InputError(
                    f"{self.path}: ledger schema version {current} is newer than this stackbuild "
                    f"understands ({SCHEMA_VERSION}); upgrade stackbuild or pass --ledger"
                )
            for statements in MIGRATIONS[current:target]:
                for statement in statements:
                    db.execute(statement)
            if current == 0:
                db.execute("INSERT INTO schema_version (version) VALUES (?)", (target,))
            elif target > current:
                db.execute("UPDATE schema_version SET version = ?", (target,))

    # --- writes ---------------------------------------------------------------

    def record_build(
        self,
        *,
        stack: str,
        image: str,
        content_hash: str,
        lock: Mapping[str, Any],
        variant: str | None = None,
        digest: str | None = None,
    ) -> int:
        with self._write() as db:
            cur = db.execute(
                "INSERT INTO builds (recorded_at, stack, variant, image, digest, content_hash,"
                " lock_json) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (_now(), stack, variant, redact_text(image), _opt(digest), content_hash,
                 _json(lock)),
            )
            return int(cur.lastrowid or 0)

    def has_build(self, image: str, digest: str | None) -> bool:
        """Is this image (at this digest) recorded already? A rebuild that changed nothing is not a new row."""
        row = self._db.execute("SELECT 1 FROM builds WHERE image = ? AND digest IS ? LIMIT 1",
                               (redact_text(image), _opt(digest))).fetchone()
        return row is not None

    def record_deploy(self, **row: Unpack[DeployFields]) -> int:
        outcome = row["outcome"]
        if outcome not in get_args(DeployOutcome):
            raise InputError(
                f"deploy outcome {outcome!r}: use one of {', '.join(get_args(DeployOutcome))}"
            )
        variant, stack = row.get("variant"), row["stack"]
        with self._write() as db:
            cur = db.execute(
                "INSERT INTO deploys (recorded_at, host, stack, variant, config, image, digest,"
                " strategy, outcome, crash_signature, durations_json, downtime_s, cause,"
                " fingerprint, host_class) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (_now(), redact_text(row["host"]), stack, variant, row.get("config") or variant or stack,
                 redact_text(row["image"]), _opt(row.get("digest")), row["strategy"], outcome,
                 _opt(row.get("crash_signature")), _json(dict(row.get("durations") or {})),
                 row.get("downtime_s"), _opt(row.get("cause")), row.get("fingerprint"), row.get("host_class")),
            )
            return int(cur.lastrowid or 0)

    def record_gate(self, result: GateResult, *, host_class: str | None = None) -> int:
        clean = GateResult.model_validate(redact(result.model_dump(mode="json")))
        hclass = host_class or host_class_of(clean.host)
        with self._write() as db:
            cur = db.execute(
                "INSERT INTO gate_runs (recorded_at, name, fingerprint, host_class, started_at,"
                " finished_at, verdict, baseline_name, host_json, workload_json, result_json)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (_now(), clean.name, clean.fingerprint, hclass, clean.started_at,
                 clean.finished_at, clean.verdict, clean.baseline_name,
                 json.dumps(clean.host, sort_keys=True), clean.workload.model_dump_json(),
                 clean.model_dump_json()),
            )
            run_id = int(cur.lastrowid or 0)
            db.executemany(
                "INSERT INTO gate_levels (gate_run_id, concurrency, runs, median_output_tok_s,"
                " median_total_tok_s, ttft_p99_ms, failed_requests, ratio, ci_low, ci_high,"
                " verdict) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(run_id, lv.concurrency, len(lv.runs), lv.median_output_tok_s,
                  lv.median_total_tok_s, lv.ttft_p99_ms, lv.failed_requests, lv.ratio,
                  lv.ci_low, lv.ci_high, lv.verdict) for lv in clean.levels],
            )
            return run_id

    # Fleet rollouts: one row per rollout, one per host in it, written as each wave settles.

    def start_rollout(self, *, id: str, stack: str, image: str, digest: str, policy: str,
                      plan: list[list[str]]) -> None:
        """Insert a rollout, or mark a resumed one running again (same id) under `plan`."""
        with self._write() as db:
            now = _now()
            db.execute(
                "INSERT INTO rollouts (id, started_at, stack, image, digest, policy, plan_json, outcome,"
                " updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, 'running', ?)"
                " ON CONFLICT(id) DO UPDATE SET outcome = 'running', finished_at = NULL,"
                " policy = excluded.policy, plan_json = excluded.plan_json, updated_at = excluded.updated_at",
                (id, now, stack, redact_text(image), digest, policy, json.dumps(plan), now),
            )
            # resumed with another plan (an inventory edited in between): rows of hosts it no longer has go
            keep = sorted({redact_text(h) for wave in plan for h in wave})
            db.execute(f"DELETE FROM rollout_hosts WHERE rollout_id = ? AND host NOT IN ({', '.join('?' * len(keep))})",
                       (id, *keep))

    def record_rollout_host(self, rollout_id: str, *, host: str, wave: int, outcome: str, verdict: str | None,
                            detail: str, flagged: str | None, medians: Mapping[int, float]) -> None:
        with self._write() as db:
            db.execute(
                "INSERT OR REPLACE INTO rollout_hosts (rollout_id, host, wave, outcome, verdict, detail,"
                " flagged, medians_json, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (rollout_id, redact_text(host), wave, outcome, verdict, redact_text(detail[:1000]),
                 flagged, json.dumps({str(k): v for k, v in medians.items()}), _now()),
            )

    def finish_rollout(self, rollout_id: str, outcome: str, cause: str | None) -> None:
        with self._write() as db:
            now = _now()
            db.execute("UPDATE rollouts SET outcome = ?, cause = ?, finished_at = ?, updated_at = ? WHERE id = ?",
                       (outcome, _opt(cause), now, now, rollout_id))

    # --- reads ----------------------------------------------------------------

    def builds(self) -> list[BuildRecord]:
        rows = self._db.execute(
            "SELECT id, recorded_at, stack, variant, image, digest, content_hash, lock_json"
            " FROM builds ORDER BY id"
        ).fetchall()
        return [BuildRecord(id=r[0], recorded_at=r[1], stack=r[2], variant=r[3], image=r[4], digest=r[5],
                            content_hash=r[6], lock=json.loads(r[7])) for r in rows]

    def deploys(self) -> list[DeployRecord]:
        rows = self._db.execute(
            "SELECT id, recorded_at, host, stack, variant, config, image, digest, strategy,"
            " outcome, crash_signature, durations_json, downtime_s, cause, fingerprint,"
            " host_class FROM deploys ORDER BY id"
        ).fetchall()
        return [
            DeployRecord(id=r[0], recorded_at=r[1], host=r[2], stack=r[3], variant=r[4], config=r[5], image=r[6],
                         digest=r[7], strategy=r[8], outcome=r[9], crash_signature=r[10],
                         durations=json.loads(r[11]), downtime_s=r[12], cause=r[13], fingerprint=r[14],
                         host_class=r[15])
            for r in rows
        ]

    def gate_runs(self) -> list[GateRecord]:
        rows = self._db.execute(
            "SELECT id, recorded_at, host_class, result_json FROM gate_runs ORDER BY id"
        ).fetchall()
        return [
            GateRecord(row[0], row[1], row[2], GateResult.model_validate_json(row[3]))
            for row in rows
        ]

    def rollouts(self) -> list[RolloutRecord]:
        """Oldest first by last activity: a resumed rollout moves to the end."""
        rows = self._db.execute(
            "SELECT id, started_at, finished_at, stack, image, digest, policy, plan_json, outcome, cause"
            " FROM rollouts ORDER BY updated_at, id").fetchall()
        out = []
        for r in rows:
            hosts = self._db.execute(
                "SELECT host, wave, outcome, verdict, detail, flagged, medians_json FROM rollout_hosts"
                " WHERE rollout_id = ? ORDER BY wave, host", (r[0],)).fetchall()
            out.append(RolloutRecord(
                id=r[0], started_at=r[1], finished_at=r[2], stack=r[3], image=r[4], digest=r[5], policy=r[6],
                plan=json.loads(r[7]), outcome=r[8], cause=r[9],
                hosts=[RolloutHostRecord(h[0], h[1], h[2], h[3], h[4] or "", h[5],
                                         {int(k): v for k, v in json.loads(h[6]).items()}) for h in hosts]))
        return out


def default_ledger_path(root: Path) -> Path:
    return root / ".stackbuild" / "ledger.db"


def gate_plan(profile: GateProfile, path: Path, *, stored: bool, name: str = "", trials: int = 200,
              fresh: bool = True) -> str:
    """`gate --plan` at the noise the gate results in the ledger at `path` showed (none yet:
    assumed); the deploy's dry run prints it too."""
    results = []
    if path.exists():
        with Ledger(path) as db:
            results = [r.result for r in db.gate_runs()]
    return plan_text(profile, noise_from(results, profile), stored=stored, name=name, trials=trials,
                     fresh=fresh)


def ledger_path(given: Path | None, root: Path | None) -> Path:
    """--ledger when given, else the project's default under `root` (the working directory if None)."""
    return given or default_ledger_path(root or Path.cwd())
