"""Output agreement: does the candidate still say what the incumbent says?

Exact equality of greedy text is too strict (another CUDA version or allreduce
algorithm changes bf16 rounding and greedy outputs part ways after some tokens at
near ties) and a few prompts are too few to see a subtle corruption. So, over dozens
of seeded token-id prompts:

  (a) agreement of greedy outputs: the share whose first token agrees, and the
      distribution of exact-prefix lengths;
  (b) the candidate's teacher-forced likelihood of the incumbent's outputs: the prompt
      and the incumbent's output sent back as one list of ids with `return_logprob`
      and `logprob_start_len` (sglang's /generate answers `input_token_logprobs`),
      against the incumbent's own logprob of them. A benign divergence keeps that
      likelihood; a kernel that computes wrong numbers loses it.

`compare` is pure; `collect` and `teacher_forced` talk HTTP.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from collections.abc import Sequence
from typing import Any

import aiohttp

from stackbuild.errors import InfraError
from stackbuild.gate.loadgen import PROMPT_ID_RANGE
from stackbuild.gate.result import AgreementResult, AgreementSample
from stackbuild.gate.stats import percentile

PARALLEL = 8


def prompts(seed: int, n: int) -> list[list[int]]:
    """n seeded token-id prompts of 16 to 48 tokens (no tokenizer, no download)."""
    out = []
    for i in range(n):
        rng = random.Random(f"agreement:{seed}:{i}")
        out.append([rng.randrange(*PROMPT_ID_RANGE) for _ in range(rng.randint(16, 48))])
    return out


def generate_body(prompt: Sequence[int], max_new_tokens: int) -> dict[str, Any]:
    """A greedy generation that returns the logprob of each output token."""
    return {"input_ids": list(prompt), "return_logprob": True,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0,
                                "ignore_eos": True}}


def forced_body(prompt: Sequence[int], output: Sequence[int]) -> dict[str, Any]:
    """Teacher forcing: prompt + output as input; logprobs from the prompt's last token on.

    sglang 0.5.23 puts None first in input_token_logprobs (logprob_result_processor.py,
    `[None] + input_token_logprobs[:-1]`), so starting one token early yields exactly
    one logprob per output token after it.
    """
    return {"input_ids": [*prompt, *output], "return_logprob": True,
            "logprob_start_len": len(prompt) - 1,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}


def _lps(entries: Any, what: str) -> list[float]:
    try:
        return [float(e[0]) for e in entries]
    except (TypeError, ValueError, IndexError):
        raise InfraError(f"/generate: {what} is not a list of (logprob, id, text); "
                         "is this an sglang server?") from None


async def _post(s: aiohttp.ClientSession, url: str, body: dict[str, Any],
                timeout: float) -> dict[str, Any]:
    try:
        async with s.post(url + "/generate", json=body,
                          timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            data = await r.json(content_type=None)
            if r.status != 200 or not isinstance(data, dict):
                raise InfraError(f"POST {url}/generate: HTTP {r.status}: {str(data)[:200]}")
            return data
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as err:
        raise InfraError(f"POST {url}/generate failed: {type(err).__name__}: {err}") from None


async def _each(url: str, bodies: list[dict[str, Any]], timeout: float) -> list[dict[str, Any]]:
    sem = asyncio.Semaphore(PARALLEL)
    async with aiohttp.ClientSession() as s:
        async def one(b: dict[str, Any]) -> dict[str, Any]:
            async with sem:
                return await _post(s, url, b, timeout)
        return list(await asyncio.gather(*(one(b) for b in bodies)))


async def collect(url: str, seed: int, n: int, tokens: int,
                  timeout: float = 60.0) -> tuple[AgreementSample, ...]:
    """This server's greedy outputs of the seeded prompts, with its own logprobs of them."""
    ps = prompts(seed, n)
    answers = await _each(url, [generate_body(p, tokens) for p in ps], timeout)
    out = []
    for p, a in zip(ps, answers, strict=True):
        ids = a.get("output_ids")
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            raise InfraError(f"POST {url}/generate: no output_ids in the answer")
        lps = _lps((a.get("meta_info") or {}).get("output_token_logprobs") or [],
                   "meta_info.output_token_logprobs")
        out.append(AgreementSample(prompt=tuple(p), output=tuple(ids),
                                   logprob=statistics.fmean(lps) if lps else 0.0))
    return tuple(out)


async def teacher_forced(url: str, reference: Sequence[AgreementSample],
                         timeout: float = 60.0) -> list[float]:
    """Mean logprob per token this server gives each reference output."""
    answers = await _each(url, [forced_body(r.prompt, r.output) for r in reference], timeout)
    out = []
    for r, a in zip(reference, answers, strict=True):
        entries = (a.get("meta_info") or {}).get("input_token_logprobs") or []
        lps = _lps(entries[1:], "meta_info.input_token_logprobs")
        if len(lps) != len(r.output):
            raise InfraError(f"POST {url}/generate: {len(lps)} input logprobs for "
                             f"{len(r.output)} forced tokens; the server ignores logprob_start_len")
        out.append(statistics.fmean(lps) if lps else 0.0)
    return out


def prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def compare(reference: Sequence[AgreementSample], candidate: Sequence[AgreementSample],
            forced: Sequence[float], *, min_first_token: float, max_drop: float
            ) -> AgreementResult:
    """The verdict on agreement; `forced` = candidate's mean logprob of each reference output."""
    if not reference:
        return AgreementResult(prompts=len(candidate), samples=tuple(candidate))
    prefixes = [prefix_len(r.output, c.output) for r, c in zip(reference, candidate, strict=True)]
    n = len(reference)
    tokens = max(len(r.output) for r in reference)
    first = sum(1 for p in prefixes if p > 0) / n
    full = sum(1 for r, p in zip(reference, prefixes, strict=True) if p == len(r.output)) / n
    inc_lp = statistics.fmean(r.logprob for r in reference)
    cand_lp = statistics.fmean(forced)
    drop = inc_lp - cand_lp
    example = ""
    worst = min(range(n), key=lambda i: (prefixes[i], forced[i]))
    if prefixes[worst] < len(reference[worst].output):
        at = prefixes[worst]
        example = (f"prompt #{worst} diverges at token {at}: incumbent ids "
                   f"{list(reference[worst].output[at:at + 6])} vs candidate "
                   f"{list(candidate[worst].output[at:at + 6])} (candidate's logprob of "
                   f"the incumbent's output {forced[worst]:.2f}/token vs the incumbent's own "
                   f"{reference[worst].logprob:.2f})")
    reasons = []
    if drop > max_drop:
        reasons.append(f"agreement: the candidate gives the incumbent's greedy outputs "
                       f"{cand_lp:.2f} nats/token vs the incumbent's own {inc_lp:.2f} "
                       f"(drop {drop:.2f}, allowed {max_drop:g}): it computes other numbers")
    if first < min_first_token:
        reasons.append(f"agreement: first tokens agree on {first:.0%} of {n} prompts "
                       f"(at least {min_first_token:.0%} required)")
    if reasons and example:
        reasons.append(f"agreement: e.g. {example}")
    return AgreementResult(
        prompts=n, tokens=tokens, compared=True, first_token=first,
        prefix_p10=percentile(prefixes, 10), prefix_p50=percentile(prefixes, 50),
        prefix_mean=statistics.fmean(prefixes), full_match=full,
        logprob_incumbent=inc_lp, logprob_candidate=cand_lp, logprob_drop=drop,
        passed=not reasons, reasons=tuple(reasons), example=example,
        samples=tuple(candidate))
