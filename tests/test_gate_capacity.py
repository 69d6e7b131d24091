"""Capacity under an SLO: parsing, the bounded search (with a fake measurement), each probed
level's bootstrap interval over requests, the capacity's interval, goodput, the comparison."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable

import pytest
from test_gate_stats import _run

from stackbuild.gate.capacity import GRID, goodput, judge_step, parse_slo, search
from stackbuild.gate.checks import judge_capacity
from stackbuild.gate.loadgen import RequestRecord
from stackbuild.gate.result import RunMetrics


def test_parse_slo() -> None:
    assert parse_slo("ttft_p99_ms=2000, itl_p99_ms=50") == {"ttft_p99_ms": 2000.0,
                                                           "itl_p99_ms": 50.0}
    for bad in ("", "ttft=1", "itl_p99_ms=0", "itl_p99_ms=x", "itl_p99_ms"):
        with pytest.raises(ValueError, match=r"KEY=MS|no SLO"):
            parse_slo(bad)


def _req(ttft_ms: float, gap_ms: float, tokens: int = 10, ok: bool = True) -> RequestRecord:
    t0 = ttft_ms / 1000
    times = [t0 + i * gap_ms / 1000 for i in range(tokens)]
    return RequestRecord(ok=ok, start=0.0, end=times[-1], ttft=t0, chunk_times=times,
                         output_tokens=tokens)


def _level(c: int, reqs: list[RequestRecord]) -> tuple[RunMetrics, list[RequestRecord]]:
    failed = sum(not r.ok for r in reqs)
    return _run(100.0, failed=failed).model_copy(update={"concurrency": c}), reqs


def test_search_is_bounded_and_finds_the_last_level_that_holds() -> None:
    probed: list[int] = []

    async def measure(c: int) -> tuple[RunMetrics, list[RequestRecord]]:
        probed.append(c)
        return _level(c, [_req(10.0, 10.0 + c) for _ in range(32)])  # itl <= 40 holds to C=30

    res = asyncio.run(search(measure, {"itl_p99_ms": 40.0}, 512))
    assert (res.concurrency, res.next_concurrency) == (24, 32)
    # every request alike: the intervals are points, and so is the capacity's
    assert (res.concurrency_low, res.concurrency_high) == (24, 24)
    assert res.interval_text() == "C=24 (C=24..24)"
    assert res.goodput_tok_s == res.goodput_low == res.goodput_high == pytest.approx(32 * 10 / 1.0)
    assert res.runs == len(probed) <= math.ceil(math.log2(len(GRID))) + 1
    assert len(set(probed)) == len(probed)
    assert "C=32: itl_p99_ms 42.0 > 40" in res.tried
    none = asyncio.run(search(measure, {"itl_p99_ms": 5.0}, 512))
    assert none.concurrency == 0 and none.runs == 1 and none.concurrency_high == 0
    capped = asyncio.run(search(measure, {"itl_p99_ms": 1e9}, 100))
    assert capped.concurrency == 96 and capped.next_concurrency is None
    assert capped.concurrency_high == 96


def test_one_slow_request_widens_the_interval_instead_of_deciding() -> None:
    """At C=16 five requests in 400 miss the TTFT SLO: its p99 breaks the SLO by the point
    estimate, but the order-statistic interval reaches below the SLO, so C=16 is not shown
    broken and the capacity's high end reaches past it, to just below the first level that
    surely breaks. With 32 requests a level no order statistic bounds a p99 from above, so
    nothing surely holds."""
    def measure_with(n: int) -> Callable[[int], Awaitable[tuple[RunMetrics, list[RequestRecord]]]]:
        async def measure(c: int) -> tuple[RunMetrics, list[RequestRecord]]:
            if c < 16:
                return _level(c, [_req(100.0, 5.0) for _ in range(n)])
            if c == 16:
                return _level(c, [_req(100.0, 5.0) for _ in range(n - 5)] +
                              [_req(3000.0, 5.0) for _ in range(5)])
            return _level(c, [_req(3000.0, 5.0) for _ in range(n)])
        return measure

    res = asyncio.run(search(measure_with(400), {"ttft_p99_ms": 2000.0}, 512))
    assert res.concurrency == 12 and res.next_concurrency == 16
    assert (res.concurrency_low, res.concurrency_high) == (12, 24)
    thin = asyncio.run(search(measure_with(32), {"ttft_p99_ms": 2000.0}, 512))
    assert thin.concurrency == 12 and thin.concurrency_low == 0
    assert "C=16: ttft_p99_ms 3000.0 > 2000" in res.tried


def test_step_intervals_and_failed_requests() -> None:
    slo = {"itl_p99_ms": 50.0, "ttft_p99_ms": 1000.0}
    run, reqs = _level(8, [_req(900.0, 60.0) for _ in range(8)] + [_req(10.0, 1.0, ok=False)])
    step = judge_step(8, run, reqs, slo)
    assert step.said(slo) == "C=8: itl_p99_ms 60.0 > 50; 1 failed requests"
    assert step.surely_broken and not step.holds and not step.surely_holds
    # 8 requests: x_(7) bounds the p99 from below at 97.5% (P(B >= 7) = 0.997), nothing from
    # above (P(B <= 7) = 1 - 0.99^8 = 0.077)
    assert step.p99["ttft_p99_ms"] == (900.0, 900.0, math.inf)


def test_goodput_counts_the_requests_that_met_every_slo() -> None:
    fast = RequestRecord(ok=True, start=0.0, end=1.0, ttft=0.1, output_tokens=10,
                         chunk_times=[0.1 + 0.1 * i for i in range(10)])
    slow = RequestRecord(ok=True, start=0.0, end=2.0, ttft=1.5, output_tokens=10,
                         chunk_times=[1.5 + 0.05 * i for i in range(10)])
    failed = RequestRecord(ok=False, output_tokens=10)
    assert goodput([fast, slow, failed], {"ttft_p99_ms": 1000.0}, 2.0) == 5.0
    assert goodput([fast, slow], {"itl_p99_ms": 60.0}, 2.0) == 5.0


def test_comparison_fails_only_when_asked_and_the_intervals_part() -> None:
    async def cand(c: int) -> tuple[RunMetrics, list[RequestRecord]]:
        return _level(c, [_req(10.0, float(c)) for _ in range(16)])

    a = asyncio.run(search(cand, {"itl_p99_ms": 10.0}, 512))
    b = asyncio.run(search(cand, {"itl_p99_ms": 20.0}, 512))
    lower = judge_capacity(a, b, required=True)
    assert not lower.passed and lower.goodput_ratio == pytest.approx(1.0)
    assert "C=8 (C=8..8) (160.0 tok/s goodput) is below the incumbent's C=16 (C=16..16)" \
        in lower.reasons[0]
    assert judge_capacity(a, b, required=False).passed
    assert judge_capacity(b, None, required=True).incumbent is None
    # overlapping intervals: not shown lower, so not failed
    wide = a.model_copy(update={"concurrency_high": 16})
    assert judge_capacity(wide, b, required=True).passed
