"""The simulator answers like sglang 0.5.23's HTTP server on every route the gate, the deploy
and a user's client touch. Each expectation cites the real source it was read from
(`pip download --no-deps sglang==0.5.23`, paths under sglang/srt/), not the simulator.

Routes: /health, /health_generate, /ready (deploy readiness, gate), /server_info (gate host
facts), /v1/models, /v1/models/{id} (clients), /metrics (traffic sampling), /generate
(gate, agreement), /v1/completions, /v1/chat/completions (gate, clients).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import urllib.request

import pytest
from helpers_http import http, sse

from stackbuild.sim.process import SimProc, sim

pytestmark = pytest.mark.integration
PER_TEST = True  # each test starts its own simulators


def test_status_routes() -> None:
    s = SimProc("--speed", "20", warmup_s=1.5).wait_port()
    try:
        # entrypoints/http_server.py:721-735: /health and /health_generate are 503 while Starting
        assert http(s.url + "/health")[0] == 503
        assert http(s.url + "/health_generate")[0] == 503
        # http_server.py:714-718: /ready is 200 only once the tokenizer manager is ready
        assert http(s.url + "/ready")[0] == 503
        # http_server.py:933-939: /generate has no startup check
        assert http(s.url + "/generate", {"input_ids": [1, 2], "sampling_params":
                                          {"max_new_tokens": 2}})[0] == 200
        s.wait_up(10)
        assert http(s.url + "/health")[0] == 200 and http(s.url + "/ready")[0] == 200
    finally:
        s.stop()


def test_health_does_not_queue_behind_a_full_batch() -> None:
    # http_server.py:760-775: /health submits a one-token request and then, once a second
    # for SGLANG_HEALTH_CHECK_TIMEOUT (20 s, :218), answers 200 as soon as *any* output
    # arrived (last_receive_tstamp > tic); a full batch streaming proves health.
    with sim("--speed", "0.2", "--max-running-requests", "1") as s:
        body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 200}}
        def hold() -> None:
            with contextlib.suppress(OSError):  # cut when the simulator stops
                http(s.url + "/generate", body)

        t = threading.Thread(target=hold, daemon=True)
        t.start()
        status, _ = http(s.url + "/health")
        assert status == 200  # the one running request holds the only slot for ~10 s


def test_models_routes() -> None:
    with sim("--speed", "20", "--served-model-name", "qwen") as s:
        status, raw = http(s.url + "/v1/models")
        card = json.loads(raw)["data"][0]
        # openai/protocol.py:87-96 ModelCard fields; http_server.py:2002-2006 root = served name
        assert status == 200 and json.loads(raw)["object"] == "list"
        assert set(card) == {"id", "object", "created", "owned_by", "root", "parent",
                             "max_model_len"}
        assert (card["id"], card["root"], card["parent"], card["owned_by"]) == (
            "qwen", "qwen", None, "sglang")
        # http_server.py:2025-2047: /v1/models/{id}, 404 with an OpenAI error for others
        assert json.loads(http(s.url + "/v1/models/qwen")[1])["id"] == "qwen"
        status, raw = http(s.url + "/v1/models/other")
        assert status == 404 and json.loads(raw) == {"error": {
            "message": "The model 'other' does not exist", "type": "invalid_request_error",
            "param": "model", "code": "model_not_found"}}


def test_error_shapes_and_content_type() -> None:
    with sim("--speed", "20") as s:
        # io_struct.py:188-191 + utils/field_validators.py:65-66: a str input_ids fails the
        # request model, so FastAPI's RequestValidationError handler answers (http_server.py:
        # 635-692): an ErrorResponse with type "Bad Request", not /generate's {"error": ...}
        status, raw = http(s.url + "/generate", {"input_ids": "x"})
        body = json.loads(raw)
        assert status == 400 and (body["object"], body["type"], body["code"]) == (
            "error", "Bad Request", 400)
        assert "must be list or null; got str" in body["message"]
        # http_server.py:936-939: the JSON contract (api/v1/api_types.py, SamplingParams rejects
        # unknown keys) answers {"error": "<serde text>"}
        status, raw = http(s.url + "/generate", {"input_ids": [1], "sampling_params": {"max_new": 1}})
        assert status == 400 and json.loads(raw)["error"].startswith("unknown field `max_new`")
        # http_server.py:988-990 + :2246-2250: a ValueError while serving is {"error": {"message"}}
        status, raw = http(s.url + "/generate", {"input_ids": [1], "sampling_params":
                                                 {"max_new_tokens": -1}})
        assert status == 400 and json.loads(raw) == {"error": {
            "message": "max_new_tokens must be at least 0, got -1."}}
        # http_server.py:695-708 + :1860,1870 validate_json_request, :636-690 handler:
        # OpenAI routes reject a non-JSON Content-Type with 400 and an ErrorResponse
        # (openai/protocol.py:106-111)
        req = urllib.request.Request(s.url + "/v1/completions", data=b'{"prompt": "x"}',
                                     headers={"Content-Type": "text/plain"})
        try:
            urllib.request.urlopen(req, timeout=10)
            raise AssertionError("accepted text/plain")
        except urllib.error.HTTPError as err:
            body = json.loads(err.read())
            assert err.code == 400
            assert (body["object"], body["type"], body["code"]) == ("error", "Bad Request", 400)
            assert "Only 'application/json' is allowed" in body["message"]


def test_generate_logprobs_and_final_only_meta() -> None:
    with sim("--speed", "20", "--profile", "eagle3-topk1-v2") as s:
        ids = [11, 12, 13, 14]
        status, raw = http(s.url + "/generate", {"input_ids": ids, "return_logprob": True,
                                                 "sampling_params": {"max_new_tokens": 5,
                                                                     "temperature": 0}})
        out = json.loads(raw)
        meta = out["meta_info"]
        # managers/tokenizer_manager.py:3104-3108: (logprob, token_id, None) without text
        assert [e[1] for e in meta["output_token_logprobs"]] == out["output_ids"]
        assert all(e[2] is None and e[0] < 0 for e in meta["output_token_logprobs"])
        # io_struct.py:231-233, :567-568: logprob_start_len defaults to -1, output only
        assert meta["input_token_logprobs"] == []
        forced = {"input_ids": ids + out["output_ids"], "return_logprob": True,
                  "logprob_start_len": len(ids) - 1,
                  "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
        fmeta = json.loads(http(s.url + "/generate", forced)[1])["meta_info"]
        # scheduler_components/logprob_result_processor.py:37-38: None first, and :50 the
        # ids from logprob_start_len on
        assert fmeta["input_token_logprobs"][0][0] is None
        assert [e[1] for e in fmeta["input_token_logprobs"]] == forced["input_ids"][len(ids) - 1:]
        assert [e[0] for e in fmeta["input_token_logprobs"][1:]] == pytest.approx(
            [e[0] for e in meta["output_token_logprobs"]])
        # tokenizer_manager.py:2742-2756: e2e_latency (and the spec metrics, :3166) only
        # once the request finished, i.e. in the final chunk
        status, raw = http(s.url + "/generate", {"input_ids": ids, "stream": True,
                                                 "sampling_params": {"max_new_tokens": 12}})
        chunks = sse(raw)
        assert len(chunks) > 1
        assert all("e2e_latency" not in c["meta_info"] for c in chunks[:-1])
        assert "e2e_latency" in chunks[-1]["meta_info"]
        assert "spec_accept_length" in chunks[-1]["meta_info"]
        # max_new_tokens 0 is accepted (prefill only)
        status, raw = http(s.url + "/generate", {"input_ids": ids,
                                                 "sampling_params": {"max_new_tokens": 0}})
        assert status == 200 and json.loads(raw)["output_ids"] == []


def test_openai_routes() -> None:
    with sim("--speed", "20") as s:
        # openai/sse_utils.py:13-26: every delta carries reasoning_content (null); the first
        # chunk is {role: assistant, content: ""} (serving_chat.py:2569-2583), content chunks
        # have no finish_reason (:1031-1050), one last chunk carries only it (:2609-2626)
        status, raw = http(s.url + "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True})
        chunks = sse(raw)
        assert chunks[0]["choices"][0]["delta"] == {"reasoning_content": None, "role": "assistant",
                                                    "content": ""}
        assert all(c["choices"][0]["delta"]["reasoning_content"] is None for c in chunks)
        assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:])
        assert [c["choices"][0]["finish_reason"] for c in chunks[1:]] == [None] * 4 + ["length"]
        assert chunks[-1]["choices"][0]["delta"] == {"reasoning_content": None}
        assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
        # openai/protocol.py:378: completions max_tokens defaults to 16
        status, raw = http(s.url + "/v1/completions", {"prompt": "a b", "ignore_eos": True})
        assert json.loads(raw)["usage"]["completion_tokens"] == 16
        # openai/protocol.py:928-932: chat max_tokens defaults to None: until EOS
        status, raw = http(s.url + "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "temperature": 0})
        msg = json.loads(raw)
        assert status == 200 and msg["choices"][0]["finish_reason"] == "stop"


def test_metrics_only_when_enabled_with_sglangs_labels_and_server_info() -> None:
    with sim("--speed", "20") as s:
        # entrypoints/http_server.py:314: the Prometheus app is mounted only with --enable-metrics
        assert http(s.url + "/metrics")[0] == 404
        info = json.loads(http(s.url + "/server_info")[1])
        # utils/common.py:3589-3590: server args resolved, plus launch_command
        assert "launch_command" in info and "cuda_graph_max_bs_decode" in info
        assert "cuda_graph_max_bs" not in info
        # http_server.py:879-893: internal_states per DP, version, frontend
        state = info["internal_states"][0]
        assert {"effective_max_running_requests_per_dp", "memory_usage"} <= set(state)
        assert (info["version"], info["frontend"]) == ("0.5.23", "python")
    with sim("--speed", "20", "--enable-metrics", "--served-model-name", "m") as s:
        text = http(s.url + "/metrics")[1].decode()
        # observability/metrics_collector.py:1382-1388: scheduler gauges carry engine_type
        # and the tp/pp/moe_ep ranks; :1807-1811: tokenizer metrics carry engine_type
        assert ('sglang:num_running_reqs{model_name="m",engine_type="unified",tp_rank="0",'
                'pp_rank="0",moe_ep_rank="0"}') in text
        assert 'sglang:time_to_first_token_seconds_bucket{model_name="m",engine_type="unified"' \
            in text


def test_flush_cache_batches_and_refusals() -> None:
    with sim("--speed", "20", "--context-length", "1000") as s:
        # http_server.py:1025-1040: GET or POST, 200 with this text when idle
        status, raw = http(s.url + "/flush_cache", {})
        assert status == 200 and raw.decode().startswith("Cache flushed.\n")
        # a two-prompt batch is two choices (serving_completions.py:532-646) ...
        status, raw = http(s.url + "/v1/completions", {"prompt": ["a b", "c d e"], "max_tokens": 3,
                                                       "temperature": 0})
        out = json.loads(raw)
        assert status == 200 and [c["index"] for c in out["choices"]] == [0, 1]
        assert out["usage"]["prompt_tokens"] == 5 and out["usage"]["completion_tokens"] == 6
        # ... and a list of answers on /generate (tokenizer_manager.py:2079-2140)
        status, raw = http(s.url + "/generate", {"input_ids": [[1, 2], [3, 4]],
                                                 "sampling_params": {"max_new_tokens": 2}})
        assert status == 200 and [len(o["output_ids"]) for o in json.loads(raw)] == [2, 2]
        # protocol.py:448-453 max_tokens must be positive; serving_completions.py:63-69
        for body in ({"prompt": "x", "max_tokens": 0}, {"prompt": ""}):
            status, raw = http(s.url + "/v1/completions", body)
            assert status == 400 and json.loads(raw)["object"] == "error"
        # tokenizer_manager.py:1338-1351: a prompt as long as the context is refused; a
        # streamed /generate has sent its 200 already and says it as an event
        # (http_server.py:960-979)
        too_long = {"input_ids": list(range(1000)), "sampling_params": {"max_new_tokens": 1}}
        status, raw = http(s.url + "/generate", too_long)
        assert status == 400 and json.loads(raw)["error"]["message"] == (
            "The input (1000 tokens) is longer than the model's context length (1000 tokens).")
        status, raw = http(s.url + "/generate", {**too_long, "stream": True})
        assert status == 200 and sse(raw)[0]["error"]["code"] == 400
        status, raw = http(s.url + "/v1/completions", {"prompt": list(range(1000)), "stream": True})
        assert status == 400 and "longer than the model's context length" in json.loads(raw)["message"]


def _post_raw(port: int, path: str, body: dict[str, object]) -> socket.socket:
    data = json.dumps(body)
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall((f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(data)}\r\n\r\n{data}").encode())
    return sock


def _running_becomes(url: str, n: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if json.loads(http(url + "/server_info")[1])["internal_states"][0]["num_running_reqs"] == n:
            return True
        time.sleep(0.05)
    return False


def test_disconnected_request_is_aborted_and_streams_answer_with_the_first_token() -> None:
    with sim("--speed", "0.5", "--enable-metrics") as s:
        # 5000 tokens run for about a minute at --speed 0.5: gone within the wait below only if aborted
        sock = _post_raw(s.port, "/generate", {"input_ids": [1, 2],
                                               "sampling_params": {"max_new_tokens": 5000}})
        assert _running_becomes(s.url, 1), "the request never ran"  # a loaded machine admits it late
        sock.close()  # tokenizer_manager.py:2065-2077: the running request is aborted
        assert _running_becomes(s.url, 0), "the disconnected request ran on"
        # serving_completions.py:197-223: the 200 (headers) comes with the first chunk; at
        # --speed 0.5 the prefill of 3000 tokens takes long enough to see the headers wait
        sock = _post_raw(s.port, "/v1/completions", {"prompt": list(range(3000)), "max_tokens": 2,
                                                     "stream": True})
        t0 = time.monotonic()
        head = sock.recv(4096)
        waited = time.monotonic() - t0
        sock.settimeout(10)
        while b"data: " not in head and (more := sock.recv(4096)):  # headers and chunk: one write or two
            head += more
        sock.close()
        assert head.startswith(b"HTTP/1.1 200") and b"data: " in head
        assert waited > 0.1  # nothing, not even the status line, before the prefill ended
        # metrics_collector.py:2041-2071: TTFT and e2e carry is_streaming
        http(s.url + "/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": 1}})
        text = http(s.url + "/metrics")[1].decode()
        lb = 'model_name="sim/model",engine_type="unified"'
        for name, flag in (("e2e_request_latency_seconds", "false"),
                           ("time_to_first_token_seconds", "true"),
                           ("time_to_first_token_seconds", "false")):
            assert f'sglang:{name}_count{{{lb},is_streaming="{flag}"}}' in text
        # :2052-2057: inter-token latency has no is_streaming
        assert f"sglang:inter_token_latency_seconds_count{{{lb}}}" in text
