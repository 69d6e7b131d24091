"""The simulator's pure core: calibration to the users' table, acceptance, faults, text, API."""

from __future__ import annotations

import pytest

from stackbuild.sim import api
from stackbuild.sim.calibration import PROFILES, SimProfile, expected_accept
from stackbuild.sim.faults import Fault, parse_fault
from stackbuild.sim.model import Sampler, steady_tok_s, step_ms
from stackbuild.sim.text import detokenize, greedy_ids, prompt_key

# The users' sweep (seed-results.json "sweep", seeds/004), output tok/s at --speed 1,
# the speculative configurations run with --max-running-requests 256 as the stacks do.
USERS = {
    "baseline": {1: 92.7, 30: 689.4, 250: 718.1},
    "eagle3-topk1-v2": {1: 86.8, 30: 759.3, 250: 754.4},
}


def calibrated(name: str) -> SimProfile:
    p = PROFILES[name].as_measured()
    assert p.max_running == (256 if p.speculative else 1024)  # the stacks' --max-running-requests
    return p


@pytest.mark.parametrize("name", sorted(USERS))
@pytest.mark.parametrize("conc", [1, 30, 250])
def test_calibrated_to_the_users_table(name: str, conc: int) -> None:
    assert steady_tok_s(calibrated(name), conc) == pytest.approx(USERS[name][conc], rel=1e-6)


def test_peaks_and_plateau_match_the_users_notes() -> None:
    base = max(steady_tok_s(PROFILES["baseline"], c) for c in range(1, 251))
    topk1 = max(steady_tok_s(calibrated("eagle3-topk1-v2"), c) for c in range(1, 251))
    topk4 = calibrated("eagle3-topk4-v1")
    assert base == pytest.approx(773, rel=0.01)
    assert topk1 == pytest.approx(775, rel=0.005)
    assert steady_tok_s(topk4, 250) == pytest.approx(353, rel=1e-6)
    # a plateau: from C=30 on it stays within 4% of 353
    assert all(abs(steady_tok_s(topk4, c) / 353 - 1) < 0.04 for c in range(30, 251))


def test_topk1_v2_matches_or_beats_baseline_from_c2_but_not_at_c1() -> None:
    # the users' words: "matches or beats baseline at every C from 2 to 250"
    base, topk1 = PROFILES["baseline"], calibrated("eagle3-topk1-v2")
    ratios = {c: steady_tok_s(topk1, c) / steady_tok_s(base, c) for c in range(1, 251)}
    assert ratios[1] == pytest.approx(86.8 / 92.7)
    assert min(ratios[c] for c in range(2, 251)) >= 1.0


def test_overlap_floor_is_the_single_request_step() -> None:
    p = PROFILES["eagle3-topk1-v2"]
    assert p.floor_ms == pytest.approx(2.19 * 1000 / 86.8)
    assert step_ms(p, 1) == step_ms(p, 2) == p.floor_ms  # a second request rides the same draft chain
    assert step_ms(p, 30) > p.floor_ms
    assert PROFILES["baseline"].floor_ms == 0.0 and PROFILES["eagle3-topk4-v1"].floor_ms == 0.0


def test_speculation_caps_at_48_running_unless_raised() -> None:
    # sglang 0.5.23 sets max_running_requests to 48 with speculative decoding and no flag
    p = PROFILES["eagle3-topk1-v2"]
    assert p.max_running == 48 and PROFILES["baseline"].max_running == 1024
    assert steady_tok_s(p, 250) == steady_tok_s(p, 48) != steady_tok_s(p.with_max_running(256), 250)
    assert p.with_max_running(256).coeffs == p.coeffs and p.with_max_running(None) is p


def test_step_time_grows_with_batch_and_throughput_saturates() -> None:
    p = PROFILES["baseline"]
    assert [round(step_ms(p, b), 2) for b in (1, 30, 250)] == [10.79, 43.52, 348.14]
    rates = [steady_tok_s(p, c) for c in (1, 2, 8, 30, 64)]
    assert rates == sorted(rates)


def test_acceptance_model() -> None:
    assert expected_accept(2, 0.7) == pytest.approx(2.19)
    assert expected_accept(0, 0.9) == 1.0
    s = Sampler(PROFILES["eagle3-topk1-v2"], seed=3)
    draws = [s.accepted(100) for _ in range(20000)]
    assert set(draws) == {1, 2, 3}
    assert sum(draws) / len(draws) == pytest.approx(2.19, abs=0.03)
    assert s.accepted(1) == 1  # never past the request's end


def test_sampler_is_reproducible_and_slow_scales() -> None:
    a = Sampler(PROFILES["baseline"], seed=5)
    b = Sampler(PROFILES["baseline"], seed=5, slow=2.0)
    xs, ys = [a.step_ms(8) for _ in range(50)], [b.step_ms(8) for _ in range(50)]
    assert [y / x for x, y in zip(xs, ys, strict=True)] == pytest.approx([2.0] * 50)


@pytest.mark.parametrize(("spec", "want"), [
    (None, Fault()),
    ("slow:1.5", Fault("slow", factor=1.5)),
    ("die-after:20", Fault("die-after", after=20)),
    ("garbage", Fault("garbage", garbage="repeat")),
    ("garbage:fffd", Fault("garbage", garbage="fffd")),
    ("stall-stream", Fault("stall-stream")),
])
def test_parse_fault(spec: str | None, want: Fault) -> None:
    assert parse_fault(spec) == want


@pytest.mark.parametrize(("spec", "msg"), [
    ("explode", "unknown fault"), ("slow:x", "factor"), ("slow:0", "factor"),
    ("die-after:", "request count"), ("never-ready:3", "no argument"), ("garbage:x", "one of"),
])
def test_parse_fault_errors(spec: str, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        parse_fault(spec)


def test_greedy_text_is_a_function_of_the_prompt() -> None:
    k = prompt_key("The capital of France is", None)
    assert greedy_ids(k, 10) == greedy_ids(k, 10)
    assert greedy_ids(k, 10)[:4] == greedy_ids(k, 4)
    assert greedy_ids(k, 10) != greedy_ids(prompt_key("other", None), 10)
    assert greedy_ids(k, 5, temperature=1.0, rid="a") != greedy_ids(k, 5, temperature=1.0, rid="b")
    assert prompt_key(None, [1, 2]) != prompt_key("1,2", None)
    assert detokenize([0, 0]) == "!!"


def test_parse_requests() -> None:
    g = api.parse("generate", {"input_ids": [1, 2, 3], "stream": True,
                               "sampling_params": {"max_new_tokens": 7, "ignore_eos": True}},
                  "r1", "m").items[0]
    assert (g.prompt_tokens, g.max_new_tokens, g.ignore_eos, g.stream, g.rid) == (3, 7, True,
                                                                                  True, "r1")
    c = api.parse("completions", {"prompt": "a b c", "max_tokens": 4,
                                  "stream_options": {"include_usage": True}}, "r2", "m").items[0]
    assert (c.prompt_tokens, c.max_new_tokens, c.include_usage, c.model) == (3, 4, True, "m")
    ch = api.parse("chat", {"messages": [{"role": "user", "content": "hi"}]}, "r3", "m").items[0]
    # sglang 0.5.23 openai/protocol.py:928: chat max_tokens defaults to None (until EOS)
    assert ch.max_new_tokens is None
    assert ch.text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_batches_are_one_params_per_prompt() -> None:
    # io_struct.py:185-191 text: list[str], input_ids: list[list[int]]; protocol.py:371 prompt
    for route, body in [("generate", {"input_ids": [[1, 2], [3, 4, 5]]}),
                        ("generate", {"text": ["a", "b c"]}),
                        ("completions", {"prompt": ["a", "b c"]}),
                        ("completions", {"prompt": [[1, 2], [3, 4, 5]]})]:
        parsed = api.parse(route, body, "r", "m")  # type: ignore[arg-type]
        assert parsed.batch and [p.index for p in parsed.items] == [0, 1]
        assert [p.rid for p in parsed.items] == ["r_0", "r_1"]
        assert parsed.items[0].key != parsed.items[1].key
    single = api.parse("completions", {"prompt": [1, 2, 3]}, "r", "m")
    assert not single.batch and single.items[0].ids == (1, 2, 3)


@pytest.mark.parametrize(("route", "body", "shape", "text"), [
    # protocol.py:448-453: max_tokens must be positive, a pydantic validation error
    ("completions", {"prompt": "x", "max_tokens": 0}, "validation", "max_tokens must be positive"),
    # serving_completions.py:63-69
    ("completions", {"prompt": ""}, "value", "Prompt cannot be empty"),
    ("completions", {"prompt": ["", ""]}, "value", "Prompt cannot be empty"),
    ("completions", {"prompt": {"a": 1}}, "validation", "prompt"),
    ("chat", {"messages": []}, "value", "Messages cannot be empty."),
    # field_validators.py:65-66
    ("generate", {"input_ids": "x"}, "validation", "must be list or null; got str"),
    # api/v1/api_types.py: SamplingParams rejects unknown keys, serde's text
    ("generate", {"input_ids": [1], "sampling_params": {"max_new_token": 1}}, "contract",
     "unknown field `max_new_token`, expected one of `max_new_tokens`"),
    ("generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": "x"}}, "contract",
     'invalid type: string "x", expected i64'),
    # sampling_params.py:286-289
    ("generate", {"text": "x", "sampling_params": {"max_new_tokens": -1}}, "value",
     "max_new_tokens must be at least 0, got -1."),
])
def test_refusals_and_their_shapes(route: str, body: dict[str, object], shape: str,
                                   text: str) -> None:
    with pytest.raises(api.BadRequest) as err:
        api.parse(route, body, "r", "m")  # type: ignore[arg-type]
    assert err.value.shape == shape and text in str(err.value)


def test_error_bodies_and_context_refusal() -> None:
    from stackbuild.sim import shapes

    bad = api.BadRequest("boom", "contract")
    assert shapes.error_body("generate", bad) == {"error": "boom"}
    assert shapes.error_body("generate", api.BadRequest("boom")) == {"error": {"message": "boom"}}
    assert shapes.error_body("completions", api.BadRequest("boom")) == {
        "object": "error", "message": "boom", "type": "BadRequestError", "param": None, "code": 400}
    assert shapes.error_body("generate", api.BadRequest("boom", "validation"))["type"] == \
        "Bad Request"
    p = api.parse("generate", {"input_ids": list(range(10)),
                               "sampling_params": {"max_new_tokens": 6}}, "r", "m").items[0]
    api.check_context(p, 16, 0)
    with pytest.raises(api.BadRequest, match=r"You requested a total of 17 tokens: 11 tokens"):
        api.check_context(p, 16, 1)
    with pytest.raises(api.BadRequest, match=r"The input \(10 tokens\) is longer than the "
                                             r"model's context length \(10 tokens\)\."):
        api.check_context(p, 10, 0)


@pytest.mark.parametrize(("args", "msg"), [
    (["--profile", "nope"], "--profile: unknown simulator profile 'nope'"),
    (["--fault", "slow:abc"], "--fault: slow needs a factor"),
])
def test_sim_cli_rejects_bad_input(
    args: list[str], msg: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from stackbuild.cli.main import main

    assert main(["sim", "--port", "1", *args]) == 2
    assert msg in capsys.readouterr().err
