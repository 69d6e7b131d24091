"""The simulator's "language model": a next-token distribution that is a function of the context.

The state after a context is a hash chain over its token ids, so a prompt followed by
an output, sent back as one list of ids (teacher forcing), reaches exactly the state
that generating that output reached. At every state the distribution has a top token,
a runner-up and an even spread over the rest of the vocabulary; about one state in ten
is a near tie (top 0.42 vs 0.40), which is where another kernel's bf16 rounding flips a
greedy choice in real servers.

Numerics (how one server's kernels compute the distribution):
  exact       every healthy profile (baseline, the EAGLE variants: speculation with
              greedy verification does not change greedy output)
  diverge:N   from output token N on, near ties go to the runner-up (0.42 vs 0.40
              swapped): greedy outputs part ways, the likelihood of the incumbent's
              outputs barely moves (a benign divergence)
  drift       another, equally fluent distribution (plausible text from the same
              vocabulary, same speed): the incumbent's tokens fall into "the rest",
              at about -8 nats each (a kernel computing wrong numbers)
  drift:N     the same, only where the context is N tokens or longer (a kernel that is
              wrong past some sequence length: a long-context bug)

A position's context length is the number of tokens before it: prompt plus the output
so far. `top` gives sglang's top-k (top_logprobs_num): the top token, the runner-up,
then the rest (all equally likely), lowest ids first.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from stackbuild.sim.text import VOCAB_SIZE

NEAR_TIE = (0.42, 0.40)
NEAR_TIE_SHARE = 26  # of 256: about one state in ten


@dataclass(frozen=True)
class Numerics:
    kind: str = "exact"  # exact | diverge | drift
    # diverge: the first output position where near ties flip; drift: the first context
    # length computed wrong (0: every position)
    after: int = 0


@dataclass(frozen=True)
class Dist:
    top: int
    second: int
    p_top: float
    p_second: float

    def logprob(self, token: int) -> float:
        if token == self.top:
            return math.log(self.p_top)
        if token == self.second:
            return math.log(self.p_second)
        # ids 1..VOCAB_SIZE-1 are text pieces (0 is the NaN token), two of them named above
        return math.log((1.0 - self.p_top - self.p_second) / (VOCAB_SIZE - 3))


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def step(state: bytes, token: int) -> bytes:
    return _digest(state + token.to_bytes(4, "little", signed=False))


def start(text: str | None, ids: list[int] | None) -> bytes:
    if ids is None:
        return _digest(b"text:" + (text or "").encode())
    state = _digest(b"ids:")
    for t in ids:
        state = step(state, t % (1 << 32))
    return state


def dist(state: bytes, numerics: Numerics = Numerics(), position: int = 0,
         context: int = 0) -> Dist:
    """The distribution after `state`; `position` counts output tokens (for diverge:N),
    `context` the tokens before this one (for drift:N)."""
    if numerics.kind == "drift" and context >= numerics.after:
        state = _digest(b"drift:" + state)
    v = int.from_bytes(state[:8], "little")
    top = 1 + v % (VOCAB_SIZE - 1)
    second = 1 + (v // VOCAB_SIZE) % (VOCAB_SIZE - 1)
    if second == top:
        second = top % (VOCAB_SIZE - 1) + 1
    if state[9] < NEAR_TIE_SHARE:
        p_top, p_second = NEAR_TIE
        if numerics.kind == "diverge" and position >= numerics.after:
            return Dist(second, top, p_top, p_second)  # the tie goes the other way
        return Dist(top, second, p_top, p_second)
    p_top = 0.55 + 0.4 * state[8] / 255.0
    return Dist(top, second, p_top, (1.0 - p_top) / 2.0)


def top(d: Dist, k: int) -> list[tuple[float, int]]:
    """The k most likely (logprob, id): top, runner-up, then the rest by id."""
    out = [(d.logprob(d.top), d.top), (d.logprob(d.second), d.second)][:k]
    rest = (i for i in range(1, VOCAB_SIZE) if i not in (d.top, d.second))
    while len(out) < k:
        i = next(rest)
        out.append((d.logprob(i), i))
    return out


def greedy(state: bytes, n: int, numerics: Numerics = Numerics(), stop: int | None = None,
           *, logprobs: bool = True, prompt_len: int = 0, top_k: int = 0
           ) -> tuple[list[int], list[float], list[list[tuple[float, int]]]]:
    """Up to n greedy token ids after `state` (through `stop` if it comes), the logprob of
    each under this server when asked, and the top_k alternatives at each position."""
    ids: list[int] = []
    lps: list[float] = []
    tops: list[list[tuple[float, int]]] = []
    exact = numerics.kind == "exact" and not logprobs and not top_k
    for pos in range(n):
        if exact:  # the hot path of every throughput request: the top token only
            best = 1 + int.from_bytes(state[:8], "little") % (VOCAB_SIZE - 1)
        else:
            d = dist(state, numerics, pos, prompt_len + pos)
            best = d.top
            if logprobs:
                lps.append(d.logprob(best))
            if top_k:
                tops.append(top(d, top_k))
        ids.append(best)
        if best == stop:
            break
        state = step(state, best)
    return ids, lps, tops


def score(ids: list[int], start_at: int, numerics: Numerics = Numerics(), top_k: int = 0
          ) -> tuple[list[float | None], list[list[tuple[float, int]] | None]]:
    """Teacher-forced logprobs of ids[start_at:] as sglang returns input_token_logprobs (and,
    with top_k, input_top_logprobs): the first entry is None (nothing predicts it from inside
    the range). Positions count from the start of the ids here: the server cannot tell
    prompt from output."""
    state = _digest(b"ids:")
    out: list[float | None] = []
    tops: list[list[tuple[float, int]] | None] = []
    for i, t in enumerate(ids):
        if i == start_at:
            out.append(None)
            tops.append(None)
        elif i > start_at:
            d = dist(state, numerics, i, i)
            out.append(d.logprob(t))
            tops.append(top(d, top_k) if top_k else None)
        state = step(state, t % (1 << 32))
    return out, tops
