"""Traffic weights from /metrics and the traffic-weighted verdict (pure parts exact; one
sampling run against the simulator under a known load)."""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path

import pytest

from stackbuild.cli.main import main
from stackbuild.gate.checks import traffic_verdict
from stackbuild.gate.runner import judge_level, level_summary
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


def test_weighted_change_and_its_ci() -> None:
    per = {1: ([93.0, 93.0, 93.0], [100.0, 100.0, 100.0]),
           8: ([150.0, 150.0, 150.0], [100.0, 100.0, 100.0])}
    change, lo, hi = weighted_change(per, {1: 0.75, 8: 0.25})
    assert change == pytest.approx((0.75 * 93 + 0.25 * 150) / 100 - 1) and lo == hi == change
    with pytest.raises(ValueError, match="no measured level"):
        weighted_change(per, {30: 1.0})
    noisy = {1: ([90.0, 95.0, 100.0], [99.0, 100.0, 101.0])}
    c, lo, hi = weighted_change(noisy, {1: 1.0})
    assert lo < c < hi


def test_traffic_verdict_from_judged_levels() -> None:
    from test_gate_stats import _run

    prof = GateProfile(concurrency=(1, 8), traffic={1: 3.0, 8: 1.0, 30: 5.0})
    c1 = judge_level(level_summary(1, [_run(93.0), _run(93.0)]), [100.0, 100.0], prof, final=True)
    c8 = judge_level(level_summary(8, [_run(150.0), _run(150.0)]), [100.0, 100.0], prof,
                     final=True)
    tr = traffic_verdict([c1, c8], prof)
    assert tr is not None and tr.weights == {1: 0.75, 8: 0.25}  # C=30 was not measured
    assert tr.change == pytest.approx(0.0725)  # (0.75*93 + 0.25*150) / 100 - 1
    assert traffic_verdict([c1], GateProfile()) is None


@pytest.mark.integration
def test_traffic_command_samples_a_loaded_server(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from helpers_http import http

    from stackbuild.sim.process import sim

    with sim("--speed", "0.5", "--enable-metrics") as s:
        body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 400}}
        def hold() -> None:
            with contextlib.suppress(OSError):  # cut when the simulator stops
                http(s.url + "/generate", body)

        threads = [threading.Thread(target=hold, daemon=True) for _ in range(8)]
        for t in threads:
            t.start()
        rc = main(["traffic", "--url", s.url, "--for", "2s", "--every", "0.25",
                   "--concurrency", "1,8,64", "--out", str(tmp_path / "t.json")])
    assert rc == 0
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["samples"] >= 4 and data["weights"] == {"8": 1.0}
    assert json.loads(capsys.readouterr().out) == data
