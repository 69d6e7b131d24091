"""The results table, per-concurrency tables and the deployment-strategy conclusion.

Pure: ledger records in, a `Report` out, Markdown or JSON text from it. Only
comparable results meet: a group is one workload fingerprint on one host
class. Within a group the newest result of each configuration is current; older
ones stay in the table, marked superseded. Every claim in the conclusion
carries the numbers behind it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from stackbuild.gate.result import GateResult, LevelResult
from stackbuild.gate.stats import allowed
from stackbuild.results import speculation
from stackbuild.results.ledger import BuildRecord, DeployRecord, GateRecord

MAX_BUILDS = 10
STATUS = {"pass": "PASS", "fail": "FAILED", "inconclusive": "INCONCLUSIVE", "reference": "Reference"}


@dataclass(frozen=True)
class Row:
    config: str
    status: str  # Reference | PASS | FAILED | INCONCLUSIVE | UNTESTED | SUPERSEDED
    tok_s: float | None  # median output tok/s at the lowest concurrency measured (the users' column)
    notes: str
    recorded_at: str
    run_id: int | None = None


@dataclass(frozen=True)
class Cell:
    tok_s: float
    ttft_p99_ms: float
    ratio: float | None
    verdict: str
    runs: int = 0
    ci_low: float | None = None
    ci_high: float | None = None
    bar: float | None = None  # the level's policy, when the gate had one
    margin: float = 0.0  # the "must not lose" margin the bar carries


@dataclass
class Group:
    fingerprint: str
    host_class: str
    workload: dict[str, Any]
    reference: str | None
    levels: list[int]
    rows: list[Row] = field(default_factory=list)
    # config -> concurrency -> cell, current results only
    cells: dict[str, dict[int, Cell]] = field(default_factory=dict)
    conclusion: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class BuildRow:
    config: str
    image: str
    digest: str | None
    content_hash: str
    recorded_at: str
    deployed: str  # where it was last promoted (else its latest deploy), or "not deployed"


@dataclass
class Report:
    groups: list[Group]
    unfiled: list[Row]  # deploys that never reached a gate and name no workload we measured
    builds: list[BuildRow] = field(default_factory=list)  # newest first

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def deploy_config(d: DeployRecord) -> str:
    """The name a deploy's gate result carries: the stack label."""
    return f"{d.stack}-{d.variant}" if d.variant else d.stack


def _pct(r: float) -> str:
    return f"{(r - 1) * 100:+.1f}%"


def _policy(lv: LevelResult) -> str:
    """", allowed -8%: pass": the level's bar and verdict, when the result carries a bar."""
    if lv.bar is None:
        return ""
    advisory = "" if lv.required else ", advisory"
    return f" ({allowed(lv.bar, lv.margin)}{advisory}: {STATUS.get(lv.verdict, lv.verdict)})"


def _first_reason(res: GateResult) -> str:
    reasons = [*res.bars, *res.reasons, *(res.probe.reasons if res.probe else ())]
    return reasons[0] if reasons else ""


def _row_for(rec: GateRecord, reference: str | None) -> Row:
    res = rec.result
    low = min(res.levels, key=lambda lv: lv.concurrency) if res.levels else None
    status = "Reference" if res.name == reference else STATUS.get(res.verdict, res.verdict.upper())
    if res.name != reference and res.verdict == "reference":
        status = "UNTESTED"  # measured, but never against this group's reference
    notes: list[str] = []
    if status != "Reference":
        if status in ("FAILED", "INCONCLUSIVE"):
            notes.append(_first_reason(res))
        ratios = [f"C={lv.concurrency} {_pct(lv.ratio)}" + _policy(lv)
                  for lv in res.levels if lv.ratio is not None]
        if ratios:
            # the ratios are against the incumbent this gate ran against, named as such
            notes.append(f"vs {res.baseline_name or 'its incumbent'}: " + ", ".join(ratios))
    return Row(res.name, status, low.median_output_tok_s if low else None, "; ".join(n for n in notes if n),
               res.finished_at, rec.id)


def _clip(text: str, n: int = 160) -> str:
    """The first line, cut at a word before `n` characters (never inside a bracket it opened)."""
    line = text.splitlines()[0] if text else ""
    if len(line) <= n:
        return line
    cut = line[:n].rsplit(" ", 1)[0]
    for open_, close in ("()", "[]", "{}"):
        if cut.count(open_) > cut.count(close):
            cut = cut[: cut.rfind(open_)].rstrip()
    return cut + " …"


def _deploy_row(d: DeployRecord) -> Row:
    status = {"refused": "UNTESTED", "promoted": "PROMOTED"}.get(d.outcome, "FAILED")
    what = d.crash_signature or _clip(d.cause or d.outcome)
    note = f"deploy {d.outcome}: {what}"
    if d.crash_signature and d.cause:
        note += f" ({_clip(d.cause, 120)})"
    return Row(deploy_config(d), status, None, note, d.recorded_at, None)


def _gated_deploy(d: DeployRecord, gates: list[GateRecord]) -> bool:
    """A deploy whose candidate reached the gate is represented by that gate run."""
    if d.crash_signature or d.outcome in ("refused", "failed"):
        return False
    return any(g.result.name == deploy_config(d) and g.recorded_at <= d.recorded_at for g in gates)


def _reference(current: dict[str, GateRecord]) -> str | None:
    """The incumbent the newest candidates were gated against, else the oldest plain measurement."""
    newest_first = sorted(current.values(), key=lambda g: g.recorded_at, reverse=True)
    for g in newest_first:
        if g.result.baseline_name and g.result.baseline_name in current:
            return g.result.baseline_name
    plain = [g for g in current.values() if g.result.verdict == "reference"]
    return min(plain, key=lambda g: g.recorded_at).result.name if plain else None


def _cells(res: GateResult) -> dict[int, Cell]:
    return {lv.concurrency: Cell(lv.median_output_tok_s, lv.ttft_p99_ms, lv.ratio, lv.verdict, len(lv.runs),
                                 lv.ci_low, lv.ci_high, lv.bar, lv.margin) for lv in res.levels}


def _deployed(mine: list[DeployRecord]) -> str:
    """Where the image serves (its latest promotion), else its latest deploy, and how many others."""
    if not mine:
        return "not deployed"
    promoted = [d for d in mine if d.outcome == "promoted"]
    last = max(promoted or mine, key=lambda d: (d.recorded_at, d.id))
    text = f"{last.outcome} on {last.host} as {deploy_config(last)}"
    others = sorted(d.outcome for d in mine if d is not last)
    if others:
        counts = ", ".join(f"{others.count(o)} {o}" for o in dict.fromkeys(others))
        text += f" (other deploys: {counts})"
    return text


def _build_rows(builds: list[BuildRecord], deploys: list[DeployRecord]) -> list[BuildRow]:
    rows = []
    for b in sorted(builds, key=lambda b: (b.recorded_at, b.id), reverse=True):
        mine = [d for d in deploys if (b.digest and d.digest == b.digest) or d.image == b.image]
        rows.append(BuildRow(f"{b.stack}-{b.variant}" if b.variant else b.stack, b.image, b.digest,
                             b.content_hash, b.recorded_at, _deployed(mine)))
    return rows


def build_report(gates: list[GateRecord], deploys: list[DeployRecord],
                 builds: list[BuildRecord] | None = None) -> Report:
    by_group: dict[tuple[str, str], list[GateRecord]] = {}
    for g in sorted(gates, key=lambda g: (g.recorded_at, g.id)):
        by_group.setdefault((g.result.fingerprint, g.host_class), []).append(g)
    groups: list[Group] = []
    filed: set[int] = set()
    for (fp, hclass), recs in by_group.items():
        current: dict[str, GateRecord] = {}
        for r in recs:
            current[r.result.name] = r  # sorted oldest first: the last one wins
        ref = _reference(current)
        levels = sorted({lv.concurrency for r in current.values() for lv in r.result.levels})
        group = Group(fp, hclass, recs[-1].result.workload.model_dump(mode="json"), ref, levels)
        events: dict[str, tuple[str, Row]] = {name: (r.recorded_at, _row_for(r, ref)) for name, r in current.items()}
        for d in deploys:
            if d.fingerprint == fp and (d.host_class in (None, hclass)) and not _gated_deploy(d, recs):
                filed.add(d.id)
                prev = events.get(deploy_config(d))
                if prev is None or prev[0] < d.recorded_at:
                    events[deploy_config(d)] = (d.recorded_at, _deploy_row(d))
        order = sorted(events.values(), key=lambda e: (e[1].status != "Reference", e[1].config))
        group.rows = [row for _, row in order]
        for r in recs:
            if current[r.result.name] is not r:
                newer = current[r.result.name]
                old = _row_for(r, ref)
                group.rows.append(Row(old.config, "SUPERSEDED", old.tok_s,
                                      f"was {old.status}; replaced by run #{newer.id} of {newer.result.finished_at}",
                                      old.recorded_at, r.id))
        group.cells = {name: _cells(r.result) for name, r in current.items()}
        group.conclusion = conclude(group, {name: r.result for name, r in current.items()})
        groups.append(group)
    unfiled = [_deploy_row(d) for d in deploys if d.id not in filed and not _gated_deploy(d, gates)]
    return Report(groups, unfiled, _build_rows(builds or [], deploys))


def _speculative(res: GateResult) -> bool:
    algo = res.host.get("sglang.speculative_algorithm") or res.host.get("sim.speculative") or ""
    return bool(algo and algo.lower() not in ("none", "false", "0")) or "eagle" in res.name.lower()


def _best(results: dict[str, GateResult], c: int) -> list[tuple[str, LevelResult]]:
    at = [(name, lv) for name, res in results.items() if (lv := res.level(c)) is not None]
    return sorted(at, key=lambda x: x[1].median_output_tok_s, reverse=True)


def _ranking(ranked: list[tuple[str, LevelResult]]) -> str:
    top = ranked[0][1].median_output_tok_s
    others = [f"{n} {lv.median_output_tok_s:.1f} ({_pct(lv.median_output_tok_s / top)})" for n, lv in ranked[1:]]
    return f"{ranked[0][1].median_output_tok_s:.1f} tok/s" + (f"; then {', '.join(others)}" if others else "")


def conclude(group: Group, results: dict[str, GateResult]) -> list[str]:
    """The deployment-strategy conclusion, each claim with its numbers."""
    if not results or not group.levels:
        return []
    out: list[str] = []
    lo, hi = group.levels[0], group.levels[-1]
    ranked = _best(results, lo)
    if ranked:
        out.append(f"**Latency-sensitive single requests (C={lo}):** {ranked[0][0]}, {_ranking(ranked)}.")
    ranked = _best(results, hi)
    if ranked and hi != lo:
        out.append(f"**Throughput (C={hi}, the highest measured):** {ranked[0][0]}, {_ranking(ranked)}.")
    ref = group.reference
    if ref is None or ref not in results:
        return out
    for name, res in sorted(results.items()):
        if name == ref or not _speculative(res):
            continue
        out.append(_speculation_claim(name, res, results[ref], ref))
        said = speculation.policy(name, res, ref, results[ref])
        if said:
            out.append(said)
    return out


def _speculation_claim(name: str, res: GateResult, ref_res: GateResult, ref: str) -> str:
    """Where a speculative configuration starts and stops paying against the reference."""
    tol = res.tolerance
    pays = [lv for lv in res.levels if lv.verdict == "pass"]
    fails = [lv for lv in res.levels if lv.verdict == "fail"]
    figures = ", ".join(
        f"C={lv.concurrency} {lv.median_output_tok_s:.1f} vs {b.median_output_tok_s:.1f}"
        for lv in res.levels if (b := ref_res.level(lv.concurrency)) is not None)
    above = [lv.concurrency for lv in res.levels if lv.verdict == "pass"]
    if pays and fails and max(lv.concurrency for lv in pays) < min(lv.concurrency for lv in fails):
        stop = min(lv.concurrency for lv in fails)
        return (f"**{name}** pays up to C={max(above)} and stops paying at C={stop} ({figures}): "
                f"use `--speculative-adaptive` (EAGLE/EAGLE3 with topk 1) or disable speculation above "
                f"C={max(above)}.")
    if pays and (not fails or min(lv.concurrency for lv in pays) > max(lv.concurrency for lv in fails)):
        start = min(above)
        return (f"**{name}** matches or beats {ref} (within {tol:.0%}) at every C >= {start} measured "
                f"({figures}): speculation pays from C={start} on; below it {ref} is faster.")
    peak = max((lv.median_output_tok_s for lv in res.levels), default=0.0)
    failed_at = ", ".join(f"C={lv.concurrency}" for lv in fails) or "no level"
    return (f"**{name}** never pays against {ref} (peak {peak:.1f} tok/s{_plateau(res)}; {figures}) and fails "
            f"the gate at {failed_at}: do not deploy it; keep {ref} or a speculative configuration that passes.")


def _plateau(res: GateResult, within: float = 0.05) -> str:
    """', plateauing near X tok/s from C=N' when the highest levels stay within 5% of the last."""
    levels = sorted(res.levels, key=lambda lv: lv.concurrency)
    if len(levels) < 2:
        return ""
    last = levels[-1].median_output_tok_s
    start = len(levels) - 1
    while start > 0 and abs(levels[start - 1].median_output_tok_s - last) <= within * last:
        start -= 1
    if start == len(levels) - 1:
        return ""
    return f", plateauing near {last:.0f} tok/s from C={levels[start].concurrency}"


# --- Markdown ---------------------------------------------------------------------

def _fmt(v: float | None) -> str:
    return "—" if v is None else f"**{v:.1f}**"


def _esc(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(report: Report, plot: str | None = None) -> str:
    out = ["# Results", "", "Written by `stackbuild report` from the ledger; do not edit by hand.", ""]
    if not report.groups and not report.unfiled:
        out.append("No gate results recorded yet: run `stackbuild gate --ledger ...` or `stackbuild deploy`.")
    for i, g in enumerate(report.groups, 1):
        wl = g.workload
        out += [f"## Workload {g.fingerprint} on {g.host_class}", "",
                f"{wl.get('api')} API, {wl.get('input_len')} in / {wl.get('output_len')} out tokens, "
                f"ignore_eos={wl.get('ignore_eos')}, seed {wl.get('seed')}, C={','.join(map(str, g.levels))}; "
                f"reference: {g.reference or 'none'}."
                + (" Simulated: tok/s are --speed times, latencies 1/--speed of, the calibrated hardware figures."
                   if g.host_class.startswith("simulator at --speed") else ""), "",
                "| config | status | tok/s | notes |", "|---|---|---|---|"]
        out += [f"| {_esc(r.config)} | {r.status} | {_fmt(r.tok_s)} | {_esc(r.notes)} |" for r in g.rows]
        out += ["", "Output tok/s per concurrency (ratio to the reference, gate verdict):", "",
                "| config | " + " | ".join(f"C={c}" for c in g.levels) + " |",
                "|---|" + "---|" * len(g.levels)]
        names = sorted(g.cells, key=lambda n: (n != g.reference, n))
        for name in names:
            cells = []
            for c in g.levels:
                cell = g.cells[name].get(c)
                if cell is None:
                    cells.append("")
                elif cell.ratio is None:
                    cells.append(f"{cell.tok_s:.1f}")
                else:
                    bar = "" if cell.bar is None else f"{allowed(cell.bar, cell.margin)}: "
                    said = STATUS.get(cell.verdict, cell.verdict)
                    cells.append(f"{cell.tok_s:.1f} ({_pct(cell.ratio)}, {bar}{said})")
            out.append(f"| {_esc(name)} | " + " | ".join(cells) + " |")
        for name in names:
            if name != g.reference:
                out += ["", *_variant_table(g, name)]
        if g.conclusion:
            out += ["", "**Conclusion for deployment strategy:**", ""]
            out += [f"- {c}" for c in g.conclusion]
        if plot and i == 1:
            out += ["", f"![tok/s and TTFT p99 vs concurrency]({plot})"]
        out.append("")
    if report.unfiled:
        out += ["## Deploys without a gate result", "", "| config | status | tok/s | notes |", "|---|---|---|---|"]
        out += [f"| {_esc(r.config)} | {r.status} | — | {_esc(r.notes)} |" for r in report.unfiled]
        out.append("")
    if report.builds:
        shown = report.builds[:MAX_BUILDS]
        out += ["## Builds", "", "| config | image | digest | deployed | built |", "|---|---|---|---|---|"]
        out += [f"| {_esc(b.config)} | `{b.image}` | {f'`{b.digest}`' if b.digest else 'not pushed'} | "
                f"{_esc(b.deployed)} | {b.recorded_at} |" for b in shown]
        if len(report.builds) > len(shown):
            out.append(f"\n{len(report.builds) - len(shown)} older builds not shown (`stackbuild report --json`).")
        out.append("")
    return "\n".join(out)


def _variant_table(g: Group, name: str) -> list[str]:
    """One candidate level by level against the reference: medians, the gate's ratio and CI, runs."""
    ref = g.reference
    ref_cells = g.cells.get(ref, {}) if ref else {}
    rows = [f"**{_esc(name)}** vs {_esc(ref or 'no reference')}, per concurrency:", "",
            f"| C | {_esc(ref or 'reference')} tok/s | {_esc(name)} tok/s | ratio | CI | "
            "TTFT p99 ms (ref / this) | runs | gate |", "|---|---|---|---|---|---|---|---|"]
    for c, cell in sorted(g.cells[name].items()):
        base = ref_cells.get(c)
        ci = "—" if cell.ci_low is None or cell.ci_high is None else f"[{cell.ci_low:.3f}, {cell.ci_high:.3f}]"
        ratio = "—" if cell.ratio is None else f"{cell.ratio:.3f}"
        ttft_ref = "—" if base is None else f"{base.ttft_p99_ms:.1f}"
        rows.append(f"| {c} | {'—' if base is None else f'{base.tok_s:.1f}'} | {cell.tok_s:.1f} | {ratio} | {ci} | "
                    f"{ttft_ref} / {cell.ttft_p99_ms:.1f} | {cell.runs} | {STATUS.get(cell.verdict, cell.verdict)} |")
    return rows
