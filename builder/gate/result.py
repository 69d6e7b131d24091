"""Gate results: the contract between the gate, the ledger, the report and deploy.

Results are written as JSON (`GateResult.model_dump_json`) and read back with
`GateResult.model_validate_json`, so a stored result can serve as the baseline
of a later gate run. Add fields with defaults; never rename existing ones.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1

Verdict = Literal["pass", "fail", "inconclusive", "reference"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Workload(_Frozen):
    """Everything that changes the numbers. Two results compare only on equal fingerprints."""

    api: Literal["completions", "generate"] = "completions"
    model: str = "default"
    input_len: int = 128
    output_len: int = 256
    ignore_eos: bool = True
    seed: int = 0
    warmup: int = 2
    concurrency: tuple[int, ...] = (1,)
    runs: int = 3
    max_runs: int = 6
    # requests per run at concurrency C: max(C * requests_per_slot, min_requests)
    requests_per_slot: int = 1
    timeout_s: float = 120.0
    # no byte for this long ends a request as stalled (not fingerprinted: it bounds, not measures)
    stall_timeout_s: float = 30.0
    # Added by the gate: at low C, more requests per run narrow the run-to-run spread
    # (speculative acceptance is noisy on short runs). Not fingerprinted: below the
    # server's batch cap it changes the spread, not the expected tok/s.
    min_requests: int = 0

    def fingerprint(self) -> str:
        # Run counts and timeouts change how sure we are, not what is measured.
        keys = {"api", "model", "input_len", "output_len", "ignore_eos", "seed", "requests_per_slot"}
        payload = json.dumps(self.model_dump(include=keys), sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


class Percentiles(_Frozen):
    mean: float = 0.0
    p50: float = 0.0
    p90: float = 0.0
    p99: float = 0.0


class RunMetrics(_Frozen):
    concurrency: int
    index: int
    duration_s: float
    completed: int
    failed: int
    input_tokens: int
    output_tokens: int
    output_tok_s: float
    total_tok_s: float
    ttft_ms: Percentiles
    itl_ms: Percentiles
    tpot_ms: Percentiles
    e2e_ms: Percentiles
    # streamed chunk count disagreed with the server's usage numbers
    token_count_mismatches: int = 0
    errors: tuple[str, ...] = ()


class LevelResult(_Frozen):
    concurrency: int
    runs: tuple[RunMetrics, ...]
    median_output_tok_s: float
    median_total_tok_s: float
    ttft_p99_ms: float
    failed_requests: int
    # Filled when compared with an incumbent at the same concurrency.
    baseline_median_output_tok_s: float | None = None
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    verdict: Verdict = "reference"
    reasons: tuple[str, ...] = ()


class ProbeResult(_Frozen):
    passed: bool
    outputs: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()


class GateResult(_Frozen):
    schema_version: int = SCHEMA_VERSION
    name: str  # the measured configuration, e.g. "eagle3-topk1-v2"
    url: str
    started_at: str  # ISO 8601 UTC
    finished_at: str
    workload: Workload
    fingerprint: str
    tolerance: float = 0.05
    # host facts: gpu model, driver, gpu count, sglang version, server_info bits
    host: dict[str, str] = Field(default_factory=dict)
    baseline_name: str | None = None
    levels: tuple[LevelResult, ...]
    probe: ProbeResult | None = None
    bars: tuple[str, ...] = ()  # violated absolute bars, one sentence each
    verdict: Verdict
    reasons: tuple[str, ...] = ()

    def level(self, concurrency: int) -> LevelResult | None:
        return next((lv for lv in self.levels if lv.concurrency == concurrency), None)
