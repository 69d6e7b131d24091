"""The ledger: every build, deploy and gate run, in one embedded SQLite file.

Writers are separate processes (a deploy and a gate may finish at the same
moment), so the file runs in WAL mode with a busy timeout and every write takes
the write lock up front with BEGIN IMMEDIATE. The schema is versioned: a
`schema_version` table holds the number and `_MIGRATIONS` is the ordered list
that brings any older file up to date. Everything stored passes through
`redact` first, so tokens and passwords that leak into a cause, a lock or a
URL never reach the file.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, get_args

from stackbuild.errors import InputError
from stackbuild.gate.result import GateResult
from stackbuild.spec.profile import GateProfile

DeployOutcome = Literal["promoted", "rolled-back", "refused", "failed"]

BUSY_TIMEOUT_S = 30.0

# Ordered: index i + 1 is the schema version the statement list brings the file to.
_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE builds (
            id INTEGER PRIMARY KEY,
            recorded_at TEXT NOT NULL,
            stack TEXT NOT NULL,
            variant TEXT,
            image TEXT NOT NULL,
            digest TEXT,
            content_hash TEXT NOT NULL,
            lock_json TEXT NOT NULL)""",
        """CREATE TABLE deploys (
            id INTEGER PRIMARY KEY,
            recorded_at TEXT NOT NULL,
            host TEXT NOT NULL,
            stack TEXT NOT NULL,
            variant TEXT,
            config TEXT NOT NULL,
            image TEXT NOT NULL,
            digest TEXT,
            strategy TEXT NOT NULL,
            outcome TEXT NOT NULL
                CHECK (outcome IN ('promoted', 'rolled-back', 'refused', 'failed')),
            crash_signature TEXT,
            durations_json TEXT NOT NULL,
            downtime_s REAL,
            cause TEXT)""",
        """CREATE TABLE gate_runs (
            id INTEGER PRIMARY KEY,
            recorded_at TEXT NOT NULL,
            name TEXT NOT NULL,
            fingerprint TEXT NOT NULL,
            host_class TEXT NOT NULL,
            started_at TEXT NOT NULL,
            finished_at TEXT NOT NULL,
            verdict TEXT NOT NULL,
            baseline_name TEXT,
            host_json TEXT NOT NULL,
            workload_json TEXT NOT NULL,
            result_json TEXT NOT NULL)""",
        """CREATE TABLE gate_levels (
            gate_run_id INTEGER NOT NULL REFERENCES gate_runs(id) ON DELETE CASCADE,
            concurrency INTEGER NOT NULL,
            runs INTEGER NOT NULL,
            median_output_tok_s REAL NOT NULL,
            median_total_tok_s REAL NOT NULL,
            ttft_p99_ms REAL NOT NULL,
            failed_requests INTEGER NOT NULL,
            ratio REAL,
            ci_low REAL,
            ci_high REAL,
            verdict TEXT NOT NULL,
            PRIMARY KEY (gate_run_id, concurrency))""",
    ),
    # A deploy that never reached the gate still belongs to a workload and a
    # host class when the caller knows them; the report files it there.
    (
        "ALTER TABLE deploys ADD COLUMN fingerprint TEXT",
        "ALTER TABLE deploys ADD COLUMN host_class TEXT",
        "CREATE INDEX gate_runs_group ON gate_runs (fingerprint, host_class, name, finished_at)",
        "CREATE INDEX deploys_config ON deploys (config, recorded_at)",
    ),
    # Fleet rollouts (stackbuild/fleet): one row per rollout, one per host in it.
    (
        """CREATE TABLE rollouts (
            id TEXT PRIMARY KEY,
            started_at TEXT NOT NULL,
            finished_at TEXT,
            stack TEXT NOT NULL,
            image TEXT NOT NULL,
            digest TEXT NOT NULL,
            policy TEXT NOT NULL,
            plan_json TEXT NOT NULL,
            outcome TEXT NOT NULL,
            cause TEXT,
            updated_at TEXT NOT NULL)""",
        """CREATE TABLE rollout_hosts (
            rollout_id TEXT NOT NULL REFERENCES rollouts(id) ON DELETE CASCADE,
            host TEXT NOT NULL,
            wave INTEGER NOT NULL,
            outcome TEXT NOT NULL,
            verdict TEXT,
            detail TEXT,
            flagged TEXT,
            medians_json TEXT NOT NULL,
            recorded_at TEXT NOT NULL,
            PRIMARY KEY (rollout_id, host))""",
    ),
)
SCHEMA_VERSION = len(_MIGRATIONS)

# --- redaction ----------------------------------------------------------------

REDACTED = "[redacted]"
# Keys whose string values are secrets whatever they look like. Whole words only:
# "output_tokens" and "token_count_mismatches" are numbers, not credentials.
_SECRET_KEY = re.compile(
    r"(?i)(^|[_\-.])(token|secret|password|passwd|api[_-]?key|credentials?|auth|authorization"
    r"|cookie|private[_-]?key|hf[_-]?token)($|[_\-.])"
)
_SECRET_VALUES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S),
     REDACTED),
    (re.compile(r"\bhf_[A-Za-z0-9]{16,}"), REDACTED),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"), REDACTED),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{20,}"), REDACTED),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), REDACTED),
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 " + REDACTED),
    # scheme://user:password@host -> keep the user, drop the password
    (re.compile(r"(://[^/\s:@]+):[^/\s@]+@"), r"\1:" + REDACTED + "@"),
    # NAME_TOKEN=value, password: value (values short enough to be counts are left alone)
    (re.compile(
        r"(?i)\b([A-Z0-9_]*(?:TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY)[A-Z0-9_]*)(\s*[=:]\s*)"
        r"(?!\[redacted\])[^\s,;'\"]{8,}"),
     r"\1\2" + REDACTED),
)


def redact_text(text: str) -> str:
    for pattern, replacement in _SECRET_VALUES:
        text = pattern.sub(replacement, text)
    return text


def redact(value: Any, key: str = "") -> Any:
    """A copy of a JSON-like value with secret-looking keys and strings blanked."""
    if isinstance(value, str):
        return REDACTED if value and _SECRET_KEY.search(key) else redact_text(value)
    if isinstance(value, Mapping):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v, key) for v in value]
    return value


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

    def _migrate(self, target: int = SCHEMA_VERSION) -> None:
        with self._write() as db:
            db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            # Read inside the lock: another process may have migrated meanwhile.
            current = self.schema_version
            if current > SCHEMA_VERSION:
                raise InputError(
                    f"{self.path}: ledger schema version {current} is newer than this stackbuild "
                    f"understands ({SCHEMA_VERSION}); upgrade stackbuild or pass --ledger"
                )
            for statements in _MIGRATIONS[current:target]:
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

    def record_deploy(
        self,
        *,
        host: str,
        stack: str,
        image: str,
        strategy: str,
        outcome: DeployOutcome,
        variant: str | None = None,
        digest: str | None = None,
        crash_signature: str | None = None,
        durations: Mapping[str, float] | None = None,
        downtime_s: float | None = None,
        cause: str | None = None,
        config: str | None = None,
        fingerprint: str | None = None,
        host_class: str | None = None,
    ) -> int:
        """Record one deploy. `config` names the row in the results table (default: variant,
        else stack); `fingerprint`/`host_class` file a deploy that never reached the gate
        under the workload it was meant for."""
        if outcome not in get_args(DeployOutcome):
            raise InputError(
                f"deploy outcome {outcome!r}: use one of {', '.join(get_args(DeployOutcome))}"
            )
        with self._write() as db:
            cur = db.execute(
                "INSERT INTO deploys (recorded_at, host, stack, variant, config, image, digest,"
                " strategy, outcome, crash_signature, durations_json, downtime_s, cause,"
                " fingerprint, host_class) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (_now(), redact_text(host), stack, variant, config or variant or stack,
                 redact_text(image), _opt(digest), strategy, outcome, _opt(crash_signature),
                 _json(dict(durations or {})), downtime_s, _opt(cause), fingerprint, host_class),
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


def default_ledger_path(root: Path) -> Path:
    return root / ".stackbuild" / "ledger.db"


def gate_plan(profile: GateProfile, path: Path, *, stored: bool, name: str = "", trials: int = 200) -> str:
    """`gate --plan` at the noise the gate results in the ledger at `path` showed (none yet:
    assumed); the deploy's dry run prints it too."""
    from stackbuild.gate.plan import noise_from, plan_text

    results = []
    if path.exists():
        with Ledger(path) as db:
            results = [r.result for r in db.gate_runs()]
    return plan_text(profile, noise_from(results, profile), stored=stored, name=name, trials=trials)
