"""The gate's pure core: statistics, decisions, bars, probe checks, summaries, writers."""

from __future__ import annotations

import datetime as dt
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from stackbuild.errors import InputError
from stackbuild.gate.decide import bar_violations, judge_level, level_summary, overall
from stackbuild.gate.formats import junit_xml, markdown_summary, read_json, write_json
from stackbuild.gate.loadgen import RequestRecord, prompt_ids, request_body, summarize
from stackbuild.gate.probe import check_outputs, problems
from stackbuild.gate.result import GateResult, Percentiles, RunMetrics, Workload
from stackbuild.gate.runner import _check_baseline
from stackbuild.gate.sequential import Design, look, obf_spent, z_boundaries
from stackbuild.gate.stats import bootstrap_ratio_ci, percentile, percentiles, t_isf, t_sf
from stackbuild.spec.profile import BUILTIN_PROFILES, GateProfile


def test_percentile_interpolates_like_numpy() -> None:
    xs = [1.0, 2.0, 3.0, 4.0]
    assert [percentile(xs, q) for q in (0, 50, 90, 100)] == [1.0, 2.5, 3.7, 4.0]
    assert percentile([], 50) == 0.0
    assert percentiles([2.0]) == Percentiles(mean=2.0, p50=2.0, p90=2.0, p99=2.0)


def test_bootstrap_identical_samples_give_a_point_interval() -> None:
    assert bootstrap_ratio_ci([10.0] * 3, [10.0] * 3) == (1.0, 1.0, 1.0)
    r, lo, hi = bootstrap_ratio_ci([9.0, 10.0, 11.0], [10.0, 10.0, 10.0], seed=1)
    assert r == 1.0 and lo == pytest.approx(0.9) and hi == pytest.approx(1.1)
    with pytest.raises(ValueError):
        bootstrap_ratio_ci([1.0], [0.0])


def test_obf_boundaries_match_the_published_ones() -> None:
    """Lan-DeMets O'Brien-Fleming spending, 5 equally spaced looks, one-sided alpha 0.025:
    4.877, 3.357, 2.680, 2.290, 2.031 (gsDesign's sfLDOF; Jennison & Turnbull 2000, ch. 7)."""
    got = z_boundaries(tuple(k / 5 for k in range(1, 6)), 0.025)
    assert [round(b, 3) for b in got] == [4.877, 3.357, 2.680, 2.290, 2.031]
    assert z_boundaries((1.0,), 0.025)[0] == pytest.approx(1.959964, abs=1e-5)
    assert obf_spent(1.0, 0.025) == pytest.approx(0.025)
    assert obf_spent(0.5, 0.025) == pytest.approx(0.001525, abs=1e-5)


@pytest.mark.parametrize(("p", "df", "want"), [
    (0.025, 2, 4.302653), (0.025, 5, 2.570582), (0.005, 1, 63.65674), (0.025, 10, 2.228139),
    (0.05, 30, 1.697261), (0.025, math.inf, 1.959964),
])
def test_student_t_quantiles_match_the_tables(p: float, df: float, want: float) -> None:
    assert t_isf(p, df) == pytest.approx(want, rel=1e-5)
    assert t_sf(want, df) == pytest.approx(p, rel=1e-4)


ONE = Design(paired=False, first=3, last=3)  # one look: a fixed-sample test


@pytest.mark.parametrize(("cand", "bar", "design", "want"), [
    ([110.0, 111.0, 109.0], 0.95, ONE, "pass"),   # clearly faster
    ([80.0, 81.0, 79.0], 0.95, ONE, "fail"),      # clearly slower
    ([98.0, 98.5, 97.5], 0.95, ONE, "pass"),      # slower but well within the bar
    ([97.0, 98.0, 96.0], 0.95, ONE, "undecided"),  # within it, but 3 runs (df 2) cannot say so
    ([90.0, 105.0, 97.0], 0.98, ONE, "undecided"),  # straddles the bar
    # paired: run i against run i; the machine's swings cancel
    ([95.1, 100.2, 104.9], 0.98, Design(paired=True, first=3, last=3), "pass"),
    ([95.1, 100.2, 104.9], 0.98, ONE, "undecided"),
])
def test_look_decisions(cand: list[float], bar: float, design: Design, want: str) -> None:
    inc = [95.0, 100.0, 105.0] if design.paired or cand[0] == 95.1 else [100.0, 100.5, 99.5]
    got = look(cand, inc, bar, design)
    assert got.decision == want
    assert got.low <= got.ratio <= got.high


def test_early_looks_are_strict_and_the_last_near_a_fixed_test() -> None:
    """O'Brien-Fleming spending: the first of four looks spends almost nothing, the last
    nearly all of alpha (its t boundary a little above the fixed-sample 2.571 at df 5: below
    10 runs the trimmed mean trims nothing)."""
    d = Design(paired=True, first=3, last=6)
    first, last = d.critical(3, 0), d.critical(6, 0)
    assert first[0] > 15 and 2.571 < last[0] < 3.0
    # one look: Student's t at df 2, up to the simulation error of the factor sized on 40 000
    # null paths: the 97.5% quantile's sd is sqrt(0.975 * 0.025 / 40 000) / f(4.30) = 0.072
    # (t_2's density there 0.0108), 1.7%; the tolerance is 3 sd
    assert Design(paired=True, first=3, last=3).critical(3, 0)[0] == pytest.approx(4.302653, rel=0.05)


def test_identical_runs_give_a_point_interval_and_one_run_none() -> None:
    lk = look([10.0] * 3, [10.0] * 3, 0.98, ONE)
    assert (lk.ratio, lk.low, lk.high, lk.decision) == (1.0, 1.0, 1.0, "pass")
    assert look([9.0], [10.0], 0.98, ONE).decision == "undecided"
    with pytest.raises(ValueError):
        look([1.0], [0.0], 1.0, ONE)


def test_drift_widens_a_stored_comparison() -> None:
    runs = ([101.0, 101.5, 100.5, 101.2], [100.0, 100.4, 99.6, 100.1])
    tight = look(*runs, 0.98, Design(paired=False, first=4, last=4))
    wide = look(*runs, 0.98, Design(paired=False, first=4, last=4, drift=0.01))
    assert tight.decision == "pass" and wide.decision == "undecided"
    assert wide.low < tight.low and wide.high > tight.high and wide.ratio == tight.ratio


def _run(tok_s: float, failed: int = 0, ttft_p99: float = 10.0, index: int = 0) -> RunMetrics:
    p = Percentiles(mean=1, p50=1, p90=1, p99=1)
    return RunMetrics(concurrency=1, index=index, duration_s=1.0, completed=4, failed=failed,
                      input_tokens=4, output_tokens=int(tok_s), output_tok_s=tok_s,
                      total_tok_s=tok_s + 4, ttft_ms=Percentiles(p99=ttft_p99), itl_ms=p,
                      tpot_ms=p, e2e_ms=p, errors=("HTTP 500",) if failed else ())


def test_judge_level_and_overall() -> None:
    prof = GateProfile(tolerance=0.05, runs=3, max_runs=3)
    fast = level_summary(1, [_run(110), _run(111), _run(112)])
    assert fast.median_output_tok_s == 111
    lv = judge_level(fast, [100.0, 100.0, 100.0], prof, final=True)
    assert lv.verdict == "pass" and lv.ratio == pytest.approx((110 * 111 * 112) ** (1 / 3) / 100)
    assert lv.paired is False and lv.ci_confidence == pytest.approx(0.9625)  # 2.5% + 2.5%/2 levels
    failing = judge_level(level_summary(1, [_run(120, failed=1)]), [100.0], prof, final=True)
    assert failing.verdict == "fail" and "1 failed requests" in failing.reasons[0]
    unsure = judge_level(level_summary(1, [_run(90), _run(105)]), [100.0, 101.0],
                         prof.with_overrides(tolerance=0.0), final=True)
    assert unsure.verdict == "inconclusive" and "cannot tell after 2 runs" in unsure.reasons[0]
    assert "must not lose (margin 2%)" in unsure.reasons[0]
    lying = level_summary(1, [_run(120).model_copy(update={"token_count_mismatches": 2})])
    lied = judge_level(lying, [100.0], prof, final=True)
    assert lied.verdict == "fail" and "disagree with what it streamed" in lied.reasons[0]
    ref = judge_level(fast, None, prof, final=True)
    assert ref.verdict == "reference" and ref.ratio is None
    assert overall([lv], [], None, compared=True) == "pass"
    assert overall([ref], [], None, compared=False) == "reference"
    assert overall([lv, unsure], [], None, compared=True) == "inconclusive"
    assert overall([lv, unsure, failing], [], None, compared=True) == "fail"
    assert overall([lv], ["bar"], None, compared=True) == "fail"


def test_bars() -> None:
    levels = [level_summary(1, [_run(50, ttft_p99=900)])]
    prof = GateProfile(min_tok_s_c1=60, max_ttft_p99_ms=500)
    assert bar_violations(levels, prof) == [
        "C=1 median 50.0 tok/s is below the bar 60 tok/s",
        "C=1: p99 TTFT 900 ms exceeds 500 ms",
    ]
    assert bar_violations(levels, GateProfile()) == []


@pytest.mark.parametrize(("text", "want"), [
    (" Paris is the capital", []),
    ("", ["empty output"]),
    ("   ", ["empty output"]),
    ("!!!!!!!!!!!!", ["one token repeated (12 of 12)"]),
    (" the the the the the", ["one token repeated (5 of 5)"]),
    (" ok \ufffd text here", ["replacement characters (U+FFFD) in the output"]),
])
def test_probe_problems(text: str, want: list[str]) -> None:
    assert problems(text) == want


def test_probe_against_reference() -> None:
    ok = check_outputs(["a", "b"], [" x y", " z w"], [" x y", " z w"])
    assert ok.passed and ok.reasons == ()
    bad = check_outputs(["a", "b"], [" x y", " z q"], [" x y", " z w"])
    assert not bad.passed and "differs from the incumbent" in bad.reasons[0]
    assert check_outputs(["a"], [" x y"], None).passed


def test_request_bodies_and_prompts() -> None:
    wl = Workload(input_len=5, output_len=7, seed=3)
    assert prompt_ids(wl, 8, 0, 1) == prompt_ids(wl, 8, 0, 1)
    assert prompt_ids(wl, 8, 0, 1) != prompt_ids(wl, 8, 0, 2)
    assert len(prompt_ids(wl, 8, 0, 1)) == 5
    path, body = request_body(wl, [1, 2])
    assert path == "/v1/completions"
    assert body["max_tokens"] == 7 and body["ignore_eos"] and body["stream"]
    assert body["stream_options"] == {"include_usage": True}
    path, body = request_body(wl.model_copy(update={"api": "generate"}), [1, 2])
    assert path == "/generate" and body["input_ids"] == [1, 2]
    assert body["sampling_params"] == {"max_new_tokens": 7, "temperature": 0.0, "ignore_eos": True}


def test_summarize_counts_only_completed_tokens() -> None:
    ok = RequestRecord(ok=True, start=0.0, end=1.0, ttft=0.1, chunk_times=[0.1, 0.4, 1.0],
                       output_tokens=10, streamed_tokens=3, prompt_tokens=4)
    bad = RequestRecord(ok=False, error="ServerDisconnectedError", start=0.0, end=0.5,
                        output_tokens=5)
    m = summarize([ok, bad], 2, 0, 2.0)
    assert (m.completed, m.failed, m.output_tokens, m.input_tokens) == (1, 1, 10, 4)
    assert m.output_tok_s == 5.0 and m.total_tok_s == 7.0
    assert m.ttft_ms.p50 == pytest.approx(100.0)
    assert m.itl_ms.mean == pytest.approx(450.0)
    assert m.tpot_ms.p50 == pytest.approx(100.0)
    assert m.errors == ("ServerDisconnectedError",)


def _result(verdict: str = "fail") -> GateResult:
    wl = BUILTIN_PROFILES["quick"].workload()
    lv = judge_level(level_summary(1, [_run(80), _run(81), _run(80.5)]), [100.0, 100.0, 100.5],
                     GateProfile(runs=3, max_runs=3), final=True)
    return GateResult(name="cand", url="http://127.0.0.1:1", started_at="t0", finished_at="t1",
                      workload=wl, fingerprint=wl.fingerprint(), levels=(lv,),
                      verdict=verdict, reasons=lv.reasons)  # type: ignore[arg-type]


def test_writers_round_trip_and_render(tmp_path: Path) -> None:
    r = _result()
    write_json(r, tmp_path / "out" / "r.json")
    assert read_json(tmp_path / "out" / "r.json") == r
    suite = ET.fromstring(junit_xml(r).split("\n", 1)[1])
    assert suite.get("failures") == "1" and suite.find("testcase/failure") is not None
    md = markdown_summary(r)
    assert "**FAIL**" in md and "| 1 | 3 | 80.5 | 100.0 | 0.804 |" in md
    (tmp_path / "junk.json").write_text("{}")
    with pytest.raises(InputError, match="not a gate result"):
        read_json(tmp_path / "junk.json")


def test_baseline_with_another_workload_is_refused() -> None:
    r = _result()
    p = GateProfile(runs=3, max_runs=3, session_drift=0)
    _check_baseline(r, r.workload, p)
    with pytest.raises(InputError, match="re-measure the incumbent"):
        _check_baseline(r, r.workload.model_copy(update={"output_len": 999}), p)


def test_thin_baseline_is_refused_by_gate_baseline_too() -> None:
    """A stored result with fewer runs than the candidate may take cannot pair them all."""
    r = _result()
    with pytest.raises(InputError, match=r"fewer than the 5 runs a baseline needs at C=1 \(3\)"):
        _check_baseline(r, r.workload, GateProfile(runs=3, max_runs=5, session_drift=0))


def test_a_stored_baseline_no_run_count_can_decide_is_refused_before_measuring() -> None:
    """Its session drift is a floor under the se: c * 1% reaches the 2% margin."""
    r = _result()  # finished_at "t1": of unknown age, so of another session
    p = GateProfile(runs=3, max_runs=3, tolerance=0.0)
    with pytest.raises(InputError, match=r"C=1,8 cannot be decided against a stored baseline.*"
                                         r"live incumbent.*fresh measurement.*a margin or "
                                         r"tolerance of 7\.0% or more"):
        _check_baseline(r, r.workload, p)
    _check_baseline(r, r.workload, p.with_overrides(margin=0.08))  # a wide margin decides
    fresh = r.model_copy(update={"finished_at": dt.datetime.now(dt.UTC).isoformat()})
    _check_baseline(fresh, r.workload, p)  # measured right before: no session drift


def test_profile_overrides_validate() -> None:
    p = BUILTIN_PROFILES["users"]
    assert (p.workload().runs, p.workload().max_runs, p.reference_runs) == (5, 15, 10)
    assert p.concurrency == (1, 30, 250)
    q = p.with_overrides(runs=3, concurrency=(250, 1), tolerance=None)
    assert q.runs == 3 and q.concurrency == (1, 250) and q.tolerance == p.tolerance
    with pytest.raises(ValueError):
        p.with_overrides(concurrency=(0,))
    with pytest.raises(ValueError):
        GateProfile(bogus=1)  # type: ignore[call-arg]


def test_live_progress_renders_the_events() -> None:
    import io

    from rich.console import Console

    from stackbuild.gate.progress import LiveProgress

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=120, color_system=None)
    lv = judge_level(level_summary(1, [_run(110), _run(110)]), [100.0, 100.0],
                     GateProfile(runs=2, max_runs=2, session_drift=0), final=True)
    with LiveProgress(console) as prog:
        prog("start", {"name": "cand", "url": "http://127.0.0.1:1"})
        prog("level", {"concurrency": 1})
        prog("request", {"side": "candidate", "concurrency": 1, "index": 0, "done": 1,
                         "total": 1, "ok": True})
        prog("run", {"side": "incumbent", "concurrency": 1, "index": 0, "metrics": _run(100)})
        prog("run", {"side": "candidate", "concurrency": 1, "index": 0, "metrics": _run(110)})
        prog("decision", {"concurrency": 1, "level": lv})
    out = buf.getvalue()
    assert "gate cand @ http://127.0.0.1:1" in out
    assert "1.100 [1.100, 1.100]" in out and "pass" in out


@pytest.mark.parametrize(("paired", "first", "last", "stored", "rho", "detrend"),
                         [(True, 2, 12, 0, 0.0, False), (False, 3, 12, 10, 0.4, False), (False, 2, 5, 1, 0.0, False),
                          (True, 2, 12, 0, 0.4, True)])
def test_the_vectorised_null_paths_are_the_gates_own_statistic(monkeypatch: pytest.MonkeyPatch, paired: bool,
                                                               first: int, last: int, stored: int, rho: float,
                                                               detrend: bool) -> None:
    """The boundary sizing computes the statistic for all paths at once; on the same seeded draws
    each path equals `statistic` look by look (trimming from 10 runs, one stored run included,
    the detrended one from 3 pairs)."""
    from stackbuild.gate import sequential as sq

    monkeypatch.setattr(sq, "CALIBRATION_PATHS", 50)
    sq._null_paths.cache_clear()
    try:
        fast = sq._null_paths(paired, first, last, stored, rho, detrend)
    finally:
        sq._null_paths.cache_clear()
    seed = f"{first}:{last}:{stored}:{paired}:{rho}" + (":trend" if detrend else "")
    xs, base = sq._null_draws(paired, last, stored, rho, seed)
    design = Design(paired=paired, first=first, last=last, detrend=detrend)
    assert fast.shape == (50, last - first + 1)
    for path, x, b in zip(fast.tolist(), xs.tolist(), base.tolist(), strict=True):
        b = [0.0] * last if paired else b  # paired: x are the differences
        want = []
        for n in range(first, last + 1):
            est, se, _ = sq.statistic(x[:n], b, design)
            want.append(est / se if se > 0 and math.isfinite(se) else 0.0)
        assert path == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_the_null_runs_are_ar1_of_the_declared_correlation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each run standard normal, lag-1 correlation rho, lag-2 rho^2 (20 000 seeded paths: the
    sampling sd of each moment is under 0.01, the tolerance 0.03)."""
    from stackbuild.gate import sequential as sq

    monkeypatch.setattr(sq, "CALIBRATION_PATHS", 20000)
    xs, base = sq._null_draws(False, 6, 4, 0.6, "ar1")
    assert base.shape == (20000, 4)
    assert [round(float(v), 2) for v in xs.var(axis=0)] == pytest.approx([1.0] * 6, abs=0.03)
    assert float((xs[:, 3] * xs[:, 4]).mean()) == pytest.approx(0.6, abs=0.03)
    assert float((xs[:, 2] * xs[:, 4]).mean()) == pytest.approx(0.36, abs=0.03)
    assert float((xs[:, 5] * base[:, 0]).mean()) == pytest.approx(0.0, abs=0.03)  # the sides apart
