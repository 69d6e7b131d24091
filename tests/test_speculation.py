"""Crossover concurrency with its uncertainty, and the traffic sentence of the policy."""

from __future__ import annotations

import math

import pytest
from test_report import USERS, result

from stackbuild.gate.result import TrafficResult
from stackbuild.results.speculation import Point, crossings, policy


def test_crossing_interpolates_in_log_c_and_brackets_it_with_the_ci() -> None:
    pts = [Point(1, 0.9, 0.85, 0.95), Point(8, 1.2, 1.1, 1.3)]
    (c,) = crossings(pts)
    # ratio 0.9 -> 1.2 over log 1 -> log 8: crosses a third of the way, at 8**(1/3) = 2
    assert c.rising and c.at == pytest.approx(2.0) and c.between == (1, 8)
    # the optimistic bound (0.95 -> 1.3) crosses at 8**(0.05/0.35), the pessimistic at 8**(0.15/0.25)
    assert c.low == pytest.approx(8 ** (0.05 / 0.35)) and c.high == pytest.approx(8 ** 0.6)
    assert crossings([Point(1, 1.1, 1.0, 1.2), Point(8, 1.3, 1.2, 1.4)]) == []
    (down,) = crossings([Point(30, 1.1, 1.05, 1.15), Point(250, 0.7, 0.65, 0.75)])
    assert not down.rising and math.isclose(down.at, math.exp(math.log(30) + 0.25 * math.log(250 / 30)))


def test_policy_says_who_wins_on_the_measured_traffic() -> None:
    ref = result("baseline", USERS["baseline"], "2026-11-01T00:00:00", baseline=None)
    spec = result("eagle3-topk1-v2", USERS["eagle3-topk1-v2"], "2026-11-02T00:00:00")
    spec = spec.model_copy(update={"traffic": TrafficResult(weights={1: 0.2, 30: 0.8}, change=0.054,
                                                            ci_low=0.031, ci_high=0.077)})
    said = policy("eagle3-topk1-v2", spec, "baseline", ref)
    assert said is not None
    assert ("On the measured traffic (C=1 20%, C=30 80%) eagle3-topk1-v2 changes output throughput by "
            "+5.4% (CI +3.1%..+7.7%): eagle3-topk1-v2 wins overall.") in said
