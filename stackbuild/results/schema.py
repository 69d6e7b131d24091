"""The ledger's schema: the ordered migrations that bring any older ledger file up to date.

A file records the number of migrations applied in its `schema_version` table; a new
table or column is a new entry at the end, never an edit of an old one.
"""

from __future__ import annotations

# Ordered: index i + 1 is the schema version the statement list brings the file to.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
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
SCHEMA_VERSION = len(MIGRATIONS)
