"""Output agreement: the simulator's language model and the gate's pure comparison."""

from __future__ import annotations

import math

import pytest

from stackbuild.gate.agreement import compare, forced_body, generate_body, prefix_len, prompts
from stackbuild.gate.result import AgreementSample
from stackbuild.sim import lm
from stackbuild.sim.faults import parse_fault
from stackbuild.sim.lm import Numerics


def test_prompts_are_seeded_token_ids() -> None:
    a, b = prompts(0, 32), prompts(0, 32)
    assert a == b and len(a) == 32 and len({tuple(p) for p in a}) == 32
    assert all(16 <= len(p) <= 48 and all(1000 <= t < 30000 for t in p) for p in a)
    assert prompts(1, 2) != a[:2]


def test_request_bodies() -> None:
    assert generate_body([5, 6], 4) == {
        "input_ids": [5, 6], "return_logprob": True,
        "sampling_params": {"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True}}
    assert forced_body([5, 6, 7], [9, 8]) == {
        "input_ids": [5, 6, 7, 9, 8], "return_logprob": True, "logprob_start_len": 2,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}


def _forced(prompt: list[int], output: list[int], numerics: Numerics) -> float:
    """What the server answers to forced_body: drop the leading None, average the rest."""
    scored, _ = lm.score([*prompt, *output], len(prompt) - 1, numerics)
    assert scored[0] is None and len(scored) == len(output) + 1
    return sum(x for x in scored[1:] if x is not None) / len(output)


def test_teacher_forcing_reproduces_the_generating_logprobs() -> None:
    prompt = [1234, 2345, 3456, 4567]
    ids, lps, _ = lm.greedy(lm.start(None, prompt), 64)
    assert _forced(prompt, ids, Numerics()) == pytest.approx(sum(lps) / 64)
    assert all(-1.0 < x < 0 for x in lps)  # greedy picks the top token, p >= 0.42


def test_numerics_benign_divergence_and_drift() -> None:
    ps = prompts(0, 32)
    ref = [lm.greedy(lm.start(None, p), 32)[:2] for p in ps]
    div = [lm.greedy(lm.start(None, p), 32, Numerics("diverge", 4))[:2] for p in ps]
    drift = [lm.greedy(lm.start(None, p), 32, Numerics("drift"))[:2] for p in ps]
    pre = [prefix_len(r[0], d[0]) for r, d in zip(ref, div, strict=True)]
    assert min(pre) >= 4 and any(x < 32 for x in pre)  # parts ways at a near tie after token 4
    own = sum(sum(r[1]) / 32 for r in ref) / 32
    benign = sum(_forced(p, r[0], Numerics("diverge", 4)) for p, r in zip(ps, ref, strict=True)) / 32
    wrong = sum(_forced(p, r[0], Numerics("drift")) for p, r in zip(ps, ref, strict=True)) / 32
    assert own - benign < 0.05
    assert own - wrong > 5.0
    assert sum(prefix_len(r[0], d[0]) > 0 for r, d in zip(ref, drift, strict=True)) <= 2
    # the near tie: the runner-up is 0.40 against 0.42
    assert math.log(0.42) - math.log(0.40) == pytest.approx(0.0488, abs=1e-4)


def test_faults_parse() -> None:
    assert parse_fault("diverge:8").numerics == Numerics("diverge", 8)
    assert parse_fault("drift").numerics == Numerics("drift")
    assert parse_fault("slow:2").numerics == Numerics()
    with pytest.raises(ValueError, match="diverge needs the output token"):
        parse_fault("diverge")


def _s(prompt: int, out: list[int], lp: float) -> AgreementSample:
    return AgreementSample(prompt=(prompt,), output=tuple(out), logprob=lp)


def test_compare_tolerates_divergence_and_catches_low_likelihood() -> None:
    ref = [_s(1, [1, 2, 3, 4], -0.3), _s(2, [5, 6, 7, 8], -0.5)]
    same = compare(ref, ref, [-0.3, -0.5], min_first_token=0.75, max_drop=0.5)
    assert same.passed and (same.first_token, same.full_match, same.prefix_mean) == (1.0, 1.0, 4.0)
    assert same.logprob_drop == 0.0 and same.example == ""
    parted = [_s(1, [1, 2, 9, 9], -0.3), _s(2, [5, 6, 7, 8], -0.5)]
    benign = compare(ref, parted, [-0.32, -0.5], min_first_token=0.75, max_drop=0.5)
    assert benign.passed and benign.prefix_p50 == 3.0 and benign.full_match == 0.5
    assert benign.example.startswith("prompt #0 diverges at token 2: incumbent ids [3, 4] "
                                     "vs candidate [9, 9]")
    wrong = [_s(1, [7, 7, 7, 7], -0.3), _s(2, [8, 8, 8, 8], -0.5)]
    bad = compare(ref, wrong, [-8.0, -8.2], min_first_token=0.75, max_drop=0.5)
    assert not bad.passed and bad.logprob_drop == pytest.approx(7.7)
    assert bad.reasons[0] == ("agreement: the candidate gives the incumbent's greedy outputs -8.10 "
                              "nats/token vs the incumbent's own -0.40 (drop 7.70, allowed 0.5): "
                              "it computes other numbers")
    assert bad.reasons[1] == "agreement: first tokens agree on 0% of 2 prompts (at least 75% required)"
    assert bad.reasons[2].startswith("agreement: e.g. prompt #1 diverges at token 0: incumbent ids [5, 6, 7, 8]")
    reference_run = compare([], wrong, [], min_first_token=0.75, max_drop=0.5)
    assert reference_run.passed and not reference_run.compared and reference_run.samples == tuple(wrong)


def test_the_fast_path_gives_the_same_tokens() -> None:
    state = lm.start(None, [7, 8, 9])
    fast, none, _ = lm.greedy(state, 200, logprobs=False)
    full, lps, tops = lm.greedy(state, 200, top_k=3)
    assert fast == full and none == [] and len(lps) == 200
    # the top-k starts with the greedy token and its logprob, most likely first
    assert [t[0] for t in tops] == [(lp, i) for lp, i in zip(lps, full, strict=True)]
    assert all(len(t) == 3 and t[0][0] >= t[1][0] >= t[2][0] for t in tops)


def test_junit_has_an_agreement_case_that_fails_with_its_reasons() -> None:
    import xml.etree.ElementTree as ET

    from test_gate_stats import _result

    from stackbuild.gate.formats import junit_xml

    ref = [_s(1, [1, 2], -0.3)]
    bad = compare(ref, [_s(1, [7, 7], -0.3)], [-8.0], min_first_token=0.75, max_drop=0.5)
    suite = ET.fromstring(junit_xml(_result().model_copy(update={"agreement": bad})))
    case = next(c for c in suite if c.get("name") == "agreement")
    failure = case.find("failure")
    assert failure is not None and failure.get("type") == "agreement"
    assert "drop 7.70, allowed 0.5" in (failure.text or "")
