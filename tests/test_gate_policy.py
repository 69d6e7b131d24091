"""Per-level gate policy: bars per concurrency, required levels, the CLI override, and the
users' policy on the simulator's model (margins from the model, not from a clock)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_gate_stats import _run

from stackbuild.cli.gate import _level_bars
from stackbuild.errors import InputError
from stackbuild.gate.decide import judge_level, level_summary, overall
from stackbuild.sim.calibration import PROFILES
from stackbuild.sim.model import single_stream_tok_s, steady_tok_s
from stackbuild.spec.load import load_stack
from stackbuild.spec.profile import GateProfile, LevelPolicy

# one look at 4 runs (a fixed-sample test), no session drift: these tests are about the policy
USERS = GateProfile(concurrency=(1, 8), tolerance=0.0, levels={1: LevelPolicy(tolerance=0.08)},
                    runs=4, max_runs=4, session_drift=0.0)
INC = [100.0, 100.0, 100.0, 100.0]


def _said(lv, policy: str) -> str:  # type: ignore[no-untyped-def]
    def pct(x: float) -> str:
        return f"{(x - 1) * 100:+.1f}%"
    return (f"C={lv.concurrency} {pct(lv.ratio)} ({lv.ci_confidence:.1%} CI {pct(lv.ci_low)}.."
            f"{pct(lv.ci_high)}), {policy}")


def _level(c: int, *tok_s: float):  # type: ignore[no-untyped-def]
    return level_summary(c, [_run(t, index=i) for i, t in enumerate(tok_s)])


def test_each_level_holds_its_own_bar_and_says_so() -> None:
    c1 = judge_level(_level(1, 93.0, 93.1, 93.1, 93.2), INC, USERS, final=True)
    assert (c1.verdict, c1.bar, c1.margin) == ("pass", 0.92, 0.0)
    assert c1.explanation == _said(c1, "allowed -8%: pass")
    # "must not lose" loses no more than the margin: -0.9% passes, -2.9% fails
    c8 = judge_level(_level(8, 99.0, 99.1, 99.1, 99.2), INC, USERS, final=True)
    assert (c8.verdict, c8.bar, c8.margin) == ("pass", 0.98, 0.02)
    assert c8.explanation == _said(c8, "must not lose (margin 2%): pass")
    lost = judge_level(_level(8, 97.0, 97.1, 97.1, 97.2), INC, USERS, final=True)
    assert lost.verdict == "fail" and lost.explanation == _said(lost, "must not lose (margin 2%): fail")
    assert "slower than the incumbent allows" in lost.reasons[0] and "(must not lose (margin 2%))" \
        in lost.reasons[0]
    # the same C=1 numbers under the default (must not lose) fail: the bar is per level
    flat = judge_level(_level(1, 93.0, 93.1, 93.2), INC[:3],
                       USERS.with_overrides(levels={1: {"tolerance": 0.0}}, runs=3, max_runs=3),
                       final=True)
    assert flat.verdict == "fail" and flat.bar == 0.98
    assert overall([c1, lost], [], None, compared=True) == "fail"
    assert overall([c1, c8], [], None, compared=True) == "pass"
    # no margin: must not lose means not at all
    strict = USERS.with_overrides(margin=0.0)
    assert judge_level(_level(8, 99.0, 99.1, 99.1, 99.2), INC, strict, final=True).verdict == "fail"


def test_required_gain_and_advisory_levels() -> None:
    prof = GateProfile(concurrency=(1, 30), levels={30: LevelPolicy(min_gain=0.05),
                                                    1: LevelPolicy(required=False)},
                       runs=3, max_runs=3, session_drift=0.0)
    c30 = judge_level(_level(30, 104.0, 104.1, 104.2), INC, prof, final=True)
    assert c30.verdict == "fail" and c30.bar == 1.05
    assert "required +5%: fail" in c30.explanation
    c1 = judge_level(_level(1, 50.0, 50.1, 50.2), INC, prof, final=True)
    assert c1.verdict == "fail" and not c1.required
    assert c1.explanation.endswith("(advisory: does not decide the gate)")
    assert c1.reasons[0].endswith("(advisory level)")
    fast30 = judge_level(_level(30, 110.0, 110.1, 110.2), INC, prof, final=True)
    assert overall([c1, fast30], [], None, compared=True) == "pass"
    # failed requests decide even at an advisory level
    broken = judge_level(level_summary(1, [_run(120, failed=1)]), [100.0], prof, final=True)
    assert broken.required and overall([broken, fast30], [], None, compared=True) == "fail"


def test_level_policy_validates() -> None:
    with pytest.raises(ValueError, match="not both"):
        LevelPolicy(tolerance=0.1, min_gain=0.1)
    with pytest.raises(ValueError):
        LevelPolicy(tolerance=1.5)


def test_level_tolerance_from_the_cli() -> None:
    assert _level_bars(("1=8", "30=0", "250=-5")) == {
        1: {"tolerance": 0.08}, 30: {"tolerance": 0.0}, 250: {"min_gain": 0.05}}
    assert _level_bars(()) is None
    for bad in ("1", "x=5", "0=5", "1=abc", "1=100"):
        with pytest.raises(InputError, match=r"--level-tolerance: .* is not C=PCT"):
            _level_bars((bad,))
    merged = USERS.with_overrides(levels={8: {"tolerance": 0.03}})
    assert merged.bar(1) == 0.92 and merged.bar(8) == 0.97 and merged.bar(30) == 0.98
    assert (merged.margin_at(8), merged.margin_at(30)) == (0.0, 0.02)


def test_sim_stack_holds_the_users_policy_and_the_model_clears_it() -> None:
    """By the simulator's model (no clock): topk1-v2 clears every bar of the sim stack's
    gate profile with margin, topk4-v1 misses C=8 by far."""
    root = Path(__file__).resolve().parents[1]
    prof = load_stack("sim", root=root).gate.profiles["quick"]
    assert prof.bar(1) == pytest.approx(0.92) and prof.bar(8) == 0.98 and prof.bar(2) == 0.98
    base = PROFILES["baseline"]
    topk1 = PROFILES["eagle3-topk1-v2"].as_measured()
    topk4 = PROFILES["eagle3-topk4-v1"].as_measured()

    def c1(p):  # type: ignore[no-untyped-def]
        return single_stream_tok_s(p, prof.input_len, prof.output_len)

    assert c1(topk1) / c1(base) == pytest.approx(0.935, abs=0.001)  # 1.5 points above the bar
    assert steady_tok_s(topk1, 8) / steady_tok_s(base, 8) > 1.5
    assert steady_tok_s(topk4, 8) / steady_tok_s(base, 8) < 0.65
    for c in range(2, 251):  # "must not lose from C=2" holds across the users' range
        assert steady_tok_s(topk1, c) >= steady_tok_s(base, c)
