"""Output agreement: does the candidate still say what the incumbent says, where users look?

Exact equality of greedy text is too strict (another CUDA version or allreduce algorithm
changes bf16 rounding and greedy outputs part ways after some tokens at near ties) and a
few short prompts see too little. So the agreement has parts (`plan`), each sent to both
sides as greedy requests:

  ids          seeded token-id prompts of 16-48 tokens, 8 at a time (/generate)
  long         prompts at the profile's input_len, answers at its output_len
  busy         one batch at the highest concurrency the profile measures, all at once
  completions  natural-language prompts through the server's tokenizer (/v1/completions)
  chat         the same prompts as chat messages, through its chat template

For the token-id parts the candidate is also teacher-forced on the incumbent's outputs
(the prompt and the output sent back as one list of ids with `return_logprob`,
`logprob_start_len` and `top_logprobs_num`: sglang's /generate answers
`input_token_logprobs` and `input_top_logprobs`), at the part's own concurrency. A benign
divergence keeps that likelihood and that top-k; a kernel computing wrong numbers loses
them. Stackbuild.gate.agreement_judge compares; docs/agreement.md gives the thresholds.

`plan` and `cost` are pure (what the agreement sends, and how long it takes at a tok/s);
`collect`, `teacher_forced` and `run` talk HTTP, and `run` never outlives its deadline.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from stackbuild.errors import InfraError
from stackbuild.gate.agreement_judge import (
    Bars,
    Forced,
    compare_ids,
    compare_text,
    diagnose,
    prefix_len,
)
from stackbuild.gate.loadgen import PROMPT_ID_RANGE
from stackbuild.gate.result import (
    AgreementPart,
    AgreementResult,
    AgreementSample,
    GateResult,
    TextSample,
)
from stackbuild.gate.stats import percentile
from stackbuild.spec.profile import AGREEMENT_ID_PARTS, AGREEMENT_PARALLEL, AgreementSend, GateProfile

PARALLEL = AGREEMENT_PARALLEL
ID_PARTS = AGREEMENT_ID_PARTS
Part = AgreementSend

__all__ = ["PARALLEL", "Part", "collect", "compare", "cost", "forced_body", "generate_body",
           "plan", "prefix_len", "prompts", "run", "teacher_forced"]


def plan(profile: GateProfile) -> tuple[AgreementSend, ...]:
    """What the agreement sends to each side (the profile's own `agreement_parts`)."""
    return profile.agreement_parts()


@dataclass(frozen=True)
class Cost:
    requests: int
    seconds: float


def _rate(tok_s: float | Mapping[int, float], concurrency: int) -> float:
    if not isinstance(tok_s, Mapping):
        return float(tok_s)
    level = min(tok_s, key=lambda c: abs(math.log(c) - math.log(concurrency)))
    return tok_s[level]


def cost(profile: GateProfile, tok_s: float | Mapping[int, float], *,
         live_incumbent: bool = True) -> Cost:
    """Requests the agreement sends and its seconds at `tok_s`: the server's output tok/s, one
    figure, or per concurrency (the gate's levels; the nearest level is used). Both sides
    generate when the incumbent is live; only the candidate is teacher-forced (prefill only,
    counted as one token each). Sides run one after the other."""
    sides = 2 if live_incumbent else 1
    requests, seconds = 0, 0.0
    for p in plan(profile):
        forced = p.name in ID_PARTS
        requests += p.prompts * sides + (p.prompts if forced else 0)
        per_side = p.prompts * p.tokens / max(_rate(tok_s, p.concurrency), 1e-9)
        seconds += per_side * sides + (p.prompts / max(_rate(tok_s, p.concurrency), 1e-9)
                                       if forced else 0.0)
    return Cost(requests, seconds)


# ---- prompts and request bodies ---------------------------------------------------------
def prompts(seed: int, n: int, length: int | None = None, part: str = "ids") -> list[list[int]]:
    """n seeded token-id prompts: 16 to 48 tokens, or `length` each (no tokenizer)."""
    out = []
    for i in range(n):
        key = f"agreement:{seed}:{i}" if part == "ids" else f"agreement:{part}:{seed}:{i}"
        rng = random.Random(key)
        size = rng.randint(16, 48) if length is None else length
        out.append([rng.randrange(*PROMPT_ID_RANGE) for _ in range(size)])
    return out


_ASKS = ("Explain in one paragraph how {} works.", "Write a short story about {}.",
         "List three facts about {}.", "What is the history of {}?",
         "Describe {} to a child.", "Give two arguments for and against {}.")
_TOPICS = ("a lighthouse", "the moon", "compound interest", "bread baking", "a steam engine",
           "the immune system", "chess openings", "rainforests", "the printing press",
           "public transport", "volcanoes", "honey bees")


def text_prompts(seed: int, n: int) -> list[str]:
    """n seeded natural-language prompts (what users send, through the server's tokenizer)."""
    rng = random.Random(f"agreement:text:{seed}")
    return [rng.choice(_ASKS).format(rng.choice(_TOPICS)) for _ in range(n)]


def generate_body(prompt: Sequence[int], max_new_tokens: int, top_k: int = 0) -> dict[str, Any]:
    """A greedy generation that returns the logprob (and top-k) of each output token."""
    body: dict[str, Any] = {"input_ids": list(prompt), "return_logprob": True,
                            "sampling_params": {"max_new_tokens": max_new_tokens,
                                                "temperature": 0.0, "ignore_eos": True}}
    if top_k:
        body["top_logprobs_num"] = top_k
    return body


def forced_body(prompt: Sequence[int], output: Sequence[int], top_k: int = 0) -> dict[str, Any]:
    """Teacher forcing: prompt + output as input; logprobs from the prompt's last token on.

    sglang 0.5.23 puts None first in input_token_logprobs (logprob_result_processor.py,
    `[None] + input_token_logprobs[:-1]`, and :62-80 the same for input_top_logprobs), so
    starting one token early yields exactly one entry per output token after it.
    """
    body: dict[str, Any] = {"input_ids": [*prompt, *output], "return_logprob": True,
                            "logprob_start_len": len(prompt) - 1,
                            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
    if top_k:
        body["top_logprobs_num"] = top_k
    return body


def text_body(part: str, prompt: str, tokens: int, model: str) -> tuple[str, dict[str, Any]]:
    common = {"model": model, "max_tokens": tokens, "temperature": 0.0, "ignore_eos": True}
    if part == "chat":
        return "/v1/chat/completions", {**common,
                                        "messages": [{"role": "user", "content": prompt}]}
    return "/v1/completions", {**common, "prompt": prompt}


# ---- HTTP ---------------------------------------------------------------------------
def _lps(entries: Any, what: str) -> list[float]:
    try:
        return [float(e[0]) for e in entries]
    except (TypeError, ValueError, IndexError):
        raise InfraError(f"/generate: {what} is not a list of (logprob, id, text); "
                         "is this an sglang server?") from None


def _tops(rows: Any) -> tuple[dict[int, float], ...]:
    try:
        return tuple({int(e[1]): float(e[0]) for e in row} if row else {} for row in rows or ())
    except (TypeError, ValueError, IndexError):
        raise InfraError("/generate: top logprobs are not lists of (logprob, id, text)") from None


async def _post(s: aiohttp.ClientSession, url: str, path: str, body: dict[str, Any],
                timeout: float) -> dict[str, Any]:
    try:
        async with s.post(url + path, json=body,
                          timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            data = await r.json(content_type=None)
            if r.status != 200 or not isinstance(data, dict):
                raise InfraError(f"POST {url}{path}: HTTP {r.status}: {str(data)[:200]}")
            return data
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as err:
        raise InfraError(f"POST {url}{path} failed: {type(err).__name__}: {err}") from None


async def _each(url: str, calls: list[tuple[str, dict[str, Any]]], timeout: float,
                parallel: int = PARALLEL) -> list[dict[str, Any]]:
    sem = asyncio.Semaphore(parallel)
    conn = aiohttp.TCPConnector(limit=parallel + 4)
    async with aiohttp.ClientSession(connector=conn) as s:
        async def one(path: str, b: dict[str, Any]) -> dict[str, Any]:
            async with sem:
                return await _post(s, url, path, b, timeout)
        return list(await asyncio.gather(*(one(p, b) for p, b in calls)))


def _part_prompts(p: Part, seed: int) -> list[list[int]]:
    return prompts(seed, p.prompts, p.input_len or None, p.name)


async def collect(url: str, seed: int, n: int, tokens: int, timeout: float = 60.0, *,
                  part: Part | None = None, top_k: int = 0) -> tuple[AgreementSample, ...]:
    """This server's greedy outputs of a part's seeded prompts (default: the ids part of n
    prompts), with its own logprobs, top-k and text."""
    p = part or Part("ids", n, 0, tokens, PARALLEL)
    ps = _part_prompts(p, seed)
    answers = await _each(url, [("/generate", generate_body(x, p.tokens, top_k)) for x in ps],
                          timeout, p.concurrency)
    out = []
    for x, a in zip(ps, answers, strict=True):
        ids = a.get("output_ids")
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            raise InfraError(f"POST {url}/generate: no output_ids in the answer")
        meta = a.get("meta_info") or {}
        lps = _lps(meta.get("output_token_logprobs") or [], "meta_info.output_token_logprobs")
        top = tuple(tuple(d.items()) for d in _tops(meta.get("output_top_logprobs"))) \
            if top_k else ()
        out.append(AgreementSample(prompt=tuple(x), output=tuple(ids), part=p.name,
                                   logprob=statistics.fmean(lps) if lps else 0.0,
                                   text=str(a.get("text", "")), top=top))
    return tuple(out)


async def teacher_forced(url: str, reference: Sequence[AgreementSample], timeout: float = 60.0,
                         *, top_k: int = 0, parallel: int = PARALLEL) -> list[Forced]:
    """This server on each reference output: mean logprob per token and top-k per position."""
    calls = [("/generate", forced_body(r.prompt, r.output, top_k)) for r in reference]
    answers = await _each(url, calls, timeout, parallel)
    out = []
    for r, a in zip(reference, answers, strict=True):
        meta = a.get("meta_info") or {}
        lps = _lps((meta.get("input_token_logprobs") or [])[1:], "meta_info.input_token_logprobs")
        if len(lps) != len(r.output):
            raise InfraError(f"POST {url}/generate: {len(lps)} input logprobs for "
                             f"{len(r.output)} forced tokens; the server ignores logprob_start_len")
        tops = _tops((meta.get("input_top_logprobs") or [])[1:]) if top_k else ()
        out.append(Forced(statistics.fmean(lps) if lps else 0.0, tops))
    return out


async def collect_text(url: str, part: Part, seed: int, model: str, timeout: float
                       ) -> tuple[TextSample, ...]:
    ps = text_prompts(seed, part.prompts)
    answers = await _each(url, [text_body(part.name, x, part.tokens, model) for x in ps],
                          timeout, part.concurrency)
    out = []
    for x, a in zip(ps, answers, strict=True):
        try:
            choice = a["choices"][0]
            text = choice["message"]["content"] if part.name == "chat" else choice["text"]
            used = int((a.get("usage") or {}).get("prompt_tokens") or 0)
        except (KeyError, IndexError, TypeError, ValueError):
            raise InfraError(f"{url}: the {part.name} answer has no choices[0] text: "
                             f"{str(a)[:200]}") from None
        out.append(TextSample(part=part.name, prompt=x, text=str(text or ""), prompt_tokens=used))
    return tuple(out)


async def _side(url: str, profile: GateProfile, parts: Sequence[Part], timeout: float
                ) -> tuple[tuple[AgreementSample, ...], tuple[TextSample, ...]]:
    samples: list[AgreementSample] = []
    texts: list[TextSample] = []
    for p in parts:
        if p.name in ID_PARTS:
            samples += await collect(url, profile.seed, p.prompts, p.tokens, timeout, part=p,
                                     top_k=profile.agreement_top_k)
        else:
            texts += await collect_text(url, p, profile.seed, profile.model, timeout)
    return tuple(samples), tuple(texts)


# ---- verdict ----------------------------------------------------------------------------
def _bars(profile: GateProfile) -> Bars:
    return Bars(min_first_token=profile.min_first_token_agreement,
                max_drop=profile.max_logprob_drop, min_overlap=profile.min_top_k_overlap,
                max_kl=profile.max_top_k_kl, min_text=profile.min_text_agreement)


def compare(reference: Sequence[AgreementSample], candidate: Sequence[AgreementSample],
            forced: Sequence[float] | Sequence[Forced], *, min_first_token: float,
            max_drop: float, bars: Bars | None = None) -> AgreementResult:
    """The ids part's verdict as the result's summary fields; `forced` = the candidate's mean
    logprob of each reference output (or the whole teacher-forced answer)."""
    if not reference:
        return AgreementResult(prompts=len(candidate), samples=tuple(candidate))
    fs = [f if isinstance(f, Forced) else Forced(float(f)) for f in forced]
    bars = bars or Bars(min_first_token=min_first_token, max_drop=max_drop)
    part = compare_ids("ids", reference, candidate, fs, bars, concurrency=PARALLEL)
    prefixes = [prefix_len(r.output, c.output) for r, c in zip(reference, candidate, strict=True)]
    n = len(reference)
    inc_lp = statistics.fmean(r.logprob for r in reference)
    cand_lp = statistics.fmean(f.logprob for f in fs)
    example = ""
    worst = min(range(n), key=lambda i: (prefixes[i], fs[i].logprob))
    if prefixes[worst] < len(reference[worst].output):
        at = prefixes[worst]
        example = (f"prompt #{worst} diverges at token {at}: incumbent ids "
                   f"{list(reference[worst].output[at:at + 6])} vs candidate "
                   f"{list(candidate[worst].output[at:at + 6])} (candidate's logprob of "
                   f"the incumbent's output {fs[worst].logprob:.2f}/token vs the incumbent's own "
                   f"{reference[worst].logprob:.2f})")
    reasons = list(part.reasons)
    if reasons and example:
        reasons.append(f"agreement: e.g. {example}")
    return AgreementResult(
        prompts=n, tokens=part.tokens, compared=True, first_token=part.first_token,
        prefix_p10=percentile(prefixes, 10), prefix_p50=percentile(prefixes, 50),
        prefix_mean=part.prefix_mean, full_match=part.full_match,
        logprob_incumbent=inc_lp, logprob_candidate=cand_lp, logprob_drop=inc_lp - cand_lp,
        passed=not reasons, reasons=tuple(reasons), example=example,
        samples=tuple(candidate))


def judge(profile: GateProfile, parts: Sequence[Part], ref: Sequence[AgreementSample],
          mine: Sequence[AgreementSample], forced: Mapping[str, Sequence[Forced]],
          ref_texts: Sequence[TextSample], my_texts: Sequence[TextSample]) -> AgreementResult:
    """Every compared part, the summary of the ids part, and the causes the parts tell."""
    bars = _bars(profile)
    results: list[AgreementPart] = []
    for p in parts:
        if p.name in ID_PARTS and p.name in forced:
            r = [s for s in ref if s.part == p.name]
            c = [s for s in mine if s.part == p.name]
            results.append(compare_ids(p.name, r, c, forced[p.name], bars,
                                       input_len=p.input_len, concurrency=p.concurrency))
        elif p.name not in ID_PARTS and any(t.part == p.name for t in ref_texts):
            results.append(compare_text(p.name, [t for t in ref_texts if t.part == p.name],
                                        [t for t in my_texts if t.part == p.name], bars,
                                        tokens=p.tokens))
    ids = "ids"
    head = compare([s for s in ref if s.part == ids], [s for s in mine if s.part == ids],
                   forced.get(ids, ()), min_first_token=bars.min_first_token,
                   max_drop=bars.max_drop, bars=bars)
    example = [r for r in head.reasons if r.startswith("agreement: e.g.")]
    reasons = [r for p in results for r in p.reasons]
    reasons += diagnose(results, ref_texts, my_texts) if reasons else []
    return head.model_copy(update=dict(
        compared=True, passed=not reasons, reasons=tuple(reasons + example), parts=tuple(results),
        samples=tuple(mine), texts=tuple(my_texts)))


def _reference(baseline: GateResult | None, parts: Sequence[Part], mine: Sequence[AgreementSample],
               my_texts: Sequence[TextSample]
               ) -> tuple[list[AgreementSample], list[TextSample], list[str]]:
    """The stored incumbent's answers to the same prompts, part by part; notes for the rest."""
    if baseline is None or baseline.agreement is None:
        return [], [], []
    stored = baseline.agreement
    ref: list[AgreementSample] = []
    texts: list[TextSample] = []
    notes = []
    for p in parts:
        if p.name in ID_PARTS:
            theirs = [s for s in stored.samples if s.part == p.name]
            same = [s.prompt for s in theirs] == [s.prompt for s in mine if s.part == p.name]
            ref += theirs if same else []
        else:
            got = [t for t in stored.texts if t.part == p.name]
            same = [t.prompt for t in got] == [t.prompt for t in my_texts if t.part == p.name]
            texts += got if same else []
        if not same:
            notes.append(f"agreement ({p.name}): the baseline's stored outputs are of other prompts "
                         "(seed, lengths or agreement settings differ); not compared")
    return ref, texts, notes


async def _run(url: str, inc_url: str | None, baseline: GateResult | None,
               profile: GateProfile, parts: Sequence[Part], spent: list[int]) -> AgreementResult:
    timeout = profile.timeout_s
    n, tokens = profile.agreement_prompts, profile.agreement_tokens
    mine, my_texts = await _side(url, profile, parts, timeout)
    spent[0] += sum(p.prompts for p in parts)
    notes: list[str] = []
    if inc_url:
        ref_t = await _side(inc_url, profile, parts, timeout)
        spent[0] += sum(p.prompts for p in parts)
        ref, ref_texts = list(ref_t[0]), list(ref_t[1])
    else:
        ref, ref_texts, notes = _reference(baseline, parts, mine, my_texts)
    if not ref and not ref_texts:
        return AgreementResult(prompts=n, tokens=tokens, samples=mine, texts=my_texts,
                               reasons=tuple(notes))
    forced: dict[str, list[Forced]] = {}
    for p in parts:
        theirs = [s for s in ref if s.part == p.name]
        if p.name in ID_PARTS and theirs:
            top_k = profile.agreement_top_k if theirs[0].top else 0
            forced[p.name] = await teacher_forced(url, theirs, timeout, top_k=top_k,
                                                  parallel=p.concurrency)
            spent[0] += len(theirs)
    result = judge(profile, parts, ref, mine, forced, ref_texts, my_texts)
    return result.model_copy(update={"reasons": (*result.reasons, *notes)})


async def run(url: str, inc_url: str | None, baseline: GateResult | None, profile: GateProfile,
              *, deadline: float | None = None) -> AgreementResult | None:
    """The agreement of `url` with the live incumbent, else the baseline's stored answers, else
    a reference run; None when the profile turns agreement off. `deadline` (time.monotonic())
    bounds it: past it, the agreement fails with the cause and what it spent."""
    parts = plan(profile)
    if not parts:
        return None
    start = time.monotonic()
    spent = [0]
    n, tokens = profile.agreement_prompts, profile.agreement_tokens
    left = None if deadline is None else max(0.0, deadline - start)
    try:
        result = await asyncio.wait_for(_run(url, inc_url, baseline, profile, parts, spent), left)
    except TimeoutError:
        result = AgreementResult(prompts=n, tokens=tokens, passed=False, reasons=(
            f"agreement: not finished by the gate's deadline ({time.monotonic() - start:.0f}s "
            f"spent, {spent[0]} requests answered)",))
    except InfraError as err:
        result = AgreementResult(prompts=n, tokens=tokens, passed=False,
                                 reasons=(f"agreement: {err}",))
    return result.model_copy(update={"requests": spent[0],
                                     "seconds": round(time.monotonic() - start, 3)})
