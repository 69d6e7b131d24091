"""The timing and acceptance model: pure functions plus a seeded sampler.

Times here are model milliseconds at --speed 1; the server divides by speed.
"""

from __future__ import annotations

import hashlib
import math
import random
from array import array

from stackbuild.sim.calibration import SimProfile


def step_ms(profile: SimProfile, batch: int) -> float:
    t0, a, b = profile.coeffs
    return max(profile.floor_ms, t0 + a * batch + b * batch * batch)


def prefill_ms(profile: SimProfile, input_tokens: int) -> float:
    return profile.prefill_base_ms + profile.prefill_ms_per_token * input_tokens


def steady_tok_s(profile: SimProfile, concurrency: int) -> float:
    """Output tok/s with `concurrency` clients always busy, prefill ignored (long outputs)."""
    batch = min(concurrency, profile.max_running)
    return batch * profile.mean_accept * 1000.0 / step_ms(profile, batch)


# Speculative acceptance depends on the content: how predictable the continuation is for the
# draft model. A request's acceptance probability is accept_p plus a part its tokens decide
# (sd PROMPT_ACCEPT_SD over prompts, the same in every run of the same prompt, on every
# server) plus a small residual of the run (sd RESIDUAL_ACCEPT_SD), and its per-step draws
# come from a generator seeded by its tokens (greedy decoding accepts the same drafts on the
# same text). 0.05 makes the users' C=1 spread over different prompts: at accept_p 0.7 and 2
# drafts, E[1 + accepted] = 1 + p + p^2 moves 1.1% per 0.01 of p, so 0.05 gives ~5.4% a run
# of 2048 tokens (their 10 runs: 87.5-103.5 tok/s, 5.4%).
PROMPT_ACCEPT_SD = 0.05
RESIDUAL_ACCEPT_SD = 0.005


class Acceptance:
    """One request's draft acceptance: a deterministic function of its tokens plus a residual."""

    def __init__(self, profile: SimProfile, token_ids: list[int], residual: float) -> None:
        digest = hashlib.blake2b(array("q", token_ids[:256]).tobytes(), digest_size=8).digest()
        self.rng = random.Random(int.from_bytes(digest, "big"))
        p = profile.accept_p + PROMPT_ACCEPT_SD * self.rng.gauss(0.0, 1.0) + residual
        self.p = min(0.98, max(0.02, p))


class Sampler:
    """Noise and acceptance draws from one seeded RNG, so a run is reproducible."""

    def __init__(self, profile: SimProfile, seed: int = 0, *, slow: float = 1.0) -> None:
        self.profile = profile
        self.slow = slow
        self._rng = random.Random(seed)
        self._drift = 1.0
        self._drift_left_ms = 0.0

    def _jitter(self, sigma: float) -> float:
        # mean-one lognormal
        return math.exp(self._rng.gauss(0.0, sigma) - sigma * sigma / 2) if sigma else 1.0

    def _scale(self, ms: float) -> float:
        p = self.profile
        if self._drift_left_ms <= 0:
            self._drift = self._jitter(p.drift)
            self._drift_left_ms = p.drift_every_s * 1000.0
        out = ms * self.slow * self._drift * self._jitter(p.step_jitter)
        self._drift_left_ms -= out
        return out

    def step_ms(self, batch: int) -> float:
        return self._scale(step_ms(self.profile, batch))

    def prefill_ms(self, input_tokens: int) -> float:
        return self._scale(prefill_ms(self.profile, input_tokens))

    def acceptance(self, token_ids: list[int]) -> Acceptance:
        """A request's acceptance: what its tokens decide, and this run's residual."""
        return Acceptance(self.profile, token_ids,
                          self._rng.gauss(0.0, RESIDUAL_ACCEPT_SD) if self.profile.speculative
                          else 0.0)

    def accepted(self, remaining: int, acceptance: Acceptance | None = None) -> int:
        """Tokens one request gets from one decode step (>= 1, <= remaining): with its
        `acceptance`, drawn from its content's generator at its probability; without, at the
        profile's accept_p from the sampler's own."""
        rng, p = (acceptance.rng, acceptance.p) if acceptance else (self._rng, self.profile.accept_p)
        n = 1
        for _ in range(self.profile.spec_steps):
            if rng.random() >= p:
                break
            n += 1
        return min(n, remaining)


def expected_steps(profile: SimProfile, tokens: int) -> float:
    """E[decode steps] to emit `tokens` when a step yields 1 + accepted drafts, capped by what
    is left (so the last step of a speculative request is partly wasted)."""
    p, k = profile.accept_p, profile.spec_steps
    # P(a step yields exactly j tokens), j = 1..k+1
    yields = [(p ** (j - 1)) * ((1 - p) if j <= k else 1.0) for j in range(1, k + 2)]
    steps = [0.0] * (tokens + 1)
    for r in range(1, tokens + 1):
        steps[r] = 1.0 + sum(q * steps[max(0, r - j)] for j, q in enumerate(yields, start=1))
    return steps[tokens]


def single_stream_tok_s(profile: SimProfile, input_len: int, output_len: int) -> float:
    """Expected output tok/s of one client sending one request after another (C=1)."""
    ms = prefill_ms(profile, input_len) + expected_steps(profile, output_len) * step_ms(profile, 1)
    return output_len * 1000.0 / ms


def expected_tpot_ms(profile: SimProfile, concurrency: int, input_len: int, output_len: int,
                     speed: float = 1.0) -> float:
    """Mean time per output token after the first, C clients in a closed loop (wall ms).

    A request's decode spans its own steps at batch min(C, cap) plus the prefills of the
    requests the other C-1 clients start meanwhile (decode pauses for each prefill), at
    most one each. Requests beyond the cap wait before their first token, not between
    tokens."""
    batch = min(concurrency, profile.max_running)
    decode = expected_steps(profile, output_len) * step_ms(profile, batch)
    pauses = (batch - 1) * prefill_ms(profile, input_len)
    return (decode + pauses) / max(output_len - 1, 1) / speed
