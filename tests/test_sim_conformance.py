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
import threading
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
        # http_server.py:2246-2250 _create_error_response: /generate errors are {"error": {...}}
        status, raw = http(s.url + "/generate", {"input_ids": "x"})
        assert status == 400 and set(json.loads(raw)) == {"error"}
        assert "message" in json.loads(raw)["error"]
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
        # openai/serving_chat.py:2582-2591: the first chunk is {role: assistant, content: ""}
        status, raw = http(s.url + "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True})
        chunks = sse(raw)
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:] if c["choices"])
        assert "".join(c["choices"][0]["delta"]["content"] for c in chunks if c["choices"])
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
