"""Gate profiles: what to measure and which bars to hold, as one frozen model.

A stack's `gate.profiles` are GateProfile objects; `BUILTIN_PROFILES` serve
when no stack is given. Every field can be overridden from the command line
(`GateProfile.model_copy(update=...)` after validation through `with_overrides`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# The latency objectives capacity search can hold (`--slo KEY=MS`, `slo:` in a profile).
SLO_KEYS = ("ttft_p99_ms", "itl_p99_ms", "tpot_p99_ms")
# Bounds of the gate's phases, for its derived deadline: the agreement check sends this many
# requests at a time (stackbuild.gate.agreement.PARALLEL), the capacity search probes at most
# this many levels a side (ceil(log2(len(GRID))) + 1, stackbuild.gate.capacity).
AGREEMENT_PARALLEL = 8
CAPACITY_STEPS = 6
# the agreement's parts the candidate is also teacher-forced on (one more request a prompt)
AGREEMENT_ID_PARTS = ("ids", "long", "busy")


@dataclass(frozen=True)
class AgreementSend:
    """One part of the output agreement: what it sends to each side (docs/agreement.md)."""

    name: str  # ids | long | busy | completions | chat
    prompts: int
    input_len: int  # tokens; 0 for the natural-language parts
    tokens: int  # greedy tokens per prompt
    concurrency: int  # requests in flight

    @property
    def rounds(self) -> int:
        """Rounds of requests a side: prompts / concurrency, up."""
        return -(-self.prompts // max(1, self.concurrency))


class _FrozenModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Workload(_FrozenModel):
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



# Greedy prompts for the correctness probe: short, plain, and different enough
# that a server emitting the same text for all of them is noticed.
DEFAULT_PROBE_PROMPTS: tuple[str, ...] = (
    "The capital of France is",
    "List three prime numbers:",
    "def fibonacci(n):",
)


class LevelPolicy(BaseModel):
    """The bar at one concurrency: may lose up to `tolerance`, or must gain `min_gain`.

    A level that is not `required` is measured and judged, but its verdict does
    not decide the gate (it is reported as advisory).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    tolerance: float | None = Field(default=None, ge=0, lt=1)
    min_gain: float | None = Field(default=None, ge=0)
    required: bool = True

    @model_validator(mode="after")
    def _one_bar(self) -> LevelPolicy:
        if self.tolerance is not None and self.min_gain is not None:
            raise ValueError("a level takes tolerance (may lose up to) or min_gain "
                             "(must gain at least), not both")
        return self


class GateProfile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    description: str = ""
    api: Literal["completions", "generate"] = "completions"
    model: str = "default"
    concurrency: tuple[int, ...] = (1, 8)
    input_len: int = Field(default=128, ge=1)
    output_len: int = Field(default=256, ge=2)
    ignore_eos: bool = True
    seed: int = 0
    warmup: int = Field(default=2, ge=0)
    runs: int = Field(default=3, ge=1)
    max_runs: int = Field(default=6, ge=1)
    requests_per_slot: int = Field(default=1, ge=1)
    min_requests: int = Field(default=0, ge=0)
    timeout_s: float = Field(default=120.0, gt=0)
    # a streamed request with no byte for this long fails as stalled
    stall_timeout_s: float = Field(default=30.0, gt=0)
    # the whole gate ends by then (levels not finished fail with the cause); None: derived
    deadline_s: float | None = Field(default=None, gt=0)
    # before measuring: port open, /health 200 and one generation within this long
    ready_timeout_s: float = Field(default=10.0, gt=0)
    # relative slack: a level passes when the low end of its interval of candidate/incumbent
    # clears 1 - tolerance (stackbuild.gate.sequential)
    tolerance: float = Field(default=0.05, ge=0, lt=1)
    # "must not lose" (a tolerance of 0) means "does not lose more than this": the smallest
    # loss worth stopping a release for (docs/gate.md: derived from the measured noise)
    margin: float = Field(default=0.02, ge=0, lt=1)
    # per-concurrency bars; a level not named here holds `tolerance` and is required
    levels: dict[int, LevelPolicy] = Field(default_factory=dict)
    # 1 - confidence is split in two: the false-pass rate at the bar, and the false-fail rate
    # at the bar over all required levels together (stackbuild.gate.sequential)
    confidence: float = Field(default=0.95, gt=0.5, lt=1)
    # what decides: each required level's verdict, or the traffic-weighted expected change
    decide_on: Literal["levels", "traffic"] = "levels"
    # a stored baseline: the drift of a server's tok/s between sessions (sd of the log, added
    # to the comparison's variance), and the age past which the deploy re-measures the
    # incumbent before it stops it
    session_drift: float = Field(default=0.01, ge=0, lt=1)
    # a stored baseline finished at most this long ago is of this session (the deploy measures
    # the incumbent right before a swap stops it): paired by run index with no session drift
    fresh_baseline_s: float = Field(default=3600.0, ge=0)
    # how the level's runs may move within one gate, for a swap against a fresh baseline
    # measured in mirror order (decide.reference_order). "auto" (default): compared plain
    # unless the paired log ratios trend with the pairs' separation in time (the slope's t
    # test, decide.TREND_TEST), then detrended. "none": always plain (the runs scatter about
    # a level). "linear": always detrended (trend.detrended), the drift's linear part
    # removed at about twice the plain standard error (an equal build passes less often
    # within max_runs: docs/gate.md). A live incumbent (ABBA) needs none of them
    within_gate_drift: Literal["none", "linear", "auto"] = "auto"
    # under "auto", a swap compared plain allows for a machine that wanders at random (a
    # random walk) by up to this ratio of a pair's own variance a run (the local level
    # model's signal-to-noise ratio, trend.walk_variance): the walk the pairs share, over the
    # restart and between the inner pairs, which their spread does not show. 0.05: the walk of
    # the harness's walk cell (issue 26's "drift 0.5% a run" read as a walk, 0.048 of the
    # simulator's pair variance at C=32), the declared worst case as run_correlation's 0.4 is;
    # smaller ratios were measured (docs/gate.md); `gate --plan` shows what a host's swaps showed
    within_gate_walk: float = Field(default=0.05, ge=0, lt=1)
    # what a side-by-side deploy compares the candidate with while the incumbent serves.
    # "live" (default): the serving incumbent measured in alternation with the candidate, ABBA
    # (`gate --baseline-url`): load on the machine that comes and goes hits both sides alike.
    # "stored": the incumbent's result, run i against run i, measured again right before the
    # candidate starts unless it is of this session and ended within max_runs runs' time (as a
    # swap, which has no live incumbent to measure). Either way the incumbent's own clients
    # share its runs; live costs the candidate's runs again, stored its max_runs
    incumbent: Literal["stored", "live"] = "live"
    # the largest lag-1 autocorrelation of a server's successive runs the boundaries are sized
    # for (declared, not estimated from a gate's own runs: docs/gate.md says why; 0.4: the
    # simulator's runs at C=8 under load); `gate --plan` shows what the ledger's runs had
    run_correlation: float = Field(default=0.4, ge=0, lt=0.9)
    baseline_max_age_s: float = Field(default=7 * 86400.0, gt=0)
    # runs a gate with nothing to compare takes (it may become a stored baseline); None: max_runs.
    # A stored baseline limits the two-sample test to min(n, m) - 1 degrees of freedom: one of
    # 3 runs leaves 2 (t 4.3 where 10 runs give 2.3), too few to decide at the noise of a run
    reference_runs: int | None = Field(default=None, ge=1)
    # absolute bars; None disables a bar
    min_tok_s_c1: float | None = None
    max_ttft_p99_ms: float | None = None
    max_failed_requests: int = Field(default=0, ge=0)
    # correctness probe: greedy prompts; golden texts (same order) when no live incumbent
    probe_prompts: tuple[str, ...] = DEFAULT_PROBE_PROMPTS
    probe_max_tokens: int = Field(default=32, ge=1)
    probe_golden: tuple[str, ...] = ()
    # traffic weights: concurrency level -> share of the incumbent's busy time (from
    # `stackbuild traffic`, or declared); adds the expected throughput change on it
    traffic: dict[int, float] = Field(default_factory=dict)
    # capacity under SLOs (stackbuild.gate.capacity): keys ttft_p99_ms, itl_p99_ms, tpot_p99_ms
    slo: dict[str, float] = Field(default_factory=dict)
    capacity_max_concurrency: int = Field(default=256, ge=1)
    # requests per probed level at least: a per-request p99 (TTFT, TPOT) has an upper bound
    # (an order statistic) only from 367 requests (stackbuild.gate.capacity.P99_UPPER_MIN)
    capacity_min_requests: int = Field(default=400, ge=1)
    # fail when the candidate's capacity under the SLOs is below the incumbent's
    require_capacity: bool = False
    # output agreement with the incumbent (stackbuild.gate.agreement); 0 prompts disables it
    agreement_prompts: int = Field(default=32, ge=0, le=1000)
    agreement_tokens: int = Field(default=32, ge=1, le=4096)
    # fail when fewer prompts than this agree on their first greedy token
    min_first_token_agreement: float = Field(default=0.75, ge=0, le=1)
    # fail when the candidate's mean logprob of the incumbent's outputs is lower by more
    # than this (nats per token); a benign divergence moves it by hundredths
    max_logprob_drop: float = Field(default=0.5, ge=0)
    # where the users run (docs/agreement.md): prompts at input_len with output_len answers,
    # one batch at the highest concurrency measured, natural-language prompts as text and as
    # chat; the top-k compared along the incumbent's greedy path
    agreement_long_prompts: int = Field(default=4, ge=0, le=256)
    agreement_busy: bool = True
    agreement_text_prompts: int = Field(default=8, ge=0, le=256)
    agreement_top_k: int = Field(default=5, ge=0, le=20)
    # fail below this mean share of the incumbent's top-k the candidate also ranks top-k,
    # or above this mean KL over it (nats per position)
    min_top_k_overlap: float = Field(default=0.8, ge=0, le=1)
    max_top_k_kl: float = Field(default=0.1, ge=0)
    # fail when fewer text answers than this agree on their first word
    min_text_agreement: float = Field(default=0.75, ge=0, le=1)

    @field_validator("concurrency")
    @classmethod
    def _levels(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v or any(c < 1 for c in v):
            raise ValueError("concurrency levels must be positive integers, e.g. [1, 30, 250]")
        return tuple(sorted(set(v)))

    @field_validator("slo")
    @classmethod
    def _slo(cls, v: dict[str, float]) -> dict[str, float]:
        bad = [k for k, x in v.items() if k not in SLO_KEYS or not x > 0]
        if bad:
            raise ValueError(f"slo: {', '.join(bad)}: keys are {', '.join(SLO_KEYS)}, "
                             "values milliseconds > 0")
        return v

    def policy(self, concurrency: int) -> LevelPolicy:
        return self.levels.get(concurrency) or LevelPolicy()

    def margin_at(self, concurrency: int) -> float:
        """The margin this level's bar carries: `margin` where the level must not lose, else 0."""
        pol = self.policy(concurrency)
        tol = self.tolerance if pol.tolerance is None else pol.tolerance
        return self.margin if pol.min_gain is None and tol == 0 else 0.0

    def bar(self, concurrency: int) -> float:
        """The ratio candidate/incumbent the level is tested against (margin included)."""
        pol = self.policy(concurrency)
        if pol.min_gain is not None:
            return 1.0 + pol.min_gain
        tol = self.tolerance if pol.tolerance is None else pol.tolerance
        return 1.0 - (tol or self.margin)

    def required_levels(self) -> tuple[int, ...]:
        """The levels whose verdict decides the gate (none when traffic decides)."""
        if self.decide_on == "traffic":
            return ()
        return tuple(c for c in self.concurrency if self.policy(c).required)

    def workload(self) -> Workload:
        return Workload(
            api=self.api,
            model=self.model,
            input_len=self.input_len,
            output_len=self.output_len,
            ignore_eos=self.ignore_eos,
            seed=self.seed,
            warmup=self.warmup,
            concurrency=self.concurrency,
            runs=self.runs,
            max_runs=max(self.max_runs, self.runs),
            requests_per_slot=self.requests_per_slot,
            min_requests=self.min_requests,
            timeout_s=self.timeout_s,
            stall_timeout_s=min(self.stall_timeout_s, self.timeout_s),
        )

    def rounds(self, concurrency: int, at_least: int = 0) -> int:
        """Rounds of requests in one run at this concurrency (requests / concurrency, up)."""
        n = max(concurrency * self.requests_per_slot, self.min_requests, at_least)
        return -(-n // concurrency)

    def phase_bounds_s(self) -> dict[str, float]:
        """Each phase's worst case, every round of requests taking the full per-request timeout.

        levels: every run at max_runs on both sides; agreement: each part's rounds on both sides,
        and the candidate's teacher-forced pass of the token-id parts; capacity:
        at most CAPACITY_STEPS runs a side. A stalled server fails each request after
        `stall_timeout_s`, long before this.
        """
        per = self.timeout_s
        runs = max(self.max_runs, self.runs, self.baseline_runs())
        out = {
            "ready": 2 * self.ready_timeout_s,
            "warmup": 2 * -(-self.warmup // max(1, min(max(self.concurrency), self.warmup or 1))) * per,
            "levels": runs * 2 * sum(self.rounds(c) for c in self.concurrency) * per,
            "probe": 2 * len(self.probe_prompts) * per,
        }
        if self.agreement_prompts:
            out["agreement"] = sum((3 if p.name in AGREEMENT_ID_PARTS else 2) * p.rounds
                                   for p in self.agreement_parts()) * per
        if self.slo:
            out["capacity"] = 2 * CAPACITY_STEPS * self.rounds(1, self.capacity_min_requests) * per
        return out

    def baseline_runs(self) -> int:
        """Runs a reference measurement takes, and the fewest a stored baseline must hold at
        each level to stand for the incumbent (fewer: it is measured again)."""
        return self.reference_runs or max(self.runs, self.max_runs)

    def agreement_parts(self) -> tuple[AgreementSend, ...]:
        """What the output agreement sends to each side (nothing when agreement_prompts is 0)."""
        n, t, par = self.agreement_prompts, self.agreement_tokens, AGREEMENT_PARALLEL
        if n == 0:
            return ()
        parts = [AgreementSend("ids", n, 0, t, par)]
        if self.agreement_long_prompts:
            parts.append(AgreementSend("long", self.agreement_long_prompts, self.input_len,
                                       self.output_len, min(par, self.agreement_long_prompts)))
        top = max(self.concurrency)
        if self.agreement_busy and top > par:
            parts.append(AgreementSend("busy", top, self.input_len, t, top))
        if self.agreement_text_prompts:
            for name in ("completions", "chat"):
                parts.append(AgreementSend(name, self.agreement_text_prompts, 0, t, par))
        return tuple(parts)

    def gate_deadline_s(self) -> float:
        """The whole gate's bound: `deadline_s`, else the sum of the phases' worst cases."""
        if self.deadline_s is not None:
            return self.deadline_s
        return sum(self.phase_bounds_s().values())

    def with_overrides(self, **fields: Any) -> GateProfile:
        """A copy with the given fields replaced (None means: keep), validated again."""
        data = self.model_dump()
        levels = fields.pop("levels", None)
        if levels:  # per-level bars from the CLI replace the profile's at those levels
            data["levels"] = {**data["levels"], **levels}
        data.update({k: v for k, v in fields.items() if v is not None})
        return GateProfile.model_validate(data)


BUILTIN_PROFILES: dict[str, GateProfile] = {
    # Small enough for tests and the demo against the simulator at high --speed.
    # Sequential: looked at from 3 runs, stops when it can decide; equal builds under "must not
    # lose" need 8-15 runs at the simulator's measured spread (bench/gate_calibration.py).
    "quick": GateProfile(
        description="short smoke gate: C=1,8, 64 in / 64 out, 3 to 15 runs",
        concurrency=(1, 8),
        input_len=64,
        output_len=64,
        warmup=2,
        runs=3,
        max_runs=15,
        timeout_s=60.0,
        stall_timeout_s=10.0,
    ),
    # The users' hand procedure (seeds/000, seeds/004): 10 runs of 2048 tokens after
    # warmup, sweep at C=1, 30, 250. Sequential: looked at from run 5, at most 15; a
    # reference (the stored baseline of a later swap) takes their 10.
    "users": GateProfile(
        description="the users' sweep: C=1,30,250, 2048 out tokens, 5 to 15 runs",
        concurrency=(1, 30, 250),
        input_len=128,
        output_len=2048,
        warmup=3,
        runs=5,
        max_runs=15,
        reference_runs=10,
        timeout_s=1800.0,
        stall_timeout_s=120.0,
        # derived from the timeouts it would be 45 h; a deploy holds the host lease this long at most
        deadline_s=4 * 3600.0,
    ),
}
