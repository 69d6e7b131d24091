"""The report's pure core with the users' own numbers: exact rows and conclusion."""

from __future__ import annotations

from pathlib import Path

import pytest

from stackbuild.cli.main import main
from stackbuild.gate.result import GateResult, LevelResult, Percentiles, RunMetrics, Workload
from stackbuild.results.ledger import Ledger
from stackbuild.results.report import build_report, render_markdown

WL = Workload(concurrency=(1, 30, 250), output_len=2048, runs=10)
USERS = {  # seed-results.json "sweep" (seeds/004)
    "baseline": {1: 92.7, 30: 689.4, 250: 718.1},
    "eagle3-topk1-v2": {1: 86.8, 30: 759.3, 250: 754.4},
    "eagle3-topk4-v1": {1: 85.0, 30: 345.0, 250: 353.0},
}
P = Percentiles(mean=1, p50=1, p90=1, p99=1)


def _level(c: int, tok: float, ref: float | None, verdict: str) -> LevelResult:
    run = RunMetrics(concurrency=c, index=0, duration_s=1, completed=c, failed=0, input_tokens=1, output_tokens=1,
                     output_tok_s=tok, total_tok_s=tok, ttft_ms=P, itl_ms=P, tpot_ms=P, e2e_ms=P)
    ratio = tok / ref if ref else None
    return LevelResult(concurrency=c, runs=(run,), median_output_tok_s=tok, median_total_tok_s=tok,
                       ttft_p99_ms=100.0 * c, failed_requests=0, baseline_median_output_tok_s=ref, ratio=ratio,
                       ci_low=ratio - 0.01 if ratio else None, ci_high=ratio + 0.01 if ratio else None,
                       verdict=verdict)  # type: ignore[arg-type]


def result(name: str, figures: dict[int, float], at: str, *, baseline: str | None = "baseline",
           host: dict[str, str] | None = None) -> GateResult:
    levels = []
    for c, tok in figures.items():
        ref = USERS["baseline"][c] if baseline else None
        verdict = "reference" if ref is None else ("pass" if tok / ref >= 0.95 else "fail")
        levels.append(_level(c, tok, ref, verdict))
    overall = "reference" if baseline is None else ("pass" if all(lv.verdict == "pass" for lv in levels) else "fail")
    reasons = tuple(f"C={lv.concurrency}: slower than the incumbent: ratio {lv.ratio:.3f}"
                    for lv in levels if lv.verdict == "fail")
    return GateResult(name=name, url="http://127.0.0.1:1", started_at=at, finished_at=at, workload=WL,
                      fingerprint=WL.fingerprint(), tolerance=0.05, host=host or {"gpu_model": "RTX PRO 6000",
                      "gpu_count": "8"}, baseline_name=baseline, levels=tuple(levels), verdict=overall,
                      reasons=reasons)  # type: ignore[arg-type]


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.db")


def test_users_numbers_give_the_users_conclusion(ledger: Ledger) -> None:
    ledger.record_gate(result("baseline", USERS["baseline"], "2026-11-01T00:00:00", baseline=None))
    ledger.record_gate(result("eagle3-topk4-v1", USERS["eagle3-topk4-v1"], "2026-11-02T00:00:00"))
    ledger.record_gate(result("eagle3-topk1-v2", USERS["eagle3-topk1-v2"], "2026-11-03T00:00:00"))
    (g,) = build_report(ledger.gate_runs(), ledger.deploys()).groups
    assert g.reference == "baseline" and g.host_class == "8x RTX PRO 6000"
    policy = [c for c in g.conclusion if c.startswith("**Speculation policy")]
    assert policy == [
        "**Speculation policy, eagle3-topk1-v2 vs baseline** (C=1 -6.4% [-6.4, -6.4], C=30 +10.1% [+10.1, +10.1], "
        "C=250 +5.1% [+5.1, +5.1]): crosses over at C≈3.7 (range 3.7–3.7 from the CIs, between measured C=1 and "
        "C=30): run baseline below C=4, eagle3-topk1-v2 from C=4. sglang has a built-in for switching by load: "
        "`--speculative-adaptive` (EAGLE/EAGLE3, topk 1) changes draft steps by batch size; offer it as a variant "
        "(`eagle3-topk1-v2-adaptive`) and gate it the same way.",
        "**Speculation policy, eagle3-topk4-v1 vs baseline** (C=1 -8.3% [-8.3, -8.3], C=30 -50.0% [-50.0, -50.0], "
        "C=250 -50.8% [-50.8, -50.8]): baseline is faster at every measured level (C=1..250); run baseline "
        "throughout.",
    ]
    assert [c for c in g.conclusion if c not in policy] == [
        "**Latency-sensitive single requests (C=1):** baseline, 92.7 tok/s; then eagle3-topk1-v2 86.8 (-6.4%), "
        "eagle3-topk4-v1 85.0 (-8.3%).",
        "**Throughput (C=250, the highest measured):** eagle3-topk1-v2, 754.4 tok/s; then baseline 718.1 (-4.8%), "
        "eagle3-topk4-v1 353.0 (-53.2%).",
        "**eagle3-topk1-v2** matches or beats baseline (within 5%) at every C >= 30 measured (C=1 86.8 vs 92.7, "
        "C=30 759.3 vs 689.4, C=250 754.4 vs 718.1): speculation pays from C=30 on; below it baseline is faster.",
        "**eagle3-topk4-v1** never pays against baseline (peak 353.0 tok/s, plateauing near 353 tok/s from C=30; "
        "C=1 85.0 vs 92.7, C=30 345.0 vs 689.4, C=250 353.0 vs 718.1) and fails the gate at C=1, C=30, C=250: "
        "do not deploy it; keep baseline or a speculative configuration that passes.",
    ]
    md = render_markdown(build_report(ledger.gate_runs(), ledger.deploys()))
    assert "| baseline | Reference | **92.7** |  |" in md
    assert ("| eagle3-topk1-v2 | FAILED | **86.8** | C=1: slower than the incumbent: ratio 0.936; vs baseline: "
            "C=1 -6.4%, C=30 +10.1%, C=250 +5.1% |") in md
    assert "| eagle3-topk1-v2 | 86.8 (-6.4%, FAILED) | 759.3 (+10.1%, PASS) | 754.4 (+5.1%, PASS) |" in md


def test_speculation_that_stops_paying_recommends_adaptive(ledger: Ledger) -> None:
    ledger.record_gate(result("baseline", USERS["baseline"], "2026-11-01T00:00:00", baseline=None))
    ledger.record_gate(result("eagle3-early", {1: 100.0, 30: 700.0, 250: 500.0}, "2026-11-02T00:00:00"))
    (g,) = build_report(ledger.gate_runs(), ledger.deploys()).groups
    assert g.conclusion[-1] == (
        "**Speculation policy, eagle3-early vs baseline** (C=1 +7.9% [+7.9, +7.9], C=30 +1.5% [+1.5, +1.5], "
        "C=250 -30.4% [-30.4, -30.4]): crosses over at C≈33 (range 33–33 from the CIs, between measured C=30 and "
        "C=250): eagle3-early stops paying; run baseline from C=33.")
    assert g.conclusion[-2] == (
        "**eagle3-early** pays up to C=30 and stops paying at C=250 (C=1 100.0 vs 92.7, C=30 700.0 vs 689.4, "
        "C=250 500.0 vs 718.1): use `--speculative-adaptive` (EAGLE/EAGLE3 with topk 1) or disable speculation "
        "above C=30.")


def test_newer_result_supersedes_older_on_the_same_fingerprint(ledger: Ledger) -> None:
    ledger.record_gate(result("baseline", USERS["baseline"], "2026-11-01T00:00:00", baseline=None))
    ledger.record_gate(result("eagle3-topk1-v2", {1: 54.1, 30: 400.0, 250: 380.0}, "2026-11-02T00:00:00"))
    ledger.record_gate(result("eagle3-topk1-v2", USERS["eagle3-topk1-v2"], "2026-11-03T00:00:00"))
    (g,) = build_report(ledger.gate_runs(), ledger.deploys()).groups
    assert [(r.config, r.status, r.tok_s) for r in g.rows] == [
        ("baseline", "Reference", 92.7), ("eagle3-topk1-v2", "FAILED", 86.8), ("eagle3-topk1-v2", "SUPERSEDED", 54.1)]
    assert g.rows[2].notes == "was FAILED; replaced by run #3 of 2026-11-03T00:00:00"
    assert g.cells["eagle3-topk1-v2"][30].tok_s == 759.3  # the conclusion uses the newer numbers
    assert "759.3 vs 689.4" in g.conclusion[2]


def test_incomparable_results_stay_apart(ledger: Ledger) -> None:
    ledger.record_gate(result("baseline", USERS["baseline"], "2026-11-01T00:00:00", baseline=None))
    other = result("baseline", {1: 50.0, 30: 300.0, 250: 320.0}, "2026-11-02T00:00:00", baseline=None,
                   host={"gpu_model": "RTX 5090", "gpu_count": "1"})
    ledger.record_gate(other)
    groups = build_report(ledger.gate_runs(), ledger.deploys()).groups
    assert sorted(g.host_class for g in groups) == ["1x RTX 5090", "8x RTX PRO 6000"]
    assert all(len(g.rows) == 1 for g in groups)


def test_failed_and_refused_deploys_become_rows(ledger: Ledger) -> None:
    ledger.record_gate(result("baseline", USERS["baseline"], "2026-11-01T00:00:00", baseline=None))
    fp = WL.fingerprint()
    ledger.record_deploy(host="root@gpu", stack="cuda13", variant="nccl-tree", image="i", strategy="swap",
                         outcome="rolled-back", crash_signature="cuda-graph-capture",
                         cause="CUDA graph capture failed", fingerprint=fp, host_class="8x RTX PRO 6000")
    ledger.record_deploy(host="root@gpu", stack="cuda13", variant="few-channels", image="i", strategy="swap",
                         outcome="refused", cause="lock held by pid 7", fingerprint=fp)
    (g,) = build_report(ledger.gate_runs(), ledger.deploys()).groups
    assert [(r.config, r.status, r.notes) for r in g.rows] == [
        ("baseline", "Reference", ""),
        ("cuda13-few-channels", "UNTESTED", "deploy refused: lock held by pid 7"),
        ("cuda13-nccl-tree", "FAILED", "deploy rolled-back: cuda-graph-capture (CUDA graph capture failed)"),
    ]


def test_report_command_writes_markdown_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "l.db"
    with Ledger(db) as ledger:
        ledger.record_gate(result("baseline", USERS["baseline"], "2026-11-01T00:00:00", baseline=None))
        ledger.record_gate(result("eagle3-topk1-v2", USERS["eagle3-topk1-v2"], "2026-11-03T00:00:00"))
    assert main(["report", "--ledger", str(db), "--no-plot"]) == 0
    assert capsys.readouterr().out.strip() == f"report: {tmp_path / 'report.md'}"
    assert "**Conclusion for deployment strategy:**" in (tmp_path / "report.md").read_text()
    assert main(["report", "--ledger", str(db), "--json"]) == 0
    import json

    data = json.loads(capsys.readouterr().out)
    assert data["groups"][0]["reference"] == "baseline"
    assert main(["report", "--ledger", str(tmp_path / "none.db")]) == 2
    assert "no ledger yet" in capsys.readouterr().err


def test_per_variant_table_has_medians_ci_runs_and_verdicts(ledger: Ledger) -> None:
    ledger.record_gate(result("baseline", USERS["baseline"], "2026-11-01T00:00:00", baseline=None))
    ledger.record_gate(result("eagle3-topk4-v1", USERS["eagle3-topk4-v1"], "2026-11-02T00:00:00"))
    md = render_markdown(build_report(ledger.gate_runs(), ledger.deploys()))
    lines = md.splitlines()
    start = lines.index("**eagle3-topk4-v1** vs baseline, per concurrency:")
    assert lines[start + 2:start + 7] == [
        "| C | baseline tok/s | eagle3-topk4-v1 tok/s | ratio | CI | TTFT p99 ms (ref / this) | runs | gate |",
        "|---|---|---|---|---|---|---|---|",
        "| 1 | 92.7 | 85.0 | 0.917 | [0.907, 0.927] | 100.0 / 100.0 | 1 | FAILED |",
        "| 30 | 689.4 | 345.0 | 0.500 | [0.490, 0.510] | 3000.0 / 3000.0 | 1 | FAILED |",
        "| 250 | 718.1 | 353.0 | 0.492 | [0.482, 0.502] | 25000.0 / 25000.0 | 1 | FAILED |",
    ]
    assert "**baseline** vs" not in md  # the reference gets no table against itself


def test_builds_section_links_each_image_to_its_latest_deploy() -> None:
    from stackbuild.results.ledger import BuildRecord, DeployRecord

    def build(i: int, at: str, variant: str | None, image: str, digest: str | None) -> BuildRecord:
        return BuildRecord(id=i, recorded_at=at, stack="cuda13", variant=variant, image=image, digest=digest,
                           content_hash=f"{i}" * 64, lock={"sglang": "0.5.23"})

    def deploy(i: int, at: str, digest: str, outcome: str) -> DeployRecord:
        return DeployRecord(id=i, recorded_at=at, host="root@gpu1", stack="cuda13", variant=None, config="cuda13",
                            image="r/sb:cuda13-aaa", digest=digest, strategy="swap", outcome=outcome,
                            crash_signature=None, durations={}, downtime_s=None, cause=None, fingerprint=None,
                            host_class=None)

    builds = [build(1, "2026-11-01T00:00:00", None, "r/sb:cuda13-aaa", "sha256:a"),
              build(2, "2026-11-02T00:00:00", "eagle3-topk1", "r/sb:cuda13-eagle3-topk1-bbb", None)]
    deploys = [deploy(1, "2026-11-01T01:00:00", "sha256:a", "rolled-back"),
               deploy(2, "2026-11-01T02:00:00", "sha256:a", "promoted"),
               deploy(3, "2026-11-01T03:00:00", "sha256:a", "rolled-back")]
    report = build_report([], deploys, builds)
    assert [(b.config, b.deployed) for b in report.builds] == [
        ("cuda13-eagle3-topk1", "not deployed"),
        ("cuda13", "promoted on root@gpu1 as cuda13 (other deploys: 2 rolled-back)")]
    text = render_markdown(report)
    assert text.split("## Builds\n\n", 1)[1] == (
        "| config | image | digest | deployed | built |\n|---|---|---|---|---|\n"
        "| cuda13-eagle3-topk1 | `r/sb:cuda13-eagle3-topk1-bbb` | not pushed | not deployed | 2026-11-02T00:00:00 |\n"
        "| cuda13 | `r/sb:cuda13-aaa` | `sha256:a` | promoted on root@gpu1 as cuda13 (other deploys: 2 rolled-back) "
        "| 2026-11-01T00:00:00 |\n")
    assert report.to_json()["builds"][1]["digest"] == "sha256:a"


def test_results_table_says_why_under_a_per_level_policy(ledger: Ledger) -> None:
    ledger.record_gate(result("baseline", USERS["baseline"], "2026-11-01T00:00:00", baseline=None))
    res = result("eagle3-topk1-v2", USERS["eagle3-topk1-v2"], "2026-11-03T00:00:00")
    bars = {1: 0.92, 30: 1.0, 250: 1.0}
    levels = tuple(lv.model_copy(update={"bar": bars[lv.concurrency], "verdict": "pass"}) for lv in res.levels)
    ledger.record_gate(res.model_copy(update={"levels": levels, "verdict": "pass", "reasons": ()}))
    md = render_markdown(build_report(ledger.gate_runs(), ledger.deploys()))
    assert ("| eagle3-topk1-v2 | PASS | **86.8** | vs baseline: C=1 -6.4% (allowed -8%: PASS), "
            "C=30 +10.1% (must not lose: PASS), C=250 +5.1% (must not lose: PASS) |") in md
    assert ("| eagle3-topk1-v2 | 86.8 (-6.4%, allowed -8%: PASS) | 759.3 (+10.1%, must not lose: PASS) "
            "| 754.4 (+5.1%, must not lose: PASS) |") in md


def test_notes_cut_at_a_word_and_never_inside_a_bracket() -> None:
    from stackbuild.results.report import _clip

    assert _clip("short cause\nsecond line") == "short cause"
    cause = "candidate crashed on start (" + "x " * 100 + ")"
    assert _clip(cause, 40) == "candidate crashed on start …"
    assert _clip("a " * 30, 20) == "a a a a a a a a a a …"


def test_a_plot_only_where_there_is_a_curve(tmp_path: Path) -> None:
    """Throughput and TTFT against concurrency: with one level measured the plot would be one point a
    series (the table's own numbers), so none is drawn and the report links none; from two levels on, one."""
    from stackbuild.results.writer import write_report

    one, two = tmp_path / "one", tmp_path / "two"
    for root, levels in ((one, (1,)), (two, (1, 30))):
        with Ledger(root / "ledger.db") as db:
            for name, at, base in (("baseline", "2026-11-01T00:00:00", None),
                                   ("eagle3-topk1-v2", "2026-11-03T00:00:00", "baseline")):
                db.record_gate(result(name, {c: USERS[name][c] for c in levels}, at, baseline=base))
            out = write_report(db, root / "report.md")
            report = build_report(db.gate_runs(), db.deploys())
        plots = sorted(p.name for p in root.iterdir() if p.name.startswith("report-throughput"))
        if levels == (1,):
            assert (plots, out.read_text()) == ([], render_markdown(report, None))
        else:
            assert plots == ["report-throughput.png", "report-throughput.svg"]
            assert out.read_text() == render_markdown(report, "report-throughput.svg")
