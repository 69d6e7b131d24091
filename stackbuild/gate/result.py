"""Gate results: the contract between the gate, the ledger, the report and deploy.

Results are written as JSON (`GateResult.model_dump_json`) and read back with
`GateResult.model_validate_json`, so a stored result can serve as the baseline
of a later gate run. Add fields with defaults; never rename existing ones.
"""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# Workload is the profile's measurable part; it lives with the profile (a spec model) and is
# named here too, where results carry it.
from stackbuild.spec.profile import Workload as Workload

SCHEMA_VERSION = 1

Verdict = Literal["pass", "fail", "inconclusive", "reference"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


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
    # when the run started (seconds since the epoch); None in results written before it was kept
    started: float | None = None


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
    # the level's policy: lowest passing ratio, whether it decides the gate, and one
    # sentence saying how the verdict follows from the numbers ("C=1 -6.4%, allowed -8%: pass")
    bar: float | None = None
    required: bool = True
    explanation: str = ""
    # the incumbent's runs (output tok/s) this level was compared with
    baseline_runs_tok_s: tuple[float, ...] = ()
    # how: paired with a live incumbent's runs (True) or against stored runs (False); the
    # interval's coverage (stackbuild.gate.sequential); the margin the bar carries
    paired: bool | None = None
    ci_confidence: float | None = None
    margin: float = 0.0
    # requests the measured server (the candidate, or a reference) and a live incumbent finished during
    # the level besides the gate's own, by their /metrics counters; None: not known (no --enable-metrics,
    # or a result written before they were counted). Clients of their own slow a side down.
    outside_requests: int | None = None
    incumbent_outside_requests: int | None = None
    # a swap's comparison (its incumbent measured right before it, in mirror order): the restart
    # between the two sides, in runs (decide.swap_gap), which `gate --plan` reads the walk of the
    # machine with; None for any other comparison
    swap_gap: int | None = None


class ProbeResult(_Frozen):
    passed: bool
    outputs: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()


class AgreementSample(_Frozen):
    """One seeded greedy prompt and what this server answered: kept with every result so a
    later gate can compare with it when this server no longer runs (swap)."""

    prompt: tuple[int, ...]
    output: tuple[int, ...]
    # mean logprob per token this server gives its own output
    logprob: float
    part: str = "ids"  # which agreement part asked it (stackbuild.gate.agreement.plan)
    text: str = ""  # the text the server returned with the ids
    # this server's top-k (token id, logprob) at each output position
    top: tuple[tuple[tuple[int, float], ...], ...] = ()


class TextSample(_Frozen):
    """A natural-language prompt sent as text (/v1/completions) or as a chat message
    (/v1/chat/completions), and the text this server answered."""

    part: str  # "completions" or "chat"
    prompt: str
    text: str
    prompt_tokens: int = 0  # as the server counted them (its tokenizer, its chat template)


class AgreementPart(_Frozen):
    """One part of the agreement: its prompts, how they were sent, and how they compared."""

    name: str  # ids | long | busy | completions | chat
    prompts: int
    tokens: int  # greedy tokens per prompt
    input_len: int = 0  # prompt tokens (0: natural-language prompts of a few words)
    concurrency: int = 1  # requests in flight
    first_token: float | None = None  # share agreeing on the first token (text: first word)
    prefix_mean: float | None = None  # exact prefix, tokens (text: share of characters)
    full_match: float | None = None
    logprob_drop: float | None = None  # nats per token, teacher-forced
    top_k_overlap: float | None = None  # mean share of the incumbent's top-k the candidate shares
    kl: float | None = None  # mean KL(incumbent || candidate) over the incumbent's top-k, nats
    other_text: int = 0  # outputs whose token ids match and whose text does not
    passed: bool = True
    reasons: tuple[str, ...] = ()


class AgreementResult(_Frozen):
    """Does the candidate still say what the incumbent says? (see stackbuild.gate.agreement)"""

    prompts: int = 0
    tokens: int = 0  # greedy tokens per prompt
    compared: bool = False  # False: no incumbent outputs to compare with (a reference run)
    first_token: float | None = None  # share of prompts whose first token agrees
    prefix_p10: float | None = None  # exact-prefix length, tokens
    prefix_p50: float | None = None
    prefix_mean: float | None = None
    full_match: float | None = None  # share of prompts agreeing on every token
    # teacher-forced: mean logprob per token of the incumbent's outputs, under each side
    logprob_incumbent: float | None = None
    logprob_candidate: float | None = None
    logprob_drop: float | None = None  # incumbent - candidate, nats per token
    passed: bool = True
    reasons: tuple[str, ...] = ()
    # the first diverging pair: prompt index, position, both texts from there
    example: str = ""
    samples: tuple[AgreementSample, ...] = ()
    # every part (the fields above summarize "ids"), the text answers, and the cost
    parts: tuple[AgreementPart, ...] = ()
    texts: tuple[TextSample, ...] = ()
    requests: int = 0  # requests this agreement sent, both sides
    seconds: float = 0.0


class CapacityResult(_Frozen):
    """The highest concurrency at which every SLO held, and what it served there."""

    slo: dict[str, float]
    concurrency: int  # 0: no level met the SLOs
    # the interval: the highest level where every SLO held at the upper end of its p99's
    # bootstrap interval, and the highest not shown broken by the lower end of one
    concurrency_low: int | None = None
    concurrency_high: int | None = None
    goodput_tok_s: float = 0.0  # output tok/s of the requests that met every SLO
    goodput_low: float | None = None  # bootstrap interval over requests
    goodput_high: float | None = None
    output_tok_s: float = 0.0
    ttft_p99_ms: float = 0.0
    itl_p99_ms: float = 0.0
    tpot_p99_ms: float = 0.0
    next_concurrency: int | None = None  # the first level probed above it that broke an SLO
    runs: int = 0
    tried: tuple[str, ...] = ()  # "C=8: holds", "C=16: itl_p99_ms 61.2 > 50"

    def interval_text(self) -> str:
        """"C=24 (C=16..32)": the capacity and its interval."""
        if self.concurrency_low is None or self.concurrency_high is None:
            return f"C={self.concurrency}"
        return f"C={self.concurrency} (C={self.concurrency_low}..{self.concurrency_high})"


class CapacityComparison(_Frozen):
    candidate: CapacityResult
    incumbent: CapacityResult | None = None
    # candidate / incumbent goodput at each one's capacity
    goodput_ratio: float | None = None
    passed: bool = True
    reasons: tuple[str, ...] = ()


class TrafficResult(_Frozen):
    """The expected throughput change on the incumbent's measured (or declared) traffic."""

    weights: dict[int, float]  # concurrency level -> share of busy time
    change: float  # sum(w * candidate / incumbent) - 1: the change over time on this traffic
    ci_low: float
    ci_high: float
    confidence: float = 0.95
    # against the profile's bar (1 - tolerance, or 1 - margin), when traffic decides
    bar: float | None = None
    verdict: Verdict | None = None
    explanation: str = ""


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
    # which baseline: "live" (measured in alternation) or "stored" (an earlier session's
    # result, finished at baseline_measured_at, baseline_age_s before this gate started),
    # and the session drift (sd of the log) its intervals include
    baseline_source: Literal["live", "stored"] | None = None
    baseline_measured_at: str | None = None
    baseline_age_s: float | None = None
    session_drift: float | None = None
    margin: float | None = None
    decide_on: Literal["levels", "traffic"] = "levels"
    levels: tuple[LevelResult, ...]
    probe: ProbeResult | None = None
    agreement: AgreementResult | None = None
    capacity: CapacityComparison | None = None
    traffic: TrafficResult | None = None
    bars: tuple[str, ...] = ()  # violated absolute bars, one sentence each
    verdict: Verdict
    reasons: tuple[str, ...] = ()

    def level(self, concurrency: int) -> LevelResult | None:
        return next((lv for lv in self.levels if lv.concurrency == concurrency), None)


def age_s(baseline: GateResult, now: dt.datetime | None = None) -> float | None:
    """Seconds since the stored baseline finished; None when its time cannot be read."""
    try:
        then = dt.datetime.fromisoformat(baseline.finished_at)
    except ValueError:
        return None
    if then.tzinfo is None:
        then = then.replace(tzinfo=dt.UTC)
    return max(0.0, ((now or dt.datetime.now(dt.UTC)) - then).total_seconds())
