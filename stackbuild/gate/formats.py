"""Writers for a GateResult: JSON (readable back as a baseline), JUnit XML, Markdown."""

from __future__ import annotations

import os
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from stackbuild.errors import InputError
from stackbuild.gate.result import AgreementPart, CapacityResult, GateResult, LevelResult


def _atomic_write(path: Path, text: str) -> None:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as err:
        raise InputError(f"{path}: cannot write ({err.strerror}); choose a writable path") from None


def write_text(path: Path | str, text: str) -> None:
    _atomic_write(Path(path), text)


def write_json(result: GateResult, path: Path | str) -> None:
    _atomic_write(Path(path), result.model_dump_json(indent=2) + "\n")


def read_json(path: Path | str) -> GateResult:
    p = Path(path)
    try:
        return GateResult.model_validate_json(p.read_text(encoding="utf-8"))
    except OSError as err:
        raise InputError(f"{p}: cannot read the baseline ({err.strerror}); "
                         "pass a result written by `stackbuild gate --json`") from None
    except ValueError as err:
        first = str(err).splitlines()[0]
        raise InputError(f"{p}: not a gate result ({first}); "
                         "pass a file written by `stackbuild gate --json`") from None


def _level_case(lv: LevelResult, suite: ET.Element, name: str) -> None:
    case = ET.SubElement(suite, "testcase", classname=f"gate.{name}",
                         name=f"C={lv.concurrency}",
                         time=f"{sum(r.duration_s for r in lv.runs):.3f}")
    msg = "; ".join(lv.reasons)
    if lv.verdict == "fail":
        ET.SubElement(case, "failure", message=msg or "failed", type="fail").text = msg
    elif lv.verdict == "inconclusive":
        ET.SubElement(case, "error", message=msg or "inconclusive", type="inconclusive").text = msg
    out = ET.SubElement(case, "system-out")
    ci = f" ci=[{lv.ci_low:.4f},{lv.ci_high:.4f}]" if lv.ci_low is not None and lv.ci_high is not None \
        else ""
    ratio = f" ratio={lv.ratio:.4f}{ci}" if lv.ratio else ""
    out.text = (f"median_output_tok_s={lv.median_output_tok_s:.2f} runs={len(lv.runs)} "
                f"ttft_p99_ms={lv.ttft_p99_ms:.1f} failed={lv.failed_requests}{ratio}"
                + (f"\n{lv.explanation}" if lv.explanation else ""))


def junit_xml(result: GateResult) -> str:
    suite = ET.Element("testsuite", name=f"stackbuild-gate {result.name}")
    for lv in result.levels:
        _level_case(lv, suite, result.name)
    if result.probe is not None:
        case = ET.SubElement(suite, "testcase", classname=f"gate.{result.name}", name="probe")
        if not result.probe.passed:
            msg = "; ".join(result.probe.reasons)
            ET.SubElement(case, "failure", message=msg, type="probe").text = msg
    ag = result.agreement
    if ag is not None and ag.compared:
        case = ET.SubElement(suite, "testcase", classname=f"gate.{result.name}", name="agreement")
        if not ag.passed:
            msg = "; ".join(ag.reasons)
            ET.SubElement(case, "failure", message=msg, type="agreement").text = msg
    case = ET.SubElement(suite, "testcase", classname=f"gate.{result.name}", name="bars")
    if result.bars:
        msg = "; ".join(result.bars)
        ET.SubElement(case, "failure", message=msg, type="bar").text = msg
    cases = list(suite)
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(sum(1 for c in cases if c.find("failure") is not None)))
    suite.set("errors", str(sum(1 for c in cases if c.find("error") is not None)))
    ET.indent(suite)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


def write_junit(result: GateResult, path: Path | str) -> None:
    _atomic_write(Path(path), junit_xml(result))


def _f(v: float | None, fmt: str = ".1f") -> str:
    return "" if v is None else format(v, fmt)


def _part(p: AgreementPart) -> str:
    """One agreement part in a line: what was sent, and how it compared."""
    sent = (f"{p.name}: {p.prompts} prompts" + (f" of {p.input_len} tokens" if p.input_len else "")
            + f" x {p.tokens} tokens" + (f", {p.concurrency} in flight" if p.concurrency else ""))
    got = [f"first {'chars' if p.concurrency == 0 else 'token'} {_f(p.first_token, '.0%')}",
           f"full match {_f(p.full_match, '.0%')}"]
    if p.logprob_drop is not None:
        got.append(f"logprob drop {p.logprob_drop:.3f}")
    if p.kl is not None:
        got.append(f"top-k overlap {_f(p.top_k_overlap, '.0%')}, KL {p.kl:.4f}")
    return f"{sent}: {', '.join(got)}: {'ok' if p.passed else 'FAILED'}"


def age_text(seconds: float | None) -> str:
    if seconds is None:
        return "age unknown"
    for unit, n in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= n:
            return f"{seconds / n:.1f} {unit} old"
    return f"{seconds:.0f} s old"


def baseline_text(result: GateResult) -> str:
    """Which baseline the verdict rests on: "live X (alternating runs)" or "stored Y, 2.0 d old"."""
    if result.baseline_name is None:
        return "no baseline (a reference measurement)"
    if result.baseline_source == "stored":
        drift = f"; session drift {result.session_drift:.1%} in the intervals" \
            if result.session_drift else ""
        return (f"stored result {result.baseline_name} of {result.baseline_measured_at}, "
                f"{age_text(result.baseline_age_s)}{drift}")
    return f"live {result.baseline_name} (runs alternating, compared pairwise)"


def markdown_summary(result: GateResult) -> str:
    wl = result.workload
    margin = f" · margin {result.margin:.0%}" if result.margin else ""
    deciding = " · traffic decides" if result.decide_on == "traffic" else ""
    head = (f"## Gate: {result.name} — **{result.verdict.upper()}**\n\n"
            f"{result.url} · baseline: {baseline_text(result)}"
            + f" · {wl.api} · {wl.input_len} in / {wl.output_len} out · tolerance "
            f"{result.tolerance:.0%}{margin}{deciding} · workload {result.fingerprint}\n\n")
    rows = ["| C | runs | output tok/s (median) | incumbent | ratio | CI | TTFT p99 ms "
            "| ITL p50 ms | failed | verdict |",
            "|---:|---:|---:|---:|---:|---|---:|---:|---:|---|"]
    for lv in result.levels:
        itl = sorted(r.itl_ms.p50 for r in lv.runs)[len(lv.runs) // 2] if lv.runs else 0.0  # deadline: none
        ci = f"[{lv.ci_low:.3f}, {lv.ci_high:.3f}]" if lv.ci_low is not None and lv.ci_high is not None \
            else ""
        rows.append(f"| {lv.concurrency} | {len(lv.runs)} | {lv.median_output_tok_s:.1f} | "
                    f"{_f(lv.baseline_median_output_tok_s)} | {_f(lv.ratio, '.3f')} | {ci} | "
                    f"{lv.ttft_p99_ms:.0f} | {itl:.1f} | {lv.failed_requests} | {lv.verdict} |")
    tail = []
    said = [lv.explanation for lv in result.levels if lv.explanation]
    if said:
        tail.append("Per level:\n" + "\n".join(f"- {e}" for e in said))
    if result.probe is not None:
        tail.append(f"Probe: {'passed' if result.probe.passed else 'FAILED'}"
                    f" ({len(result.probe.outputs)} prompts)")
    ag = result.agreement
    if ag is not None and ag.compared:
        tail.append(f"Agreement: {'passed' if ag.passed else 'FAILED'} ({ag.prompts} prompts x "
                    f"{ag.tokens} tokens): first token {ag.first_token:.0%}, exact prefix "
                    f"p10 {ag.prefix_p10:.0f} / p50 {ag.prefix_p50:.0f} / mean "
                    f"{ag.prefix_mean:.1f} tokens, full match {ag.full_match:.0%}; incumbent's "
                    f"outputs {ag.logprob_candidate:.3f} nats/token under the candidate vs "
                    f"{ag.logprob_incumbent:.3f} under the incumbent (drop {ag.logprob_drop:.3f})"
                    + "".join(f"\n- {_part(p)}" for p in ag.parts)
                    + f"\n\n{ag.requests} requests, {ag.seconds:.1f} s")
    elif ag is not None:
        tail.append(f"Agreement: {ag.prompts} greedy outputs recorded for later comparisons")
    tr = result.traffic
    if tr is not None and tr.explanation:
        tail.append(f"Verdict {tr.explanation}")
    elif tr is not None:
        mix = ", ".join(f"C={c} {w:.0%}" for c, w in sorted(tr.weights.items()))
        tail.append(f"On traffic ({mix}, shares of time): expected output throughput "
                    f"{tr.change:+.1%} ({tr.confidence:.0%} CI {tr.ci_low:+.1%}..{tr.ci_high:+.1%})")
    cap = result.capacity
    if cap is not None:
        def side(c: CapacityResult) -> str:
            good = (f" [{c.goodput_low:.1f}, {c.goodput_high:.1f}]"
                    if c.goodput_low is not None and c.goodput_high is not None else "")
            return (f"{c.interval_text()}, goodput {c.goodput_tok_s:.1f} tok/s{good} "
                    f"({c.runs} runs: {'; '.join(c.tried)})")
        slo = ", ".join(f"{k} <= {v:g}" for k, v in cap.candidate.slo.items())
        line = f"Capacity under {slo}: candidate {side(cap.candidate)}"
        if cap.incumbent is not None:
            line += f"; incumbent {side(cap.incumbent)}"
        if cap.goodput_ratio is not None:
            line += f"; goodput ratio {cap.goodput_ratio:.3f}"
        tail.append(line)
    if result.reasons:
        tail.append("Reasons:\n" + "\n".join(f"- {r}" for r in result.reasons))
    return head + "\n".join(rows) + "\n\n" + "\n\n".join(tail) + "\n"
