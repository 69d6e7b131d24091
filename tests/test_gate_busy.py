"""A side with clients of its own: counted from its /metrics and said beside the level's verdict.

The counting and the sentences are pure (exact); one gate over HTTP against two simulators, first
with the incumbent quiet, then with clients of its own, shows the count comes from the servers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stackbuild.cli.main import main
from stackbuild.effects.prometheus import finished_requests, outside_requests
from stackbuild.gate.background import BackgroundLoad
from stackbuild.gate.decide import busy_notes
from stackbuild.sim.process import sim

METRICS = """# TYPE sglang:num_requests_total counter
sglang:num_requests_total{model_name="m",is_streaming="true"} 40.0
sglang:num_requests_total{model_name="m",is_streaming="false"} 2.0
"""

QUIET = ("for a comparison on equal terms, gate while the incumbent is quiet or drained from its gateway, "
         "or against a result of it measured quiet")


def test_finished_requests_sum_the_counter_over_its_labels() -> None:
    assert finished_requests(METRICS) == 42.0
    # declared, no request finished yet: a labelled counter has no sample until its first one
    assert finished_requests("# HELP sglang:num_requests_total Number of requests processed.\n"
                             "# TYPE sglang:num_requests_total counter\n") == 0.0
    assert finished_requests("sglang:num_running_reqs 3\n") is None


def test_outside_requests_are_the_counter_less_the_own() -> None:
    assert outside_requests(100.0, 160.0, 48) == 12
    assert outside_requests(100.0, 148.0, 48) == 0
    # an own request the server had not counted yet reads low, never as someone else's
    assert outside_requests(100.0, 146.0, 48) == 0
    assert outside_requests(None, 148.0, 48) is None and outside_requests(100.0, None, 0) is None


def test_busy_notes_say_which_side_gains() -> None:
    assert busy_notes(8, mine=0, theirs=0, live=True, compared=True) == ()
    assert busy_notes(8, mine=None, theirs=None, live=True, compared=True) == ()
    assert busy_notes(1, mine=0, theirs=12, live=True, compared=True) == (
        "C=1: the incumbent finished 12 request(s) of other clients during this level: a busy incumbent "
        f"reads slower, so the candidate gains; {QUIET}",)
    assert busy_notes(1, mine=None, theirs=3, live=False, compared=True) == (
        "C=1: the incumbent finished 3 request(s) of other clients while its stored runs were measured: a "
        f"busy incumbent reads slower, so the candidate gains; {QUIET}",)
    assert busy_notes(8, mine=5, theirs=None, live=False, compared=True) == (
        "C=8: the measured server finished 5 request(s) of other clients during this level: it reads slower "
        "than it would alone, so the incumbent gains",)
    # a reference: nothing to compare yet; what it read goes into every later comparison with it
    assert busy_notes(8, mine=5, theirs=7, live=False, compared=False) == (
        "C=8: the measured server finished 5 request(s) of other clients during this level: it reads slower "
        "than it would alone, so a candidate compared with this result gains",)


@pytest.mark.integration
def test_a_gate_counts_the_incumbents_own_clients_and_says_so(tmp_path: Path) -> None:
    args = ["--concurrency", "8", "--input-len", "32", "--output-len", "160", "--runs", "3", "--max-runs", "4",
            "--warmup", "1", "--no-progress"]
    with sim("--speed", "4", "--enable-metrics") as inc, sim("--speed", "4", "--enable-metrics") as cand:
        def gate(name: str) -> dict[str, object]:
            main(["gate", "--url", cand.url, "--baseline-url", inc.url, *args, "--json", str(tmp_path / name)])
            level: dict[str, object] = json.loads((tmp_path / name).read_text())["levels"][0]
            return level

        quiet = gate("quiet.json")
        # the incumbent's own clients, 2 at a time, going before the gate starts and until it ends
        with BackgroundLoad(inc.url, clients=2, pause_s=0.05) as load:
            assert load.wait_for(5, 60), load.summary()
            busy = gate("busy.json")
        assert load.failed == 0, load.summary()
    # the gate's own requests are never someone else's: both sides quiet, nothing counted
    assert (quiet["outside_requests"], quiet["incumbent_outside_requests"]) == (0, 0)
    assert not [r for r in quiet["reasons"] if "other clients" in r]  # type: ignore[union-attr]
    assert busy["outside_requests"] == 0
    n = busy["incumbent_outside_requests"]
    assert isinstance(n, int) and 0 < n <= load.sent, (n, load.summary())
    assert (f"C=8: the incumbent finished {n} request(s) of other clients during this level: a busy incumbent "
            f"reads slower, so the candidate gains; {QUIET}") in busy["reasons"]  # type: ignore[operator]
