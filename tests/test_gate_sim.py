"""The gate end to end against simulator processes over real HTTP (CLI and library)."""

from __future__ import annotations

import asyncio
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from stackbuild.cli.main import main
from stackbuild.effects import aio
from stackbuild.effects.net import free_port
from stackbuild.gate.result import GateResult
from stackbuild.gate.runner import run_gate, run_gate_async
from stackbuild.sim.process import sim
from stackbuild.spec.load import load_stack
from stackbuild.spec.profile import GateProfile

pytestmark = pytest.mark.integration
PER_TEST = True  # each test starts its own simulators

# C=8 closed loop, 160 out tokens: at --speed 10 a run is ~0.35 s. Tests whose verdict is the
# point run the simulator at VERDICT_SPEED: its steps then outlast its CPU work, so a busy machine
# barely moves a run (at --speed 10 the whole suite's load left the gate unable to decide)
VERDICT_SPEED = "4"
SMALL = ["--concurrency", "8", "--input-len", "32", "--output-len", "160", "--runs", "3",
         "--max-runs", "10", "--warmup", "1", "--no-progress"]


def test_faster_candidate_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # C=8, where topk1-v2 is 55% faster by the model: at C=30 (+10%, against a bar of -5%) a
    # fresh-clone CI read it +6.6%, CI -6.9%..+22.2% after ten pairs (thirty streams a step are
    # CPU work a loaded machine stretches); the verdict, not the level, is the point
    with sim("--speed", VERDICT_SPEED) as inc, \
            sim("--speed", VERDICT_SPEED, "--profile", "eagle3-topk1-v2") as cand:
        rc = main(["gate", "--url", cand.url, "--baseline-url", inc.url, "--name", "topk1",
                   *SMALL, "--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "r.xml")])
    out = capsys.readouterr().out
    assert rc == 0, out
    result = json.loads((tmp_path / "r.json").read_text())
    lv = result["levels"][0]
    assert result["verdict"] == "pass" and lv["verdict"] == "pass"
    assert lv["ratio"] > 1.03 and lv["ci_low"] >= 0.95
    # decided within the cap (the sequential design looks from where its boundary can be crossed)
    assert 3 <= len(lv["runs"]) <= 10
    assert f"| 8 | {len(lv['runs'])} |" in out and "PASS" in out
    suite = ET.parse(tmp_path / "r.xml").getroot()
    assert suite.get("failures") == "0" and suite.get("tests") == "4"  # C=8, probe, agreement, bars


def test_slower_candidate_fails(capsys: pytest.CaptureFixture[str]) -> None:
    # half speed: at slow:1.3 (0.77x against a bar of 0.95) a fresh-clone CI beside two busy loops
    # ended inconclusive after ten pairs; how small a loss the gate catches is test_gate_stats.py's
    with sim("--speed", VERDICT_SPEED) as inc, sim("--speed", VERDICT_SPEED, "--fault", "slow:2") as cand:
        rc = main(["gate", "--url", cand.url, "--baseline-url", inc.url, *SMALL])
    err = capsys.readouterr().err
    assert rc == 1
    assert "C=8: slower than the incumbent" in err


def test_equal_servers_measure_equal_within_noise() -> None:
    """Two equal simulators over real HTTP: the ratio sits near 1 and the gate never calls it
    a loss. Which side of a 5% bar the noise of a loaded machine lands on (pass, or
    inconclusive with "cannot tell after N runs") is the statistics' business, decided on
    fixed samples in tests/test_gate_stats.py, not on this machine's clock. How near 1 the ratio
    sits is the machine's business too (0.88 once, with the suite on two CPUs): a figure for
    bench/, not a bound here: runs paired with the incumbent's, and never a loss."""
    prof = GateProfile(concurrency=(8,), input_len=32, output_len=128, runs=3, max_runs=4,
                       warmup=4, tolerance=0.05)
    with sim("--speed", "4", "--seed", "1") as inc, sim("--speed", "4", "--seed", "2") as cand:
        res = run_gate(cand.url, prof, name="same", baseline_url=inc.url)
    assert res.verdict in ("pass", "inconclusive"), res.reasons
    lv = res.levels[0]
    assert lv.paired and lv.ratio is not None and len(lv.runs) >= 3


def test_garbage_output_fails_the_probe(capsys: pytest.CaptureFixture[str]) -> None:
    with sim("--speed", "10") as inc, sim("--speed", "10", "--fault", "garbage") as cand:
        rc = main(["gate", "--url", cand.url, "--baseline-url", inc.url, *SMALL])
    captured = capsys.readouterr()
    assert rc == 1
    assert "Probe: FAILED" in captured.out
    assert "one token repeated" in captured.out
    assert "first tokens agree on 0%" in captured.out


def test_mid_run_crash_is_failed_requests_not_a_fast_run(tmp_path: Path) -> None:
    prof = GateProfile(concurrency=(8,), input_len=32, output_len=48, runs=3, max_runs=3,
                       warmup=1, timeout_s=10)
    with sim("--speed", "10") as ref:
        baseline = run_gate(ref.url, prof, name="incumbent")
    # readiness checks (2) + warmup (1), then runs of 8: the 13th arrives in the 2nd run
    with sim("--speed", "10", "--fault", "die-after:12") as cand:
        result = run_gate(cand.url, prof, name="crashy", baseline=baseline)
    assert baseline.verdict == "reference"
    lv = result.levels[0]
    assert result.verdict == "fail"
    # the first failed request decides the level (none may fail): the 2nd run ends there, no 3rd
    assert lv.failed_requests >= 1 and len(lv.runs) == 2
    assert any("failed requests" in r for r in result.reasons)
    assert result.probe is not None and not result.probe.passed


def test_stored_baseline_round_trip_and_workload_mismatch(tmp_path: Path) -> None:
    base = tmp_path / "base.json"
    ledger = tmp_path / "ledger.db"
    # a stored baseline is compared across two moments of a busy machine
    with sim("--speed", VERDICT_SPEED) as s:
        assert main(["gate", "--url", s.url, *SMALL, "--json", str(base), "--name", "inc",
                     "--ledger", str(ledger)]) == 0
        # the same server against its stored self: never a loss; pass, or on a machine whose load
        # moved between the two moments (5 runs a side), inconclusive (0.986, CI +-11%, once in CI)
        rc = main(["gate", "--url", s.url, *SMALL, "--baseline", str(base), "--name", "cand",
                   "--tolerance", "10", "--ledger", str(ledger)])
        assert rc in (0, 3)
        # both runs are in the ledger and the report next to it was rewritten after each
        report = (tmp_path / "report.md").read_text()
        assert "| inc | Reference |" in report and f"| cand | {'PASS' if rc == 0 else 'INCONCLUSIVE'} |" in report
        # a different output length is a different workload: refused, exit 2
        other = [*SMALL]
        other[other.index("--output-len") + 1] = "64"
        assert main(["gate", "--url", s.url, *other, "--baseline", str(base)]) == 2


def test_unreachable_or_never_ready_server_exits_4(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["gate", "--url", f"http://127.0.0.1:{free_port()}", *SMALL])
    assert rc == 4
    assert "unreachable" in capsys.readouterr().err
    with sim("--fault", "never-ready", up=False) as s:
        rc = main(["gate", "--url", s.url, *SMALL, "--ready-timeout", "1"])
    assert rc == 4
    assert "does not serve: health failing" in capsys.readouterr().err


def test_stall_stream_times_out_as_failed(tmp_path: Path) -> None:
    prof = GateProfile(concurrency=(2,), input_len=16, output_len=32, runs=1, max_runs=1,
                       warmup=0, timeout_s=1.5, probe_prompts=("hi",))
    with sim("--speed", "10", "--fault", "stall-stream") as s:
        result = run_gate(s.url, prof, name="stall")
    lv = result.levels[0]
    # both stall; the first to reach its bound decides the level and the other is cancelled
    assert lv.failed_requests >= 1 and lv.median_output_tok_s == 0.0
    assert result.verdict == "fail"
    assert any("timeout" in e for e in lv.runs[0].errors)


def test_generate_api_measures_what_completions_measures() -> None:
    # the two APIs are measured at once, against one server, so the machine's load is common to
    # both: measured one after the other, the load between them was in the figure (a fresh-clone
    # CI under two busy loops read the native API 22% below the OpenAI one). The server steps
    # all 16 streams together; a wrong count of tokens or of time (the API's own mistake) would
    # be off by far more than the bound
    prof = GateProfile(concurrency=(8,), input_len=32, output_len=320, runs=3, warmup=2,
                       probe_prompts=("hi",))

    async def both() -> tuple[GateResult, GateResult]:
        return await asyncio.gather(
            run_gate_async(s.url, prof, name="oai"),
            run_gate_async(s.url, prof.with_overrides(api="generate"), name="native"))

    with sim("--speed", VERDICT_SPEED, "--profile", "eagle3-topk1-v2",
             "--max-running-requests", "256") as s:
        oai, native = aio.run(both)
    assert oai.fingerprint != native.fingerprint  # different API, different workload
    a, b = oai.levels[0], native.levels[0]
    assert a.failed_requests == b.failed_requests == 0
    assert all(r.token_count_mismatches == 0 and r.output_tokens == 8 * 320
               for r in (*a.runs, *b.runs))
    assert b.median_output_tok_s == pytest.approx(a.median_output_tok_s, rel=0.15)


def test_users_policy_passes_topk1_v2_and_fails_topk4_v1() -> None:
    """The sim stack's gate profile holds the users' policy (C>=2 must not lose) over real HTTP.
    By the model topk1-v2 is 55% faster at C=8 and topk4-v1 38% slower: verdicts no loaded
    machine can flip. C=1 (6.5% slower against a bar of 8%, 1.5 points of margin) is decided
    from the model in tests/test_gate_policy.py, not from a clock here."""
    prof = load_stack("sim", root=Path(__file__).resolve().parents[1]).gate.profiles["quick"]
    # the policy is the point; with margins this wide a few runs a side decide it, and up to
    # ten let runs that a loaded machine disturbed be outvoted (more would move the first
    # look that can decide later: the boundaries spend alpha over every look). At --speed 20
    # a run was CPU work more than the model's steps: a fresh-clone CI under `stress --cpu 2`
    # read topk1-v2 at 1.52x with a CI of -3.7%..+141% after six runs, one under two busy
    # loops 1.65x, -20%..+243% after ten; at VERDICT_SPEED a step outlasts its CPU work
    c8 = prof.with_overrides(concurrency=(8,), output_len=128, runs=3, max_runs=10, warmup=1)
    cap = ("--max-running-requests", "256")
    with sim("--speed", VERDICT_SPEED) as inc, \
            sim("--speed", VERDICT_SPEED, "--profile", "eagle3-topk1-v2", *cap) as k1, \
            sim("--speed", VERDICT_SPEED, "--profile", "eagle3-topk4-v1", *cap) as k4:
        good = run_gate(k1.url, c8, name="eagle3-topk1-v2", baseline_url=inc.url)
        bad = run_gate(k4.url, c8, name="eagle3-topk4-v1", baseline_url=inc.url)
    assert good.verdict == "pass", good.reasons
    assert good.levels[0].explanation.endswith("must not lose (margin 2%): pass")
    assert bad.verdict == "fail" and bad.levels[0].explanation.endswith("must not lose (margin 2%): fail")


def test_agreement_fails_a_drifting_candidate_live_and_stored(tmp_path: Path) -> None:
    """Same speed, plausible text: only agreement can tell. Live incumbent (side-by-side)
    and the incumbent's stored result (what swap compares with) must both catch it;
    a benign divergence and EAGLE (same greedy tokens) pass."""
    prof = GateProfile(concurrency=(8,), input_len=32, output_len=48, runs=3, max_runs=3,
                       warmup=1, tolerance=0.5)
    with sim("--speed", "10") as inc, sim("--speed", "10", "--fault", "drift") as drift, \
            sim("--speed", "10", "--fault", "diverge:4") as div, \
            sim("--speed", "10", "--profile", "eagle3-topk1-v2") as eagle:
        stored = run_gate(inc.url, prof, name="baseline")
        live = run_gate(drift.url, prof, name="drift", baseline_url=inc.url)
        benign = run_gate(div.url, prof, name="diverge", baseline_url=inc.url)
        spec = run_gate(eagle.url, prof, name="eagle", baseline_url=inc.url)
    (tmp_path / "inc.json").write_text(stored.model_dump_json())
    with sim("--speed", "10", "--fault", "drift") as drift:
        rc = main(["gate", "--url", drift.url, "--baseline", str(tmp_path / "inc.json"),
                   "--concurrency", "8", "--input-len", "32", "--output-len", "48", "--runs", "3",
                   "--max-runs", "3", "--warmup", "1", "--tolerance", "50", "--no-progress",
                   "--json", str(tmp_path / "drift.json")])
    swapped = json.loads((tmp_path / "drift.json").read_text())
    assert stored.agreement is not None
    assert [s.part for s in stored.agreement.samples] == ["ids"] * 32 + ["long"] * 4
    for res in (live, GateResult.model_validate(swapped)):
        ag = res.agreement
        assert res.verdict == "fail" and ag is not None and not ag.passed
        assert (ag.logprob_drop or 0) > 5 and (ag.first_token or 0) < 0.1
        assert any("diverges at token 0" in r for r in res.reasons)
    assert rc == 1
    for res in (benign, spec):
        ag = res.agreement
        assert ag is not None and ag.passed and ag.compared and ag.first_token == 1.0
        assert abs(ag.logprob_drop or 0) < 0.05, res.name
    assert benign.agreement is not None and (benign.agreement.full_match or 1) < 1
    assert spec.agreement is not None and spec.agreement.full_match == 1.0


def test_capacity_under_an_slo_matches_the_model_within_one_step() -> None:
    """The search's answer against the simulator's own model: the highest grid level whose
    expected TPOT (stackbuild.sim.model.expected_tpot_ms) meets the SLO, give or take a step."""
    from stackbuild.gate.capacity import GRID
    from stackbuild.sim.calibration import PROFILES
    from stackbuild.sim.model import expected_tpot_ms

    speed, slo_ms = 2.0, 16.8  # baseline's model TPOT at C=20, between grid levels 16 and 24
    prof = GateProfile(concurrency=(1,), input_len=32, output_len=128, runs=1, max_runs=1,
                       warmup=1, slo={"tpot_p99_ms": slo_ms}, capacity_max_concurrency=96,
                       agreement_prompts=0,
                       # the search against the model, not the interval's coverage (bench/gate_calibration.py's
                       # capacity_coverage): 32 requests a level keep it to seconds where the default 400 took
                       # minutes a level at C=1; below 367 the p99's upper end is infinite, so low may be 0
                       capacity_min_requests=32)
    cap = ("--max-running-requests", "256")
    with sim("--speed", str(speed)) as inc, \
            sim("--speed", str(speed), "--profile", "eagle3-topk1-v2", *cap) as cand:
        res = run_gate(cand.url, prof, name="topk1", baseline_url=inc.url)
    assert res.capacity is not None and res.capacity.incumbent is not None
    for side, profile in ((res.capacity.incumbent, PROFILES["baseline"]),
                          (res.capacity.candidate, PROFILES["eagle3-topk1-v2"].as_measured())):
        model = max((c for c in GRID if c <= 96 and
                     expected_tpot_ms(profile, c, 32, 128, speed) <= slo_ms), default=0)
        assert abs(GRID.index(side.concurrency) - GRID.index(model)) <= 1, (side, model)
        assert side.runs <= 5 and side.goodput_tok_s > 0
        # an interval around it, from the requests' bootstrap
        assert side.concurrency_low is not None and side.concurrency_high is not None
        assert side.concurrency_low <= side.concurrency <= side.concurrency_high
        assert side.goodput_low is not None and side.goodput_low <= side.goodput_tok_s
    assert res.capacity.goodput_ratio is not None
