"""The gate over live HTTP against the simulator, and what common prompts buy.

1. The paired spread with the same prompts on both sides against different prompts: two
   identical `stackbuild sim --profile eagle3-topk1-v2` processes (speculative: acceptance
   depends on each prompt, stackbuild/sim/model.py), --runs runs at C=1 of the real load
   generator (stackbuild.gate.loadgen.run_once), the incumbent's run i on the candidate's
   run i's prompts (what the gate does) or on another run's; the sd of log(cand_i / inc_i).
2. The Done-when of issue 26 for the gate itself: two identical simulators (`stackbuild
   sim`, baseline profile), `stackbuild gate --url CAND --baseline-url INC --concurrency
   8,32 --tolerance 0 --max-runs N --min-requests M` (builtin `quick`: must not lose, margin
   2%; N = 30 by default: at the simulator's spread and its runs' correlation, which the
   gate's default run_correlation of 0.4 allows for, 15 runs decide an equal build under half
   the time, docs/gate.md; M = 32 by default: quick's 8 requests a run at C=8 take 1.2 s,
   shorter than the simulator's drift epochs, and successive runs then correlated 0.31-0.67
   (mean 0.54) on an idle machine, past the 0.4 the boundaries allow for; 32 requests, 4.8 s
   a run as long as C=32's, read +0.06 and +0.24), --tries times; then a
   candidate at `--speed 0.9` (10% slower), --slow-tries times. Each gate is the CLI in a
   subprocess, as a user runs it; its exit code and summary are printed.

3. With --corr-runs N: how correlated successive runs at C=8 are, for each --corr-min-requests M:
   the same two identical simulators, `stackbuild gate ... --concurrency 8 --runs N --max-runs N
   --min-requests M --json FILE`, and from its runs the lag-1 autocorrelation of the paired
   log differences (what the boundaries allow for up to `run_correlation`, 0.4 by default).

Last lines:
`gate_live: c8_lag1 min_requests=M lag1=R sd=S runs=N run_s=T` (one per M, with --corr-runs)
`gate_live: same_prompts_sd=S different_prompts_sd=D runs=N`
`gate_live: identical_pass=P/T identical_fail=F slower_fail=S/T`
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stackbuild.gate import loadgen
from stackbuild.gate.result import Workload
from stackbuild.sim.process import sim


def paired_spread(runs: int, speed: float) -> tuple[float, float]:
    """(sd of the log ratio with the same prompts, with different prompts) at C=1."""
    wl = Workload(input_len=64, output_len=128, concurrency=(1,), runs=1, max_runs=1, warmup=1,
                  requests_per_slot=4)
    args = ("--profile", "eagle3-topk1-v2", "--speed", str(speed))
    same: list[float] = []
    other: list[float] = []
    with sim(*args) as a, sim(*args) as b:
        async def go() -> None:
            for i in range(runs):
                for out, theirs in ((same, i), (other, 10_000 + i)):
                    inc = await loadgen.run_once(b.url, wl, 1, theirs)
                    cand = await loadgen.run_once(a.url, wl, 1, i)
                    out.append(math.log(cand.output_tok_s / inc.output_tok_s))
        asyncio.run(go())
    return statistics.stdev(same), statistics.stdev(other)


def lag1(xs: list[float]) -> float:
    """The lag-1 autocorrelation of a series (deviations from its mean)."""
    m = statistics.fmean(xs)
    dev = [x - m for x in xs]
    return sum(a * b for a, b in itertools.pairwise(dev)) / sum(d * d for d in dev)


def run_correlation(runs: int, min_requests: int) -> tuple[float, float, float]:
    """(lag-1 autocorrelation, sd, mean run seconds) of log(cand_i / inc_i) over `runs` live ABBA
    runs at C=8, every run measured (no early stop), by the CLI as a user runs it."""
    with tempfile.TemporaryDirectory() as tmp, sim() as inc, sim() as cand:
        out = Path(tmp) / "gate.json"
        subprocess.run([sys.executable, "-m", "stackbuild", "gate", "--url", cand.url, "--baseline-url", inc.url,
                        "--concurrency", "8", "--tolerance", "0", "--runs", str(runs), "--max-runs", str(runs),
                        "--min-requests", str(min_requests), "--no-progress", "--json", str(out)],
                       capture_output=True, text=True, timeout=3600, check=False)
        level = json.loads(out.read_text())["levels"][0]
    diffs = [math.log(r["output_tok_s"] / b) for r, b in zip(level["runs"], level["baseline_runs_tok_s"], strict=False)]
    return lag1(diffs), statistics.stdev(diffs), statistics.fmean(r["duration_s"] for r in level["runs"])


def gate(cand: str, inc: str, max_runs: int, min_requests: int) -> tuple[int, str]:
    t0 = time.monotonic()
    got = subprocess.run([sys.executable, "-m", "stackbuild", "gate", "--url", cand,
                          "--baseline-url", inc, "--concurrency", "8,32", "--tolerance", "0",
                          "--max-runs", str(max_runs), "--min-requests", str(min_requests),
                          "--no-progress"],
                         capture_output=True, text=True, timeout=1800)
    runs = [ln.split("|")[2].strip() for ln in got.stdout.splitlines()
            if ln.startswith(("| 8 |", "| 32 |"))]
    lines = [ln[2:] for ln in got.stdout.splitlines() if ln.startswith("- C=")] or \
        got.stderr.strip().splitlines()[-1:]
    if runs:
        lines.insert(0, f"runs {'/'.join(runs)}")
    return got.returncode, f"{time.monotonic() - t0:.0f} s; " + " | ".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20, help="paired runs for the spread (default 20)")
    ap.add_argument("--speed", type=float, default=4.0, help="the spread sims' --speed")
    ap.add_argument("--tries", type=int, default=5)
    ap.add_argument("--slow-tries", type=int, default=3)
    ap.add_argument("--max-runs", type=int, default=30, help="the gate's max runs a level")
    ap.add_argument("--min-requests", type=int, default=32,
                    help="the gate's requests a run at least (default 32: C=8's runs as long as "
                         "C=32's, ~3-5 s, past the simulator's drift epochs; 0: quick's 8 at C=8)")
    ap.add_argument("--corr-runs", type=int, default=0,
                    help="runs of the C=8 correlation part (default 0: skipped)")
    ap.add_argument("--corr-min-requests", default="0,32",
                    help="the correlation part's --min-requests values (default 0,32)")
    args = ap.parse_args(argv)
    if args.corr_runs > 2:
        for m in (int(x) for x in args.corr_min_requests.split(",")):
            r, sd, secs = run_correlation(args.corr_runs, m)
            print(f"gate_live: c8_lag1 min_requests={m} lag1={r:.2f} sd={sd:.4f} runs={args.corr_runs} "
                  f"run_s={secs:.1f}", flush=True)
    same = other = math.nan
    if args.runs > 1:
        same, other = paired_spread(args.runs, args.speed)
        print(f"paired log ratio sd at C=1, eagle3-topk1-v2, {args.runs} runs: same prompts "
              f"{same:.2%}, different prompts {other:.2%}", flush=True)
    if not (args.tries or args.slow_tries):
        return
    verdict = {0: "pass", 1: "fail", 3: "inconclusive"}
    passed = failed = slow_failed = 0
    with sim() as inc:
        for i in range(args.tries):
            with sim() as cand:
                rc, said = gate(cand.url, inc.url, args.max_runs, args.min_requests)
            passed += rc == 0
            failed += rc == 1
            print(f"identical {i + 1}: exit {rc} {verdict.get(rc, 'error')}; {said}", flush=True)
        for i in range(args.slow_tries):
            with sim("--speed", "0.9") as cand:
                rc, said = gate(cand.url, inc.url, args.max_runs, args.min_requests)
            slow_failed += rc == 1
            print(f"10% slower {i + 1}: exit {rc} {verdict.get(rc, 'error')}; {said}", flush=True)
    print(f"gate_live: same_prompts_sd={same:.4f} different_prompts_sd={other:.4f} runs={args.runs}")
    print(f"gate_live: identical_pass={passed}/{args.tries} identical_fail={failed} "
          f"slower_fail={slow_failed}/{args.slow_tries}")


if __name__ == "__main__":
    main()
