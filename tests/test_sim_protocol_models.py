"""The simulator's answers, validated with sglang 0.5.23's own models (not our memory of them):
each body must parse into the model sglang builds it from, and serialize back byte for byte
the way sglang serializes that model (tests/helpers_sglang_models.py says how the models run
without torch). Marked network: it fetches the wheel and a small venv with its pins."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from helpers_http import http, sse
from helpers_sglang_models import SglangModels

from stackbuild.sim.process import sim

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> SglangModels:
    root = tmp_path_factory.mktemp("sglang-models")
    if not os.environ.get("STACKBUILD_CACHE_DIR"):  # never the user's cache
        os.environ["STACKBUILD_CACHE_DIR"] = str(root / "cache")
    return SglangModels(root)


def _post(url: str, body: dict[str, Any]) -> Any:
    status, raw = http(url, body)
    assert status == 200, raw
    return sse(raw) if body.get("stream") else json.loads(raw)


def test_answers_are_sglangs_own_models(models: SglangModels, tmp_path: Path) -> None:
    cases: list[dict[str, Any]] = []

    def want(model: str, body: Any, dump: str = "json") -> None:
        cases.append({"model": model, "body": body, "dump": dump})

    with sim("--speed", "20", "--served-model-name", "m", "--context-length", "1000") as s:
        u = s.url
        comp = {"model": "m", "prompt": ["a b", "c"], "max_tokens": 3, "temperature": 0}
        want("CompletionResponse", _post(u + "/v1/completions", comp))
        chunks = _post(u + "/v1/completions", {**comp, "prompt": "a b", "stream": True,
                                               "stream_options": {"include_usage": True}})
        for c in chunks[:-1]:
            want("CompletionStreamResponse", c)
        # serving_completions.py:495: the usage chunk is model_dump_json(exclude_none=True)
        want("CompletionStreamResponse", chunks[-1], "exclude_none")
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                "temperature": 0}
        want("ChatCompletionResponse", _post(u + "/v1/chat/completions", chat))
        chunks = _post(u + "/v1/chat/completions", {**chat, "stream": True,
                                                    "stream_options": {"include_usage": True}})
        for c in chunks[:-1]:  # sse_utils.py: msgspec structs, omit_defaults
            want("StreamChunk", c, "msgspec")
        want("ChatCompletionStreamResponse", chunks[-1])  # serving_chat.py:2790-2796
        for body in ({"prompt": "x", "max_tokens": 0}, {"prompt": ""},
                     {"prompt": list(range(1000))}):
            status, raw = http(u + "/v1/completions", body)
            assert status == 400
            want("ErrorResponse", json.loads(raw))
        status, raw = http(u + "/generate", {"input_ids": "x"})
        want("ErrorResponse", json.loads(raw))
        want("ModelList", json.loads(http(u + "/v1/models")[1]))
        gen = {"input_ids": [5, 6, 7], "return_logprob": True, "top_logprobs_num": 3,
               "logprob_start_len": 1, "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
        # api/v1/api_types.py: the /generate contract, requests and answers
        want("GenerateRequest", gen, "contract")
        want("GenerateResponse", _post(u + "/generate", gen), "contract")
        for c in _post(u + "/generate", {**gen, "stream": True}):
            want("GenerateResponse", c, "contract")
        status, raw = http(u + "/generate", {**gen, "input_ids": list(range(1000)), "stream": True})
        want("GenerateStreamError", sse(raw)[0], "contract")
    got = models.check(cases)
    bad = [(c["model"], r.get("error") or (c["body"], r["dumped"]))
           for c, r in zip(cases, got, strict=True) if not r["ok"] or r["dumped"] != c["body"]]
    assert bad == []
    assert len(cases) > 20


def test_the_models_are_strict_enough_to_tell(models: SglangModels) -> None:
    """The check can fail: a chat delta without reasoning_content (what the simulator sent
    before) does not decode, an extra field does not serialize back, a wrong finish_reason
    does not validate."""
    chunk = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": {"content": "a"}, "logprobs": None,
                          "finish_reason": None, "matched_stop": None}]}
    extra = {"object": "error", "message": "m", "type": "t", "param": None, "code": 400, "x": 1}
    wrong = {"id": "x", "object": "text_completion", "created": 1, "model": "m",
             "choices": [{"index": 0, "text": "a", "logprobs": None, "finish_reason": "done",
                          "matched_stop": None}],
             "usage": {"prompt_tokens": 1, "total_tokens": 2, "completion_tokens": 1}}
    a, b, c = models.check([{"model": "StreamChunk", "body": chunk, "dump": "msgspec"},
                            {"model": "ErrorResponse", "body": extra, "dump": "json"},
                            {"model": "CompletionResponse", "body": wrong, "dump": "json"}])
    assert not a["ok"] and "reasoning_content" in a["error"]
    assert b["ok"] and "x" not in b["dumped"]
    assert not c["ok"] and "finish_reason" in c["error"]
