"""Output agreement: the simulator's language model and the gate's pure comparison."""

from __future__ import annotations

import math

import pytest

from stackbuild.gate.agreement import compare, forced_body, generate_body, prefix_len, prompts
from stackbuild.gate.result import AgreementSample, TextSample
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


def test_plan_follows_the_profile_and_its_cost_is_exact() -> None:
    from stackbuild.gate.agreement import Part, cost, plan
    from stackbuild.spec.profile import GateProfile

    prof = GateProfile(concurrency=(1, 30, 250), input_len=128, output_len=2048)
    assert plan(prof) == (Part("ids", 32, 0, 32, 8), Part("long", 4, 128, 2048, 4),
                          Part("busy", 250, 128, 32, 250), Part("completions", 8, 0, 32, 8),
                          Part("chat", 8, 0, 32, 8))
    # 1000 tok/s everywhere: per side 32*32 + 4*2048 + 250*32 + 2*8*32 tokens; the forced
    # requests (32 + 4 + 250) cost one token each, on the candidate only
    c = cost(prof, 1000.0)
    per_side = (32 * 32 + 4 * 2048 + 250 * 32 + 2 * 8 * 32) / 1000.0
    assert c.requests == 2 * (32 + 4 + 250 + 8 + 8) + (32 + 4 + 250)
    assert c.seconds == pytest.approx(2 * per_side + (32 + 4 + 250) / 1000.0)
    stored = cost(prof, 1000.0, live_incumbent=False)
    assert stored.requests == (32 + 4 + 250 + 8 + 8) + (32 + 4 + 250)
    # per-level rates: the busy part runs at the rate measured at C=250, the long one at C=1's
    by_level = cost(prof, {1: 100.0, 30: 1000.0, 250: 2000.0}, live_incumbent=False)
    assert by_level.seconds == pytest.approx(
        (32 * 32 + 2 * 8 * 32 + 32) / 1000.0 + (4 * 2048 + 4) / 100.0 + (250 * 32 + 250) / 2000.0)
    # no busy part below 9 levels in flight, nothing at all with agreement off
    assert [p.name for p in plan(prof.model_copy(update={"concurrency": (1, 8)}))] == \
        ["ids", "long", "completions", "chat"]
    assert plan(prof.model_copy(update={"agreement_prompts": 0})) == ()
    assert cost(prof.model_copy(update={"agreement_prompts": 0}), 1.0).requests == 0


def test_the_agreement_never_outlives_its_deadline() -> None:
    import asyncio
    import time

    from stackbuild.gate.agreement import run
    from stackbuild.spec.profile import GateProfile

    # a deadline already passed: nothing is sent (the port is closed anyway), the cause says so
    res = asyncio.run(run("http://127.0.0.1:9", None, None, GateProfile(),
                          deadline=time.monotonic() - 1))
    assert res is not None and not res.passed and res.requests == 0
    assert res.reasons[0].startswith("agreement: not finished by the gate's deadline")
    assert asyncio.run(run("http://127.0.0.1:9", None, None,
                           GateProfile(agreement_prompts=0))) is None


def _t(part: str, prompt: str, text: str, n: int = 5) -> TextSample:
    return TextSample(part=part, prompt=prompt, text=text, prompt_tokens=n)


def test_top_k_overlap_and_kl_bound() -> None:
    from stackbuild.gate.agreement_judge import Forced, top_k_stats

    ref = AgreementSample(prompt=(1,), output=(5, 6), logprob=-0.5,
                          top=(((5, math.log(0.6)), (7, math.log(0.3))),
                               ((6, math.log(0.5)), (8, math.log(0.4)))))
    same = Forced(-0.5, ({5: math.log(0.6), 7: math.log(0.3)}, {6: math.log(0.5), 8: math.log(0.4)}))
    overlaps, kls = top_k_stats(ref, same)
    assert overlaps == [1.0, 1.0] and kls == pytest.approx([0.0, 0.0])
    # position 2: the candidate lacks 8 in its top-k; it gets the candidate's floor log(0.1)
    other = Forced(-1.0, ({5: math.log(0.3), 7: math.log(0.6)}, {6: math.log(0.9), 9: math.log(0.1)}))
    overlaps, kls = top_k_stats(ref, other)
    assert overlaps == [1.0, 0.5]
    assert kls[0] == pytest.approx(0.6 * math.log(2) + 0.3 * math.log(0.5))
    assert kls[1] == pytest.approx(0.5 * math.log(0.5 / 0.9) + 0.4 * math.log(4))


def test_parts_name_what_differed() -> None:
    from stackbuild.gate.agreement_judge import Bars, Forced, compare_ids, compare_text, diagnose

    ref = [AgreementSample(prompt=(i,), output=(1, 2, 3), logprob=-0.3, text=" a b c")
           for i in range(4)]
    same_ids_other_text = [r.model_copy(update={"text": "a b c"}) for r in ref]
    part = compare_ids("ids", ref, same_ids_other_text, [Forced(-0.3)] * 4, Bars())
    assert not part.passed and part.other_text == 4 and part.full_match == 1.0
    assert part.reasons == ("agreement: the same token ids came back as other text in 4 of 4 "
                            "outputs (prompt #0: ' a b c' vs 'a b c'): the tokenizer or "
                            "detokenizer changed",)
    # a stored result from before texts were kept: no text, no claim
    old = [r.model_copy(update={"text": ""}) for r in ref]
    assert compare_ids("ids", old, ref, [Forced(-0.3)] * 4, Bars()).passed
    texts = [_t("completions", "p1", " tron stil plal"), _t("completions", "p2", " sul plair bol")]
    late = [_t("completions", "p1", " tron stil blob"), _t("completions", "p2", " sul plair bol")]
    ok = compare_text("completions", texts, late, Bars(), tokens=3)
    assert ok.passed and ok.first_token == 1.0 and ok.full_match == 0.5
    early = [_t("completions", "p1", "tron stil plal"), _t("completions", "p2", "sul plair bol")]
    bad = compare_text("completions", texts, early, Bars(), tokens=3)
    assert not bad.passed and bad.first_token == 0.0
    assert bad.reasons[0].startswith("agreement (/v1/completions): 0% of 2 text answers agree on "
                                     "their first 8 characters (at least 75% required), e.g. 'p1'")
    chat_ref = [_t("chat", "p1", " x y", 9)]
    chat_bad = compare_text("chat", chat_ref, [_t("chat", "p1", " q r", 15)], Bars(), tokens=2)
    parts = [compare_ids("ids", ref, ref, [Forced(-0.3)] * 4, Bars()), ok, chat_bad]
    assert diagnose(parts, texts + chat_ref, [*late, _t("chat", "p1", " q r", 15)]) == [
        "agreement: chat answers differ while completions of the same prompts agree (chat "
        "prompts of 15.0 tokens on the candidate vs 9.0 on the incumbent): the chat template changed"]
    # other token counts for the same text prompts: the tokenizer changed
    recount = [_t("completions", "p1", " tron stil blob", 7), _t("completions", "p2", " sul plair bol", 7)]
    assert diagnose([ok], texts, recount)[0].endswith("7.0 tokens on average on the candidate vs "
                                                     "5.0 on the incumbent: the tokenizer changed")
    long_bad = compare_ids("long", ref, [r.model_copy(update={"output": (9, 9, 9)}) for r in ref],
                           [Forced(-8.0)] * 4, Bars(), input_len=400)
    assert "agreement on 400-token prompts, 3 tokens out: first tokens agree on 0%" in \
        long_bad.reasons[1]
    assert diagnose([parts[0], long_bad], [], []) == [
        "agreement: wrong only for long prompts: short prompts agree, prompts of 400 tokens do not"]
