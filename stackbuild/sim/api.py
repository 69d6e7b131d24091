"""SGLang's request shapes (0.5.23 field names) and its refusals, as pure functions.

Requests are parsed into one `GenParams` per prompt (a batch is several); responses are
built in stackbuild.sim.shapes. Paths in comments are under sglang/srt/ of the
sglang==0.5.23 wheel.

A refused request is a `BadRequest` whose `shape` says which of sglang's error bodies it
gets (stackbuild.sim.shapes.error_body):
  validation  the body does not parse into the route's request model: FastAPI raises
              RequestValidationError and entrypoints/http_server.py:635-692 answers an
              ErrorResponse with type "Bad Request" on every route
  contract    /generate only: the JSON contract check (http_server.py:936-939,
              entrypoints/api_contract.py) answers {"error": "<serde text>"}
  value       a ValueError while serving: /generate answers {"error": {"message"}}
              (http_server.py:988-990, :2246-2250), the OpenAI routes an ErrorResponse
              with type "BadRequestError" (openai/serving_base.py:205-221)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from stackbuild.sim.text import chat_prompt, count_prompt_tokens, prompt_key

Route = Literal["generate", "completions", "chat"]
Shape = Literal["validation", "contract", "value"]

# api/v1/api_types.py SamplingParams ("unknown keys rejected"): the keys /generate admits
SAMPLING_KEYS = (
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k",
    "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens",
    "n", "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "no_stop_trim", "stream_interval", "logit_bias",
    "sampling_seed", "custom_params", "beam_width", "watermark", "choice",
)


class BadRequest(ValueError):
    def __init__(self, message: str, shape: Shape = "value") -> None:
        super().__init__(message)
        self.shape: Shape = shape


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
    top_logprobs_num: int = 0
    index: int = 0  # the prompt's place in a batch
    # server_args.weight_version (--weight-version, default "default"): every answer's meta_info and
    # metadata carry it, as /get_model_info and /server_info do; stackbuild's units set it to the
    # unit's systemd InvocationID, so a deploy can tell its candidate's process from any other
    weight_version: str = "default"


@dataclass(frozen=True)
class Parsed:
    items: tuple[GenParams, ...]
    batch: bool  # prompts given as a list: /generate answers a list, OpenAI one choice each


def _validation(field: str, msg: str, value: Any) -> BadRequest:
    # the shape of one pydantic error as FastAPI's RequestValidationError carries it
    err = {"type": "value_error", "loc": ("body", field), "msg": msg, "input": value}
    return BadRequest(f"1 validation error:\n  {err}\n [{err}]", "validation")


def _unexpected(v: Any) -> str:
    """How serde names a JSON value in its errors (what the contract check answers)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"boolean `{str(v).lower()}`"
    if isinstance(v, int):
        return f"integer `{v}`"
    if isinstance(v, float):
        return f"floating point `{v}`"
    if isinstance(v, str):
        return f'string "{v}"'
    return "sequence" if isinstance(v, list) else "map"


def _contract(sp: dict[str, Any]) -> None:
    """The sampling params the simulator reads, checked as the JSON contract does."""
    for k in sp:
        if k not in SAMPLING_KEYS:
            listed = ", ".join(f"`{f}`" for f in SAMPLING_KEYS)
            raise BadRequest(f"unknown field `{k}`, expected one of {listed}", "contract")
    kinds: dict[str, tuple[tuple[type, ...], str]] = {
        "max_new_tokens": ((int,), "i64"), "temperature": ((int, float), "f64"),
        "ignore_eos": ((bool,), "a boolean")}
    for k, (kind, name) in kinds.items():
        v = sp.get(k)
        if v is not None and (not isinstance(v, kind) or (bool not in kind and isinstance(v, bool))):
            raise BadRequest(f"invalid type: {_unexpected(v)}, expected {name}", "contract")


def _ids_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in v)


def _prompts_generate(body: dict[str, Any]) -> tuple[list[str | list[int]], bool]:
    ids, text = body.get("input_ids"), body.get("text")
    if ids is not None:
        # managers/io_struct.py:188-191 input_ids: list[int] | list[list[int]], checked by
        # utils/field_validators.py:58-81
        if not isinstance(ids, list):
            raise _validation("input_ids", f"Value error, must be list or null; got "
                              f"{type(ids).__name__}", ids)
        if ids and isinstance(ids[0], list):
            if not all(_ids_list(r) for r in ids):
                raise _validation("input_ids", "Value error, rows must be lists of int", ids)
            return list(ids), True
        if not _ids_list(ids):
            raise _validation("input_ids", "Value error, elements must be int or list", ids)
        return [ids], False
    if isinstance(text, str):
        return [text], False
    if isinstance(text, list) and all(isinstance(t, str) for t in text):
        return list(text), True
    if text is not None:
        raise _validation("text", "Input should be a valid string", text)
    # io_struct.py normalize_batch_and_arguments
    raise BadRequest("Either text, input_ids or input_embeds should be provided.")


def _prompts_completions(body: dict[str, Any]) -> tuple[list[str | list[int]], bool]:
    # openai/protocol.py:371 prompt: list[int] | list[list[int]] | str | list[str]
    prompt = body.get("prompt")
    if "prompt" not in body:
        raise _validation("prompt", "Field required", body)
    ok = isinstance(prompt, str) or _ids_list(prompt) or (
        isinstance(prompt, list) and (all(isinstance(p, str) for p in prompt)
                                      or all(_ids_list(p) for p in prompt)))
    if not ok:
        raise _validation("prompt", "Input should be a valid string", prompt)
    # openai/serving_completions.py:63-69 _validate_request
    if not prompt or (isinstance(prompt, list) and all(not p for p in prompt)):
        raise BadRequest("Prompt cannot be empty")
    if isinstance(prompt, str) or _ids_list(prompt):
        return [prompt], False
    return list(prompt), True


def _content(m: Any) -> tuple[str, str]:
    if not isinstance(m, dict):
        raise _validation("messages", "Input should be a valid dictionary", m)
    c = m.get("content")
    if isinstance(c, list):  # content parts: the text ones
        c = "".join(str(p.get("text", "")) for p in c if isinstance(p, dict))
    return str(m.get("role", "user")), "" if c is None else str(c)


def _int(v: Any, name: str, default: int | None) -> int | None:
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise _validation(name, "Input should be a valid integer", v)
    return v


def _float(v: Any, name: str, default: float) -> float:
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise _validation(name, "Input should be a valid number", v)
    return float(v)


def parse(route: Route, body: Any, rid: str, served_model: str, *,
          default_system: bool = False, weight_version: str = "default") -> Parsed:
    """One GenParams per prompt; `default_system`: the chat template's fault (sim.faults)."""
    if not isinstance(body, dict):
        raise _validation("body", "Input should be a valid dictionary or object", body)
    include_usage = False
    if route == "generate":
        prompts, batch = _prompts_generate(body)
        sps = body.get("sampling_params") or {}
        if isinstance(sps, dict):
            sps = [sps] * len(prompts)
        if not isinstance(sps, list) or not all(isinstance(s, dict) for s in sps) \
                or len(sps) != len(prompts):
            raise _validation("sampling_params", "Input should be a valid dictionary", sps)
        for s in sps:
            _contract(s)
        sp = sps[0]
        # api/v1/api_types.py SamplingParams: max_new_tokens defaults to 128, temperature to 1.0
        max_new = _int(sp.get("max_new_tokens"), "max_new_tokens", 128)
        temp = _float(sp.get("temperature"), "temperature", 1.0)
        ignore_eos = bool(sp.get("ignore_eos", False))
        rid = str(body.get("rid") or rid)
        return_logprob = bool(body.get("return_logprob", False))
        # io_struct.py:231-235: logprob_start_len None means -1 (output tokens only)
        start = _int(body.get("logprob_start_len"), "logprob_start_len", -1)
        top_k = _int(body.get("top_logprobs_num"), "top_logprobs_num", 0)
    else:
        if route == "chat":
            msgs = body.get("messages")
            if not isinstance(msgs, list):
                raise _validation("messages", "Field required", msgs)
            # openai/serving_chat.py:1103-1106
            if not msgs:
                raise BadRequest("Messages cannot be empty.")
            prompts, batch = [chat_prompt([_content(m) for m in msgs],
                                          default_system=default_system)], False
            max_raw = body.get("max_completion_tokens", body.get("max_tokens"))
        else:
            prompts, batch = _prompts_completions(body)
            max_raw = body.get("max_tokens")
        # protocol.py:378: completions max_tokens defaults to 16 and (:448-453) must be
        # positive; chat's defaults to None (:928-932)
        max_new = _int(max_raw, "max_tokens", None if route == "chat" else 16)
        if route == "completions" and max_new is not None and max_new <= 0:
            raise _validation("max_tokens", "Value error, max_tokens must be positive", max_new)
        temp = _float(body.get("temperature"), "temperature", 1.0)
        ignore_eos = bool(body.get("ignore_eos", False))
        return_logprob, start, top_k = False, -1, 0
        opts = body.get("stream_options") or {}
        include_usage = bool(isinstance(opts, dict) and opts.get("include_usage"))
    # sampling/sampling_params.py:255-258, :286-289 (verify, a ValueError)
    if temp < 0:
        raise BadRequest(f"temperature must be a non-negative finite number, got {temp}.")
    if max_new is not None and max_new < 0:
        raise BadRequest(f"max_new_tokens must be at least 0, got {max_new}.")
    first = GenParams(
        route=route, rid=rid, key=b"", prompt_tokens=0, max_new_tokens=max_new,
        temperature=temp, ignore_eos=ignore_eos, stream=bool(body.get("stream", False)),
        include_usage=include_usage, model=str(body.get("model") or served_model),
        return_logprob=return_logprob, logprob_start_len=-1 if start is None else start,
        top_logprobs_num=top_k or 0, weight_version=weight_version)
    items = []
    for i, pr in enumerate(prompts):
        text, ids = (pr, None) if isinstance(pr, str) else (None, list(pr))
        items.append(replace(first, rid=f"{rid}_{i}" if batch else rid, index=i,
                             key=prompt_key(text, ids), prompt_tokens=count_prompt_tokens(text, ids),
                             text=text, ids=None if ids is None else tuple(ids)))
    return Parsed(tuple(items), batch)


def check_context(p: GenParams, context_len: int, reserved: int) -> None:
    """managers/tokenizer_manager.py:1333-1378 _validate_one_request: the input must be
    shorter than the context, and input + max_new_tokens must fit in it."""
    n = p.prompt_tokens + reserved
    if n >= context_len:
        raise BadRequest(f"The input ({n} tokens) is longer than the model's context length "
                         f"({context_len} tokens).")
    if p.max_new_tokens is not None and p.max_new_tokens + n > context_len:
        raise BadRequest(
            f"Requested token count exceeds the model's maximum context length of {context_len} "
            f"tokens. You requested a total of {p.max_new_tokens + n} tokens: {n} tokens from the "
            f"input messages and {p.max_new_tokens} tokens for the completion. Please reduce the "
            "number of tokens in the input messages or the completion to fit within the limit.")
