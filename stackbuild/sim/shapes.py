"""SGLang 0.5.23's response bodies, as pure functions returning plain dicts.

Each says which model of the wheel it mirrors and how sglang serializes it, because the
serialization decides which keys appear: pydantic `model_dump_json()` keeps None fields
unless a model's own serializer drops them; `exclude_none=True` drops them all; the chat
stream's msgspec structs (openai/sse_utils.py) omit defaults except `reasoning_content`.
Paths are under sglang/srt/ of the wheel. tests/test_sim_conformance.py validates these
bodies with the wheel's own models.
"""

from __future__ import annotations

import time
from typing import Any

from stackbuild.sim import lm
from stackbuild.sim.api import BadRequest, GenParams, Route

WEIGHT_VERSION = "default"  # server_args weight_version's default


def error_body(route: Route, err: BadRequest) -> dict[str, Any]:
    """The 400 body of a refused request (see stackbuild.sim.api for the three shapes)."""
    if route == "generate" and err.shape == "contract":
        return {"error": str(err)}
    if route == "generate" and err.shape == "value":
        return {"error": {"message": str(err)}}
    kind = "Bad Request" if err.shape == "validation" else "BadRequestError"
    return error_response(400, str(err), kind)


def error_response(status: int, message: str, kind: str) -> dict[str, Any]:
    # openai/protocol.py:106-111 ErrorResponse, model_dump()
    return {"object": "error", "message": message, "type": kind, "param": None, "code": status}


def finish_reason(done: bool, stopped: bool, n: int, stop_id: int) -> dict[str, Any] | None:
    if not done:
        return None
    if stopped:
        return {"type": "stop", "matched": stop_id}
    return {"type": "length", "length": n}


def meta_info(p: GenParams, completion: int, fr: dict[str, Any] | None, started: float,
              accept: float | None) -> dict[str, Any]:
    """managers/tokenizer_manager.py:2507-2560 (_handle_batch_output), in its key order."""
    info: dict[str, Any] = {
        "id": p.rid,
        "finish_reason": fr,
        "prompt_tokens": p.prompt_tokens,
        "weight_version": p.weight_version,
        "num_retractions": 0,
        "reasoning_tokens": 0,
        "completion_tokens": completion,
        "cached_tokens": 0,
    }
    if fr is not None:  # only the final chunk carries them (tokenizer_manager.py:2742-2756)
        info["e2e_latency"] = time.monotonic() - started
        if accept is not None:
            info["spec_accept_length"] = accept
    return info


def _entries(pairs: list[tuple[float, int]]) -> list[list[Any]]:
    return [[lp, t, None] for lp, t in pairs]


def logprob_fields(p: GenParams, out_ids: list[int], out_lps: list[float],
                   out_tops: list[list[tuple[float, int]]], numerics: lm.Numerics
                   ) -> dict[str, Any]:
    """meta_info's logprob fields (tokenizer_manager.py:2840-2970 add_logprob_to_meta_info):
    (logprob, token_id, None) without return_text_in_logprobs (:3104-3108); input ones from
    logprob_start_len on, the first None (scheduler_components/logprob_result_processor.py:
    37-38, and :62-80 for the top ones); with top_logprobs_num the top-k lists too."""
    inputs: list[list[Any]] = []
    in_tops: list[list[list[Any]] | None] = []
    if p.ids is not None and 0 <= p.logprob_start_len < len(p.ids):
        ids = list(p.ids)
        scored, tops = lm.score(ids, p.logprob_start_len, numerics, p.top_logprobs_num)
        inputs = [[lp, t, None] for lp, t in zip(scored, ids[p.logprob_start_len:], strict=True)]
        in_tops = [None if t is None else _entries(t) for t in tops]
    outputs = [[lp, t, None] for lp, t in zip(out_lps, out_ids, strict=False)]
    out: dict[str, Any] = {"input_token_logprobs": inputs, "output_token_logprobs": outputs,
                           "output_token_logprobs_length": len(outputs)}
    if p.top_logprobs_num > 0:
        out["input_top_logprobs"] = in_tops
        out["output_top_logprobs"] = [_entries(t) for t in out_tops[:len(out_ids)]]
    return out


def usage(p: GenParams, prompt_tokens: int, completion: int) -> dict[str, Any]:
    """protocol.py:221-229 UsageInfo as openai/usage_processor.py:96-131 fills it; no cache
    report, no reasoning: the details are None."""
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion,
            "completion_tokens": completion, "prompt_tokens_details": None,
            "reasoning_tokens": 0, "completion_tokens_details": None}


def _matched(fr: dict[str, Any] | None) -> int | str | None:
    return fr.get("matched") if fr else None


def _envelope(p: GenParams, obj: str, created: int, choices: list[dict[str, Any]]
              ) -> dict[str, Any]:
    return {"id": p.rid, "object": obj, "created": created, "model": p.model, "choices": choices}


def completion_chunk(p: GenParams, created: int, index: int, delta: str,
                     fr: dict[str, Any] | None) -> dict[str, Any]:
    """openai/serving_completions.py:370-403: CompletionStreamResponse.model_dump_json()
    (protocol.py:546-582: usage None stays, sglext and the choice's None ids are dropped)."""
    choice = {"index": index, "text": delta, "logprobs": None,
              "finish_reason": None if fr is None else fr["type"], "matched_stop": _matched(fr)}
    return {**_envelope(p, "text_completion", created, [choice]), "usage": None}


def completion_usage_chunk(p: GenParams, created: int, prompt_tokens: int, completion: int
                           ) -> dict[str, Any]:
    """serving_completions.py:480-496: model_dump_json(exclude_none=True)."""
    u = {k: v for k, v in usage(p, prompt_tokens, completion).items() if v is not None}
    return {**_envelope(p, "text_completion", created, []), "usage": u}


def chat_chunk(p: GenParams, created: int, index: int, *, role: bool = False,
               content: str | None = None, fr: dict[str, Any] | None = None) -> dict[str, Any]:
    """openai/sse_utils.py:13-99 build_sse_content (msgspec, omit_defaults): the delta always
    has reasoning_content (null), role and content only when set; no usage key. Sent as the
    role chunk {role: assistant, content: ""} (serving_chat.py:2569-2583), content chunks
    without finish_reason (:1031-1050), then one chunk with only the finish_reason
    (:2609-2626)."""
    delta: dict[str, Any] = {"reasoning_content": None}
    if role:
        delta.update(role="assistant", content="")
    elif content is not None:
        delta["content"] = content
    choice = {"index": index, "delta": delta, "logprobs": None,
              "finish_reason": None if fr is None else fr["type"], "matched_stop": _matched(fr)}
    return _envelope(p, "chat.completion.chunk", created, [choice])


def chat_usage_chunk(p: GenParams, created: int, prompt_tokens: int, completion: int
                     ) -> dict[str, Any]:
    """serving_chat.py:2766-2796: ChatCompletionStreamResponse.model_dump_json()."""
    return {**_envelope(p, "chat.completion.chunk", created, []),
            "usage": usage(p, prompt_tokens, completion)}


def full(p: GenParams, created: int, answers: list[tuple[str, dict[str, Any] | None]],
         prompt_tokens: int, completion: int) -> dict[str, Any]:
    """A non-streamed answer, one choice per (text, finish_reason): CompletionResponse
    (serving_completions.py:532-646) or ChatCompletionResponse (serving_chat.py:2832-3051),
    through utils/json_response.py:34-41 model_dump_json(by_alias=True)."""
    choices: list[dict[str, Any]] = []
    for i, (text, fr) in enumerate(answers):
        reason = None if fr is None else fr["type"]
        if p.route == "chat":
            msg = {"role": "assistant", "content": text, "reasoning_content": None}
            choices.append({"index": i, "message": msg, "logprobs": None,
                            "finish_reason": reason, "matched_stop": _matched(fr)})
        else:
            choices.append({"index": i, "text": text, "logprobs": None,
                            "finish_reason": reason, "matched_stop": _matched(fr)})
    obj = "chat.completion" if p.route == "chat" else "text_completion"
    return {**_envelope(p, obj, created, choices), "usage": usage(p, prompt_tokens, completion),
            "metadata": {"weight_version": p.weight_version}}
