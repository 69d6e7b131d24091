"""Traffic weights from /metrics and the traffic-weighted verdict (pure parts exact; one
sampling run against the simulator under a known load)."""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
from pathlib import Path

import pytest

from stackbuild.cli.main import main
from stackbuild.gate.checks import traffic_verdict
from stackbuild.gate.decide import judge_level, level_summary, overall
from stackbuild.gate.traffic import (
    in_flight,
    nearest_level,
    parse_duration,
    parse_metrics,
    weighted_change,
    weights,
)
from stackbuild.spec.profile import GateProfile

METRICS = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",engine_type="unified",tp_rank="0"} 6.0
sglang:num_queue_reqs{model_name="m",engine_type="unified",tp_rank="0"} 2.0
sglang:gen_throughput{model_name="m"} 123.5
"""


def test_parse_metrics_and_in_flight() -> None:
    m = parse_metrics(METRICS)
    assert m["sglang:num_running_reqs"] == 6.0 and in_flight(m) == 8.0
    assert in_flight({"other": 1.0}) is None


def test_durations() -> None:
    assert [parse_duration(x) for x in ("10m", "30s", "1h", "90")] == [600, 30, 3600, 90]
    for bad in ("", "10x", "-1m", "0s"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration(bad)


def test_weights_map_samples_to_the_nearest_level_in_log_space() -> None:
    assert nearest_level(5, (1, 8)) == 8 and nearest_level(2, (1, 8)) == 1
    assert nearest_level(400, (1, 30, 250)) == 250
    w, idle = weights([0, 0, 1, 1, 2, 7, 9, 30], (1, 8))
    assert idle == 0.25 and w == {1: 0.5, 8: 0.5}
    assert weights([], (1,)) == ({}, 1.0) and weights([0, 0], (1,)) == ({}, 1.0)


def test_weighted_change_weights_ratios_by_time_share() -> None:
    """The change over time: each level's ratio times its share of time, not its tok/s. At
    C=1 (75% of the time) -7%, at C=8 +50%: +7.25% (weighted by tok/s, with C=8 serving 4x
    the tokens, it would read +25.6%)."""
    per = {1: (math.log(0.93), 0.0, 5.0), 8: (math.log(1.5), 0.0, 5.0)}
    change, lo, hi = weighted_change(per, {1: 0.75, 8: 0.25})
    assert change == pytest.approx(0.75 * 0.93 + 0.25 * 1.5 - 1) and lo == hi == change
    with pytest.raises(ValueError, match="no measured level"):
        weighted_change(per, {30: 1.0})
    # one level, se 1% on the log, df 4: the t interval
    c, lo, hi = weighted_change({1: (0.0, 0.01, 4.0)}, {1: 1.0})
    assert c == 0.0 and hi == pytest.approx(2.776445 * 0.01, rel=1e-4) and lo == -hi


def _judged(prof: GateProfile, cand1: float, cand8: float) -> list:  # type: ignore[type-arg]
    from test_gate_stats import _run

    return [judge_level(level_summary(c, [_run(x), _run(x * 1.002), _run(x * 0.998)]),
                        [inc, inc * 1.001, inc * 0.999], prof, final=True)
            for c, x, inc in ((1, cand1, 100.0), (8, cand8, 400.0))]


def test_traffic_verdict_from_judged_levels() -> None:
    prof = GateProfile(concurrency=(1, 8), traffic={1: 3.0, 8: 1.0, 30: 5.0}, runs=3, max_runs=3,
                       session_drift=0.0)
    tr = traffic_verdict(_judged(prof, 93.0, 600.0), prof)
    assert tr is not None and tr.weights == {1: 0.75, 8: 0.25}  # C=30 was not measured
    assert tr.change == pytest.approx(0.75 * 0.93 + 0.25 * 1.5 - 1, abs=1e-4)
    assert tr.ci_low < tr.change < tr.ci_high and tr.verdict is None  # levels decide
    assert traffic_verdict(_judged(prof, 93.0, 600.0)[:1], GateProfile()) is None


def test_traffic_decides_when_asked() -> None:
    prof = GateProfile(concurrency=(1, 8), traffic={1: 0.75, 8: 0.25}, runs=3, max_runs=3,
                       session_drift=0.0, tolerance=0.0, decide_on="traffic")
    levels = _judged(prof, 93.0, 600.0)  # C=1 loses 7%: it would fail "must not lose"
    assert [lv.verdict for lv in levels] == ["fail", "pass"] and not any(lv.required for lv in levels)
    tr = traffic_verdict(levels, prof)
    assert tr is not None and tr.verdict == "pass" and tr.bar == 0.98
    assert tr.explanation.startswith("on traffic (C=1 75%, C=8 25%): expected +7.2% (95% CI ")
    assert tr.explanation.endswith("must not lose (margin 2%): pass")
    assert overall(levels, [], None, compared=True, traffic=tr, traffic_decides=True) == "pass"
    # mostly at C=1 now: the loss there decides
    slow = prof.with_overrides(traffic={1: 0.95, 8: 0.05})
    tr2 = traffic_verdict(levels, slow)
    assert tr2 is not None and tr2.verdict == "fail"
    assert overall(levels, [], None, compared=True, traffic=tr2, traffic_decides=True) == "fail"
    assert overall(levels, [], None, compared=True, traffic=None, traffic_decides=True) == "inconclusive"


@pytest.mark.integration
def test_traffic_command_samples_a_loaded_server(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from helpers_http import http

    from stackbuild.sim.process import sim

    # --speed 0.1: 400 tokens take far longer than the wait for all 8 plus the 2 s sampled (at 0.5
    # the first requests, started seconds before the last on a loaded machine, ended inside it)
    with sim("--speed", "0.1", "--enable-metrics") as s:
        body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 400}}
        def hold() -> None:
            with contextlib.suppress(OSError):  # cut when the simulator stops
                http(s.url + "/generate", body)

        threads = [threading.Thread(target=hold, daemon=True) for _ in range(8)]
        for t in threads:
            t.start()
        # sample once all 8 are in flight: threads start late on a loaded machine
        deadline = time.monotonic() + 20
        while (in_flight(parse_metrics(http(s.url + "/metrics")[1].decode())) or 0) < 8:
            assert time.monotonic() < deadline, "the 8 requests never were in flight together"
            time.sleep(0.05)
        rc = main(["traffic", "--url", s.url, "--for", "2s", "--every", "0.25",
                   "--concurrency", "1,8,64", "--out", str(tmp_path / "t.json")])
    assert rc == 0
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["samples"] >= 4 and data["weights"] == {"8": 1.0}
    assert json.loads(capsys.readouterr().out) == data
