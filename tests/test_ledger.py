"""The ledger: versioned schema with migrations, safe concurrent writers, nothing secret stored."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path

import pytest
from test_report import USERS, result

from stackbuild.errors import InputError
from stackbuild.results.ledger import Ledger
from stackbuild.results.redact import redact, redact_text
from stackbuild.results.schema import MIGRATIONS, SCHEMA_VERSION


def test_fresh_ledger_is_at_the_latest_schema(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db") as db:
        assert db.schema_version == SCHEMA_VERSION == len(MIGRATIONS)


def test_old_file_is_migrated_in_place(tmp_path: Path) -> None:
    path = tmp_path / "l.db"  # a version-1 file, built by hand as an old stackbuild left it
    raw = sqlite3.connect(path)
    raw.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    for stmt in MIGRATIONS[0]:
        raw.execute(stmt)
    raw.execute("INSERT INTO schema_version VALUES (1)")
    raw.execute("INSERT INTO deploys (recorded_at, host, stack, variant, config, image, digest, strategy, outcome,"
                " crash_signature, durations_json, downtime_s, cause) VALUES ('t', 'h', 's', NULL, 's', 'i', NULL,"
                " 'swap', 'promoted', NULL, '{}', NULL, NULL)")
    raw.commit()
    raw.close()
    with Ledger(path) as db:
        assert db.schema_version == SCHEMA_VERSION
        (d,) = db.deploys()
        assert (d.stack, d.outcome, d.fingerprint) == ("s", "promoted", None)


def test_newer_schema_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    Ledger(path).close()
    raw = sqlite3.connect(path)
    raw.execute("UPDATE schema_version SET version = 99")
    raw.commit()
    raw.close()
    with pytest.raises(InputError, match="schema version 99 is newer"):
        Ledger(path)


def _writer(path: str, n: int, tag: str) -> None:
    with Ledger(path) as db:
        for i in range(n):
            db.record_deploy(host=f"h{tag}", stack="sim", image=f"img{i}", strategy="swap", outcome="promoted")


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "l.db")
    Ledger(path).close()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, 40, str(k))) for k in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    with Ledger(path) as db:
        deploys = db.deploys()
    assert len(deploys) == 120
    assert sorted({d.host for d in deploys}) == ["h0", "h1", "h2"]


SECRET = "hf_abcdefghijklmnopqrstuvwxyz012345"


def test_nothing_secret_is_stored(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    with Ledger(path) as db:
        db.record_deploy(host="root@gpu", stack="sim", image="r:5000/x", strategy="swap", outcome="failed",
                         cause=f"docker login failed for https://bob:{SECRET}@registry HF_TOKEN={SECRET}")
        db.record_build(stack="sim", image="i", content_hash="h", lock={"hf_token": SECRET, "x": 1})
        db.record_gate(result("baseline", USERS["baseline"], "2026-11-01T00:00:00", baseline=None,
                              host={"gpu_model": "G", "note": f"Bearer {SECRET}"}))
    assert SECRET.encode() not in path.read_bytes()
    for extra in path.parent.glob("l.db-*"):  # WAL and shared-memory files too
        assert SECRET.encode() not in extra.read_bytes()


def test_redaction_rules() -> None:
    assert redact_text(f"token {SECRET} end") == "token [redacted] end"
    assert redact_text("https://bob:hunter22@host/x") == "https://bob:[redacted]@host/x"
    assert redact({"password": "short", "output_tokens": 12, "token_count_mismatches": 0}) == {
        "password": "[redacted]", "output_tokens": 12, "token_count_mismatches": 0}
