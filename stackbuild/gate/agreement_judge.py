"""Output agreement, the pure part: how the candidate's answers compare with the incumbent's.

Per part of the agreement (stackbuild.gate.agreement.plan):
  token-id parts (ids, long, busy)  first-token agreement, exact prefixes, the candidate's
      teacher-forced likelihood of the incumbent's greedy outputs, its top-k along that
      path against the incumbent's own (overlap, and a KL bound), and the exact check that
      the same token ids came with the same text;
  text parts (completions, chat)  agreement on each answer's first characters and the
      share of identical prefix characters, plus the prompt token counts.
Thresholds and why: docs/agreement.md. A cause names what differed: a tokenizer or
detokenizer (same ids, other text), a chat template (chat differs, completions agree),
long prompts or concurrency (that part fails while the short, sequential one agrees).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from stackbuild.gate.result import AgreementPart, AgreementSample, TextSample

FIRST_CHARS = 8  # text answers "agree at the start" when their first 8 characters do


@dataclass(frozen=True)
class Bars:
    min_first_token: float = 0.75
    max_drop: float = 0.5
    min_overlap: float = 0.8
    max_kl: float = 0.1
    min_text: float = 0.75


@dataclass(frozen=True)
class Forced:
    """The candidate on one incumbent output, teacher-forced: its mean logprob per token and
    its top-k (id -> logprob) at each position."""

    logprob: float
    top: tuple[dict[int, float], ...] = ()


def prefix_len(a: Sequence[int] | str, b: Sequence[int] | str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def top_k_stats(ref: AgreementSample, cand: Forced) -> tuple[list[float], list[float]]:
    """Per position of the incumbent's output: the share of its top-k the candidate also has
    in its top-k, and sum over the incumbent's top-k of p (log p - log q). A token outside the
    candidate's top-k gets the candidate's k-th logprob, an upper bound on q, so the sum
    bounds the top-k part of KL(incumbent || candidate) from below."""
    overlaps, kls = [], []
    for mine, theirs in zip(ref.top, cand.top, strict=False):
        if not mine or not theirs:
            continue
        floor = min(theirs.values())
        overlaps.append(sum(1 for t, _ in mine if t in theirs) / len(mine))
        kls.append(max(0.0, sum(math.exp(lp) * (lp - theirs.get(t, floor)) for t, lp in mine)))
    return overlaps, kls


def _part_label(name: str, input_len: int, tokens: int, concurrency: int) -> str:
    if name == "long":
        return f"agreement on {input_len}-token prompts, {tokens} tokens out"
    if name == "busy":
        return f"agreement at {concurrency} requests in flight"
    return "agreement"


def compare_ids(name: str, ref: Sequence[AgreementSample], cand: Sequence[AgreementSample],
                forced: Sequence[Forced], bars: Bars, *, input_len: int = 0,
                concurrency: int = 1) -> AgreementPart:
    """One token-id part; `forced[i]`: the candidate teacher-forced on ref[i]'s output."""
    n = len(ref)
    tokens = max((len(r.output) for r in ref), default=0)
    base = AgreementPart(name=name, prompts=n, tokens=tokens, input_len=input_len,
                         concurrency=concurrency)
    if not n:
        return base
    prefixes = [prefix_len(r.output, c.output) for r, c in zip(ref, cand, strict=True)]
    first = sum(1 for p in prefixes if p > 0) / n
    full = sum(1 for r, p in zip(ref, prefixes, strict=True) if p == len(r.output)) / n
    inc_lp = statistics.fmean(r.logprob for r in ref)
    cand_lp = statistics.fmean(f.logprob for f in forced)
    drop = inc_lp - cand_lp
    overlaps, kls = [], []
    for r, f in zip(ref, forced, strict=True):
        o, k = top_k_stats(r, f)
        overlaps += o
        kls += k
    overlap = statistics.fmean(overlaps) if overlaps else None
    kl = statistics.fmean(kls) if kls else None
    # a stored reference from before texts were kept has none: nothing to compare with
    other = [i for i, (r, c) in enumerate(zip(ref, cand, strict=True))
             if r.text and r.output == c.output and r.text != c.text]
    label = _part_label(name, input_len, tokens, concurrency)
    reasons = []
    if other:
        i = other[0]
        reasons.append(f"{label}: the same token ids came back as other text in {len(other)} of "
                       f"{n} outputs (prompt #{i}: {ref[i].text[:40]!r} vs {cand[i].text[:40]!r}): "
                       "the tokenizer or detokenizer changed")
    if drop > bars.max_drop:
        reasons.append(f"{label}: the candidate gives the incumbent's greedy outputs "
                       f"{cand_lp:.2f} nats/token vs the incumbent's own {inc_lp:.2f} (drop "
                       f"{drop:.2f}, allowed {bars.max_drop:g}): it computes other numbers")
    if first < bars.min_first_token:
        reasons.append(f"{label}: first tokens agree on {first:.0%} of {n} prompts (at least "
                       f"{bars.min_first_token:.0%} required)")
    if overlap is not None and overlap < bars.min_overlap:
        reasons.append(f"{label}: the candidate ranks {overlap:.0%} of the incumbent's top-"
                       f"{len(ref[0].top[0]) if ref[0].top else 0} in its own (at least "
                       f"{bars.min_overlap:.0%} required)")
    if kl is not None and kl > bars.max_kl:
        reasons.append(f"{label}: KL(incumbent || candidate) over the incumbent's top-k is "
                       f"{kl:.3f} nats per token (allowed {bars.max_kl:g})")
    return base.model_copy(update=dict(
        first_token=first, prefix_mean=statistics.fmean(prefixes), full_match=full,
        logprob_drop=drop, top_k_overlap=overlap, kl=kl, other_text=len(other),
        passed=not reasons, reasons=tuple(reasons)))


def compare_text(name: str, ref: Sequence[TextSample], cand: Sequence[TextSample],
                 bars: Bars, *, tokens: int) -> AgreementPart:
    n = len(ref)
    base = AgreementPart(name=name, prompts=n, tokens=tokens, concurrency=0)
    if not n:
        return base
    agree = [r.text[:FIRST_CHARS] == c.text[:FIRST_CHARS] for r, c in zip(ref, cand, strict=True)]
    shares = [prefix_len(r.text, c.text) / max(1, len(r.text)) for r, c in zip(ref, cand, strict=True)]
    first = sum(agree) / n
    full = sum(1 for r, c in zip(ref, cand, strict=True) if r.text == c.text) / n
    reasons = []
    if first < bars.min_text:
        i = agree.index(False)
        route = "/v1/chat/completions" if name == "chat" else "/v1/completions"
        reasons.append(f"agreement ({route}): {first:.0%} of {n} text answers agree on their first "
                       f"{FIRST_CHARS} characters (at least {bars.min_text:.0%} required), e.g. "
                       f"{ref[i].prompt[:30]!r}: {ref[i].text[:30]!r} vs {cand[i].text[:30]!r}")
    return base.model_copy(update=dict(first_token=first, prefix_mean=statistics.fmean(shares),
                                       full_match=full, passed=not reasons,
                                       reasons=tuple(reasons)))


def _tokens(samples: Sequence[TextSample]) -> float:
    return statistics.fmean(s.prompt_tokens for s in samples) if samples else 0.0


def diagnose(parts: Sequence[AgreementPart], ref_text: Sequence[TextSample],
             cand_text: Sequence[TextSample]) -> list[str]:
    """Causes that only the parts together tell: which change makes exactly these fail."""
    by = {p.name: p for p in parts}
    ok = {name: p.passed for name, p in by.items()}
    out = []
    ref_c = [s for s in ref_text if s.part == "completions"]
    cand_c = [s for s in cand_text if s.part == "completions"]
    if ref_c and [s.prompt_tokens for s in ref_c] != [s.prompt_tokens for s in cand_c]:
        out.append(f"agreement: the same text prompts count {_tokens(cand_c):.1f} tokens on "
                   f"average on the candidate vs {_tokens(ref_c):.1f} on the incumbent: the "
                   "tokenizer changed")
    if not ok.get("chat", True) and ok.get("completions", True) and ok.get("ids", True):
        ref_t = [s for s in ref_text if s.part == "chat"]
        cand_t = [s for s in cand_text if s.part == "chat"]
        out.append(f"agreement: chat answers differ while completions of the same prompts "
                   f"agree (chat prompts of {_tokens(cand_t):.1f} tokens on the candidate vs "
                   f"{_tokens(ref_t):.1f} on the incumbent): the chat template changed")
    if ok.get("ids", True):
        if not ok.get("long", True):
            out.append("agreement: wrong only for long prompts: short prompts agree, prompts of "
                       f"{by['long'].input_len} tokens do not")
        elif not ok.get("busy", True):
            calm = by["ids"].concurrency if "ids" in by else 1
            out.append(f"agreement: wrong only under concurrency: {calm} requests in flight "
                       f"agree, {by['busy'].concurrency} do not")
    return out
