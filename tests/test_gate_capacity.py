"""Capacity under an SLO: parsing, the bounded search (with a fake measurement), goodput,
the comparison, and one search against the simulator checked against its model."""

from __future__ import annotations

import asyncio
import math

import pytest
from test_gate_stats import _run

from stackbuild.gate.capacity import GRID, goodput, parse_slo, search, violations
from stackbuild.gate.checks import judge_capacity
from stackbuild.gate.loadgen import RequestRecord
from stackbuild.gate.result import Percentiles, RunMetrics


def test_parse_slo() -> None:
    assert parse_slo("ttft_p99_ms=2000, itl_p99_ms=50") == {"ttft_p99_ms": 2000.0,
                                                           "itl_p99_ms": 50.0}
    for bad in ("", "ttft=1", "itl_p99_ms=0", "itl_p99_ms=x", "itl_p99_ms"):
        with pytest.raises(ValueError, match=r"KEY=MS|no SLO"):
            parse_slo(bad)


def _at(c: int, itl: float, tok_s: float = 100.0) -> RunMetrics:
    return _run(tok_s).model_copy(update={"concurrency": c, "itl_ms": Percentiles(p99=itl)})


def test_search_is_bounded_and_finds_the_last_level_that_holds() -> None:
    probed: list[int] = []

    async def measure(c: int) -> tuple[RunMetrics, float]:
        probed.append(c)
        return _at(c, itl=10.0 + c), 5.0 * c  # the SLO itl <= 40 holds up to C=30

    res = asyncio.run(search(measure, {"itl_p99_ms": 40.0}, 512))
    assert (res.concurrency, res.next_concurrency, res.goodput_tok_s) == (24, 32, 120.0)
    assert res.runs == len(probed) <= math.ceil(math.log2(len(GRID))) + 1
    assert len(set(probed)) == len(probed)
    assert "C=32: itl_p99_ms 42.0 > 40" in res.tried
    none = asyncio.run(search(measure, {"itl_p99_ms": 5.0}, 512))
    assert none.concurrency == 0 and none.runs == 1
    capped = asyncio.run(search(measure, {"itl_p99_ms": 1e9}, 100))
    assert capped.concurrency == 96 and capped.next_concurrency is None


def test_violations_and_goodput_per_request() -> None:
    run = _at(8, itl=60.0).model_copy(update={"ttft_ms": Percentiles(p99=900.0), "failed": 1})
    assert violations(run, {"itl_p99_ms": 50, "ttft_p99_ms": 1000}) == [
        "itl_p99_ms 60.0 > 50", "1 failed requests"]
    fast = RequestRecord(ok=True, start=0.0, end=1.0, ttft=0.1, output_tokens=10,
                         chunk_times=[0.1 + 0.1 * i for i in range(10)])
    slow = RequestRecord(ok=True, start=0.0, end=2.0, ttft=1.5, output_tokens=10,
                         chunk_times=[1.5 + 0.05 * i for i in range(10)])
    failed = RequestRecord(ok=False, output_tokens=10)
    assert goodput([fast, slow, failed], {"ttft_p99_ms": 1000.0}, 2.0) == 5.0
    assert goodput([fast, slow], {"itl_p99_ms": 60.0}, 2.0) == 5.0


def test_comparison_requires_capacity_only_when_asked() -> None:
    async def cand(c: int) -> tuple[RunMetrics, float]:
        return _at(c, itl=float(c)), 10.0 * c

    a = asyncio.run(search(cand, {"itl_p99_ms": 10.0}, 512))
    b = asyncio.run(search(cand, {"itl_p99_ms": 20.0}, 512))
    lower = judge_capacity(a, b, required=True)
    assert not lower.passed and lower.goodput_ratio == pytest.approx(80 / 160)
    assert "C=8 (80.0 tok/s goodput) is below the incumbent's C=16" in lower.reasons[0]
    assert judge_capacity(a, b, required=False).passed
    assert judge_capacity(b, None, required=True).incumbent is None
