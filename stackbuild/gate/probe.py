"""The correctness probe: greedy prompts whose output must look like text and match.

`check_outputs` is pure (unit-tested exactly); `run_probe` fetches the outputs.
"""

from __future__ import annotations

from collections.abc import Sequence

import aiohttp

from stackbuild.effects import http
from stackbuild.errors import InfraError
from stackbuild.gate.result import ProbeResult

REPEAT_SHARE = 0.8  # one token making up this share of a long output is degenerate
MIN_TOKENS_FOR_REPEAT = 4


def problems(text: str) -> list[str]:
    """What is wrong with one output; empty list when it looks like text."""
    if not text.strip():
        return ["empty output"]
    out = []
    if "\ufffd" in text:
        out.append("replacement characters (U+FFFD) in the output")
    pieces = text.split() if " " in text.strip() else list(text.strip())
    if len(pieces) >= MIN_TOKENS_FOR_REPEAT:
        top = max(pieces.count(p) for p in set(pieces))
        if top / len(pieces) >= REPEAT_SHARE:
            out.append(f"one token repeated ({top} of {len(pieces)})")
    return out


def check_outputs(
    prompts: Sequence[str], outputs: Sequence[str], reference: Sequence[str] | None
) -> ProbeResult:
    reasons: list[str] = []
    for prompt, text in zip(prompts, outputs, strict=True):
        reasons += [f"probe {prompt!r}: {p}" for p in problems(text)]
    if reference is not None:
        if len(reference) != len(outputs):
            reasons.append(
                f"probe: reference has {len(reference)} outputs for {len(outputs)} prompts; "
                "re-record the golden texts"
            )
        else:
            for prompt, got, want in zip(prompts, outputs, reference, strict=True):
                if got != want:
                    reasons.append(f"probe {prompt!r}: output differs from the incumbent's "
                                   f"({got[:40]!r} vs {want[:40]!r})")
    return ProbeResult(passed=not reasons, outputs=tuple(outputs), reasons=tuple(reasons))


async def fetch_outputs(
    url: str, prompts: Sequence[str], max_tokens: int, *, model: str = "default"
) -> list[str]:
    async with aiohttp.ClientSession() as session:
        return [await _complete(session, url, p, max_tokens, model) for p in prompts]


async def _complete(session: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int, model: str) -> str:
    """One greedy /v1/completions call on the gate's own async client (the probe runs under the
    gate's deadline, and only a coroutine can be cut off there)."""
    request = http.completion_request(prompt, max_tokens, model)
    try:
        async with session.post(url + "/v1/completions", json=request, timeout=aiohttp.ClientTimeout(total=60)) as r:
            status, body = r.status, await r.read()
    except (aiohttp.ClientError, OSError, TimeoutError) as err:
        raise http.NoAnswer("POST", f"{url}/v1/completions", f"{type(err).__name__}: {err}") from None
    return http.completion_text(url, status, body)


async def run_probe(
    url: str,
    prompts: Sequence[str],
    max_tokens: int,
    *,
    reference: Sequence[str] | None,
    model: str = "default",
) -> ProbeResult:
    try:
        outputs = await fetch_outputs(url, prompts, max_tokens, model=model)
    except InfraError as err:
        return ProbeResult(passed=False, reasons=(f"probe: {err}",))
    return check_outputs(prompts, outputs, reference)
