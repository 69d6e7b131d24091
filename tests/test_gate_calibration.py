"""The gate's decisions and the report, fed the calibrated simulator's model: the users' conclusion.

Users' figures (seed-results.json, seeds/004): at C=1 baseline 92.7 vs topk1-v2 86.8
(speculation loses), topk1-v2 "matches or beats baseline at every C from 2" (C=30 689.4
vs 759.3, C=250 718.1 vs 754.4), topk4-v1 plateaus at ~353 (loses badly under load).
Tolerance 2%: the users read differences of a few percent as verdicts.

No clock and no server: each run's tok/s is the model's steady state (sim/model.py) times
a fixed spread of +-1%, so the verdicts are the gate's own logic (`judge_level`, its
sequential test against stored runs of the same session, `overall`) applied
to the model, at the last look (6 runs a side). That the gate over real HTTP measures what
the simulator serves is held by tests/test_gate_sim.py and measured by bench/gate_accuracy.py;
this file used to re-measure the whole sweep against live simulators (160 s of wall clock,
with verdicts at the mercy of a loaded 2-core machine at C=250).
"""

from __future__ import annotations

import re
import struct
from pathlib import Path
from xml.etree import ElementTree

import pytest

from stackbuild.gate.decide import design_for, judge_level, level_summary, overall
from stackbuild.gate.result import GateResult, Percentiles, RunMetrics
from stackbuild.results.ledger import Ledger
from stackbuild.results.report import build_report, render_markdown
from stackbuild.results.writer import write_report
from stackbuild.sim.calibration import PROFILES
from stackbuild.sim.model import steady_tok_s
from stackbuild.spec.profile import GateProfile

SWEEP = GateProfile(concurrency=(1, 2, 30, 250), input_len=32, output_len=128, runs=6, max_runs=6,
                    warmup=2, tolerance=0.02, requests_per_slot=4, min_requests=16, timeout_s=60)
SPREAD = (0.99, 1.0, 1.01, 0.995, 1.005, 1.0)  # run-to-run noise of about the size the real gate sees
P = Percentiles(mean=1, p50=1, p90=1, p99=1)


def runs(profile: str, c: int, slow: float = 1.0) -> list[RunMetrics]:
    tok_s = steady_tok_s(PROFILES[profile].as_measured(), c) / slow
    return [RunMetrics(concurrency=c, index=i, duration_s=1.0, completed=c, failed=0, input_tokens=32 * c,
                       output_tokens=round(tok_s * m), output_tok_s=tok_s * m, total_tok_s=tok_s * m,
                       ttft_ms=P, itl_ms=P, tpot_ms=P, e2e_ms=P) for i, m in enumerate(SPREAD)]


def gate(name: str, profile: str, at: str, *, baseline: GateResult | None = None,
         levels: tuple[int, ...] = SWEEP.concurrency, slow: float = 1.0) -> GateResult:
    judged = []
    for c in levels:
        inc = None if baseline is None else [r.output_tok_s for r in baseline.level(c).runs]  # type: ignore[union-attr]
        # the sweep is measured in one session: each baseline is fresh (no session drift)
        judged.append(judge_level(level_summary(c, runs(profile, c, slow)), inc, SWEEP, final=True,
                                  design=design_for(SWEEP, paired=False, fresh=True)))
    wl = SWEEP.workload()
    return GateResult(name=name, url="http://127.0.0.1:1", started_at=at, finished_at=at, workload=wl,
                      fingerprint=wl.fingerprint(), tolerance=SWEEP.tolerance, host={"gpu_model": "sim"},
                      baseline_name=None if baseline is None else baseline.name, levels=tuple(judged),
                      verdict=overall(judged, [], None, baseline is not None),
                      reasons=tuple(r for lv in judged for r in lv.reasons))


@pytest.fixture(scope="module")
def sweep() -> dict[str, GateResult]:
    base = gate("baseline", "baseline", "2026-11-01T00:00:01")
    return {
        # an older, slower build of topk1-v2 that the newer measurement supersedes
        "old-topk1": gate("eagle3-topk1-v2", "eagle3-topk1-v2", "2026-11-01T00:00:00", levels=(1, 30),
                          slow=1.5),
        "baseline": base,
        "eagle3-topk1-v2": gate("eagle3-topk1-v2", "eagle3-topk1-v2", "2026-11-01T00:00:02", baseline=base),
        "eagle3-topk4-v1": gate("eagle3-topk4-v1", "eagle3-topk4-v1", "2026-11-01T00:00:03", baseline=base),
    }


def test_sweep_reproduces_the_users_conclusion(sweep: dict[str, GateResult]) -> None:
    topk1, topk4 = sweep["eagle3-topk1-v2"], sweep["eagle3-topk4-v1"]
    assert {lv.concurrency: lv.verdict for lv in topk1.levels} == {1: "fail", 2: "pass", 30: "pass", 250: "pass"}
    assert topk1.verdict == "fail"
    c1 = topk1.levels[0]
    assert c1.ratio == pytest.approx(86.8 / 92.7, rel=1e-3) and c1.ci_confidence == pytest.approx(0.96875)
    assert topk1.reasons == (f"C=1: slower than the incumbent allows: ratio {c1.ratio:.3f}, 96.9% CI "
                             f"{(c1.ci_low - 1) * 100:+.1f}%..{(c1.ci_high - 1) * 100:+.1f}%, below "
                             "0.980 (allowed -2%)",)
    assert {lv.concurrency: lv.verdict for lv in topk4.levels} == {c: "fail" for c in SWEEP.concurrency}
    assert topk4.level(250).ratio == pytest.approx(353.0 / 718.1, rel=1e-3)  # type: ignore[union-attr]


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", head[16:24])


def test_report_from_the_sweep_states_the_users_conclusion(sweep: dict[str, GateResult], tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    with Ledger(db) as ledger:
        for key in ("old-topk1", "baseline", "eagle3-topk1-v2", "eagle3-topk4-v1"):
            ledger.record_gate(sweep[key])
        report = build_report(ledger.gate_runs(), ledger.deploys())
        out = write_report(ledger, tmp_path / "report.md")
    (group,) = report.groups
    assert group.reference == "baseline"
    text = out.read_text()
    assert text == render_markdown(report, "report-throughput.svg")
    concl = "\n".join(group.conclusion)
    assert "**Latency-sensitive single requests (C=1):** baseline, 92.7 tok/s; " in concl, concl
    assert "**Throughput (C=250, the highest measured):** eagle3-topk1-v2, 754.4 tok/s; " in concl, concl
    assert "**eagle3-topk1-v2** matches or beats baseline (within 2%) at every C >= 2 measured" in concl, concl
    m = re.search(r"\*\*eagle3-topk4-v1\*\* never pays against baseline \(peak (\d+\.\d) tok/s, plateauing "
                  r"near (\d+) tok/s from C=30;.*fails the gate at C=1, C=2, C=30, C=250", concl)
    assert m and m.group(2) == "353", concl
    # the older topk1-v2 row is kept, marked superseded; the conclusion uses the newer one
    statuses = [(r.config, r.status) for r in group.rows]
    assert statuses == [("baseline", "Reference"), ("eagle3-topk1-v2", "FAILED"), ("eagle3-topk4-v1", "FAILED"),
                        ("eagle3-topk1-v2", "SUPERSEDED")]
    assert group.cells["eagle3-topk1-v2"][250].ratio == sweep["eagle3-topk1-v2"].level(250).ratio  # type: ignore[union-attr]
    assert "| eagle3-topk1-v2 | SUPERSEDED |" in text
    # the plot: a valid SVG with one series per config, and a PNG
    svg = ElementTree.parse(tmp_path / "report-throughput.svg").getroot()
    ids = {el.get("id") for el in svg.iter() if el.get("id", "").startswith("series-")}
    assert {"series-baseline", "series-eagle3-topk1-v2", "series-eagle3-topk4-v1"} <= ids
    assert {"series-baseline-ttft", "series-eagle3-topk1-v2-ttft", "series-eagle3-topk4-v1-ttft"} <= ids
    width, height = _png_size(tmp_path / "report-throughput.png")
    assert width > 600 and height > 300
