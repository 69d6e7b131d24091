"""SGLang's request and response shapes (0.5.23 field names), as pure functions.

Requests are parsed into one `GenParams`; responses are built as plain dicts for
/generate (native), /v1/completions and /v1/chat/completions (OpenAI style).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

from stackbuild.sim import lm
from stackbuild.sim.text import count_prompt_tokens, prompt_key

Route = Literal["generate", "completions", "chat"]


class BadRequest(ValueError):
    pass


@dataclass(frozen=True)
class GenParams:
    route: Route
    rid: str
    key: bytes
    prompt_tokens: int
    max_new_tokens: int | None  # None: until EOS or the context ends (chat's default)
    temperature: float
    ignore_eos: bool
    stream: bool
    include_usage: bool
    model: str
    # the prompt as given (ids for token-id prompts), for the language model and logprobs
    text: str | None = None
    ids: tuple[int, ...] | None = None
    return_logprob: bool = False
    logprob_start_len: int = -1


def _int(v: Any, name: str, default: int | None) -> int | None:
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise BadRequest(f"{name} must be a non-negative integer")
    return v


def _float(v: Any, name: str, default: float) -> float:
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise BadRequest(f"{name} must be a number")
    return float(v)


def _prompt(text: Any, ids: Any) -> tuple[str | None, list[int] | None]:
    if ids is not None:
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            raise BadRequest("input_ids must be a list of integers (one prompt)")
        return None, ids
    if isinstance(text, str):
        return text, None
    if isinstance(text, list) and text and all(isinstance(i, int) for i in text):
        return None, text
    if isinstance(text, list) and len(text) == 1:
        return _prompt(text[0], None)
    raise BadRequest("prompt must be a string or a list of token ids (one prompt)")


def parse(route: Route, body: Any, rid: str, served_model: str) -> GenParams:
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    if route == "generate":
        sp = body.get("sampling_params") or {}
        if not isinstance(sp, dict):
            raise BadRequest("sampling_params must be an object")
        text, ids = _prompt(body.get("text"), body.get("input_ids"))
        max_new = _int(sp.get("max_new_tokens"), "max_new_tokens", 128)
        temp = _float(sp.get("temperature"), "temperature", 1.0)
        ignore_eos = bool(sp.get("ignore_eos", False))
        rid = str(body.get("rid") or rid)
        include_usage = False
        return_logprob = bool(body.get("return_logprob", False))
        # io_struct.py: logprob_start_len None means -1 (output tokens only)
        start_len = body.get("logprob_start_len")
        logprob_start = -1 if start_len is None else start_len
        if isinstance(logprob_start, bool) or not isinstance(logprob_start, int) \
                or logprob_start < -1:
            raise BadRequest("logprob_start_len must be an integer >= -1")
    else:
        if route == "chat":
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                raise BadRequest("messages must be a non-empty list")
            text = "\n".join(str(m.get("content", "")) for m in msgs if isinstance(m, dict))
            ids = None
            max_raw = body.get("max_completion_tokens", body.get("max_tokens"))
        else:
            text, ids = _prompt(body.get("prompt"), None)
            max_raw = body.get("max_tokens")
        # protocol.py: completions max_tokens defaults to 16, chat's to None
        max_new = _int(max_raw, "max_tokens", None if route == "chat" else 16)
        temp = _float(body.get("temperature"), "temperature", 1.0)
        ignore_eos = bool(body.get("ignore_eos", False))
        return_logprob, logprob_start = False, -1
        opts = body.get("stream_options") or {}
        include_usage = bool(isinstance(opts, dict) and opts.get("include_usage"))
    return GenParams(
        route=route,
        rid=rid,
        key=prompt_key(text, ids),
        prompt_tokens=count_prompt_tokens(text, ids),
        max_new_tokens=max_new,
        temperature=temp,
        ignore_eos=ignore_eos,
        stream=bool(body.get("stream", False)),
        include_usage=include_usage,
        model=str(body.get("model") or served_model),
        text=text,
        ids=None if ids is None else tuple(ids),
        return_logprob=return_logprob,
        logprob_start_len=logprob_start,
    )


def finish_reason(done: bool, stopped: bool, n: int, stop_id: int) -> dict[str, Any] | None:
    if not done:
        return None
    if stopped:
        return {"type": "stop", "matched": stop_id}
    return {"type": "length", "length": n}


def meta_info(
    p: GenParams, completion: int, fr: dict[str, Any] | None, started: float, accept: float | None
) -> dict[str, Any]:
    info: dict[str, Any] = {
        "id": p.rid,
        "finish_reason": fr,
        "prompt_tokens": p.prompt_tokens,
        "completion_tokens": completion,
        "cached_tokens": 0,
    }
    if fr is not None:  # only the final chunk carries them
        info["e2e_latency"] = time.monotonic() - started
        if accept is not None:
            info["spec_accept_length"] = accept
    return info


def logprob_fields(p: GenParams, out_ids: list[int], out_lps: list[float],
                   numerics: lm.Numerics) -> dict[str, Any]:
    """meta_info's logprob fields: lists of (logprob, token_id, None) as tokenizer_manager.py
    builds them without return_text_in_logprobs; input ones from logprob_start_len on, the
    first of them None (logprob_result_processor.py prepends it)."""
    inputs: list[list[Any]] = []
    if p.ids is not None and 0 <= p.logprob_start_len < len(p.ids):
        ids = list(p.ids)
        scored = lm.score(ids, p.logprob_start_len, numerics)
        inputs = [[lp, t, None] for lp, t in zip(scored, ids[p.logprob_start_len:], strict=True)]
    outputs = [[lp, t, None] for lp, t in zip(out_lps, out_ids, strict=False)]
    return {"input_token_logprobs": inputs, "output_token_logprobs": outputs,
            "output_token_logprobs_length": len(outputs)}


def usage(p: GenParams, completion: int) -> dict[str, Any]:
    return {
        "prompt_tokens": p.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": p.prompt_tokens + completion,
        "prompt_tokens_details": None,
    }


def _oai_reason(fr: dict[str, Any] | None) -> str | None:
    return None if fr is None else str(fr["type"])


def _envelope(p: GenParams, obj: str, created: int, choices: list[dict[str, Any]],
              usage_: dict[str, Any] | None) -> dict[str, Any]:
    return {"id": p.rid, "object": obj, "created": created, "model": p.model,
            "choices": choices, "usage": usage_}


def oai_chunk(
    p: GenParams, created: int, delta: str, fr: dict[str, Any] | None, role: bool = False
) -> dict[str, Any]:
    reason = _oai_reason(fr)
    if p.route == "chat":
        # serving_chat.py sends {role: assistant, content: ""} as a chunk of its own first
        d: dict[str, Any] = {"role": "assistant", "content": ""} if role else {"content": delta}
        choice: dict[str, Any] = {"index": 0, "delta": d, "logprobs": None, "finish_reason": reason}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": reason}
        obj = "text_completion"
    choice["matched_stop"] = None
    return _envelope(p, obj, created, [choice], None)


def oai_usage_chunk(p: GenParams, created: int, completion: int) -> dict[str, Any]:
    obj = "chat.completion.chunk" if p.route == "chat" else "text_completion"
    return _envelope(p, obj, created, [], usage(p, completion))


def oai_full(
    p: GenParams, created: int, text: str, fr: dict[str, Any] | None, completion: int
) -> dict[str, Any]:
    reason = _oai_reason(fr)
    if p.route == "chat":
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                  "logprobs": None, "finish_reason": reason}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        obj = "text_completion"
    choice["matched_stop"] = None
    return _envelope(p, obj, created, [choice], usage(p, completion))
