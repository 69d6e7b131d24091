"""A candidate whose stream stalls fails the gate within its stall timeout and deadline (issue 10, item 2).

Against real simulator processes: `stall-stream` sends half the tokens, then nothing.
Before, each request waited the whole per-request timeout (here 600 s) and the gate hung.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from test_sim_process import sim

from stackbuild.cli.main import main
from stackbuild.spec.profile import BUILTIN_PROFILES, GateProfile

pytestmark = pytest.mark.integration
PER_TEST = True  # each test starts its own simulators
ARGS = ["--concurrency", "2", "--input-len", "16", "--output-len", "64", "--runs", "2", "--max-runs", "2",
        "--warmup", "0", "--timeout", "600", "--no-progress"]


def test_stalled_stream_fails_as_stalled(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with sim("--speed", "20") as inc, sim("--speed", "20", "--fault", "stall-stream") as cand:
        t0 = time.monotonic()
        rc = main(["gate", "--url", cand.url, "--baseline-url", inc.url, *ARGS, "--stall-timeout", "1",
                   "--json", str(tmp_path / "r.json")])
        took = time.monotonic() - t0
    assert rc == 1, capsys.readouterr()
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["verdict"] == "fail"
    assert any("stalled: no byte for 1s" in r for r in result["reasons"]), result["reasons"]
    assert took < 300  # bounded by stall timeouts (2 runs x 1 s), never by the 600 s request timeout


def test_gate_deadline_fails_the_level_with_the_cause(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with sim("--speed", "20") as inc, sim("--speed", "20", "--fault", "stall-stream") as cand:
        t0 = time.monotonic()
        rc = main(["gate", "--url", cand.url, "--baseline-url", inc.url, *ARGS, "--stall-timeout", "500",
                   "--deadline", "3", "--json", str(tmp_path / "r.json")])
        took = time.monotonic() - t0
    assert rc == 1, capsys.readouterr()
    assert took < 3 + 5  # the deadline bounds the gate (the stall alone would hold it 500 s)
    result = json.loads((tmp_path / "r.json").read_text())
    (lv,) = result["levels"]
    assert lv["verdict"] == "fail"
    assert "the gate's deadline of 3s passed before this level finished" in lv["reasons"][0]


def test_unwritable_junit_refused_before_measuring(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "f").write_text("")
    rc = main(["gate", "--url", "http://127.0.0.1:9", *ARGS, "--junit", str(tmp_path / "f" / "r.xml")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("stackbuild: --junit ") and len(err.strip().splitlines()) == 1


def test_derived_deadline_is_the_workloads_worst_case() -> None:
    p = GateProfile(concurrency=(1, 8), runs=3, max_runs=6, warmup=2, timeout_s=60.0,
                    probe_prompts=("a", "b", "c"), ready_timeout_s=10.0)
    # 6 runs x 2 sides x (1 + 1 rounds) x 60 s + warmup 2 x 1 round x 60 s + probe 2 x 3 x 60 s + 2 x 10 s,
    # agreement (its parts, each round x 60 s): ids 32 prompts 8 at a time = 4 rounds and long
    # 4 prompts at once = 1 round, both sides plus the candidate's teacher-forced pass (x3);
    # completions and chat 8 prompts = 1 round each, both sides (x2); no busy part (C=8 is
    # not above 8 at a time): (4 + 1) x 3 + (1 + 1) x 2 = 19 rounds
    # capacity: 2 sides x 6 steps x 400 rounds (capacity_min_requests at C=1) x 60 s
    assert p.phase_bounds_s() == {"ready": 20, "warmup": 120, "levels": 1440, "probe": 360, "agreement": 19 * 60}
    assert p.gate_deadline_s() == 1440 + 120 + 360 + 20 + 19 * 60
    assert p.with_overrides(slo={"itl_p99_ms": 50}).phase_bounds_s()["capacity"] == 2 * 6 * 400 * 60
    assert p.with_overrides(deadline_s=90).gate_deadline_s() == 90
    assert BUILTIN_PROFILES["quick"].workload().stall_timeout_s == 10.0
