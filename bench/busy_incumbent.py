"""What a live incumbent's own clients do to the gate: it reads slower, and the candidate gains.

Two `stackbuild sim` processes at the sim stack's --speed 20, gated as `make demo` gates its
side-by-side candidate: `stackbuild gate --url CAND --baseline-url INC --stack sim` (the stack's
`quick` profile: C=1 may lose 8%, C=8 must not lose), the CLI in a subprocess. Each scenario is
run with the incumbent quiet, then with `--clients` closed-loop clients on it
(stackbuild.gate.background.BackgroundLoad, small completions 0.05 s apart: the demo's own client
through its gateway, whose one worker is the incumbent): an equal build, then one at --speed 17
(15% slower, past both bars). The candidate carries none of those clients, as a candidate on the
staging port carries none.

Last line: `busy_incumbent: clients=K equal_quiet=R1/R8 equal_busy=R1/R8 slower_quiet=V slower_busy=V`
(R1/R8: the gate's ratio at C=1 and C=8; V: its verdict). Each line before it also says how many requests of
other clients the gate counted on the incumbent (its /metrics, `sglang:num_requests_total`), and both servers
run with --enable-metrics, as the sim stack's do.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stackbuild.gate.background import BackgroundLoad
from stackbuild.sim.process import sim

ROOT = Path(__file__).resolve().parent.parent
SPEED = "20"  # stacks/sim.yaml's --speed
VERDICT = {0: "pass", 1: "fail", 3: "inconclusive"}


def gate(cand: str, inc: str) -> tuple[str, dict[int, str], dict[int, int | None], str]:
    """(verdict, the ratio at each level, the incumbent's outside requests the gate counted at each level,
    the gate's lines) of one gate as the CLI prints it."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "gate.json"
        got = subprocess.run([sys.executable, "-m", "stackbuild", "--root", str(ROOT), "gate", "--url", cand,
                              "--baseline-url", inc, "--stack", "sim", "--no-progress", "--json", str(out)],
                             capture_output=True, text=True, timeout=1800, cwd=ROOT)
        levels = json.loads(out.read_text())["levels"] if out.exists() else []
    ratios = {lv["concurrency"]: f"{lv['ratio']:.3f}" for lv in levels if lv.get("ratio")}
    outside = {lv["concurrency"]: lv.get("incumbent_outside_requests") for lv in levels}
    lines = [ln[2:] for ln in got.stdout.splitlines() if ln.startswith("- C=")] or \
        got.stderr.strip().splitlines()[-1:]
    return (VERDICT.get(got.returncode, f"exit {got.returncode}"), ratios, outside,
            f"{time.monotonic() - t0:.0f} s; " + " | ".join(lines))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=4, help="the incumbent's own clients (default 4: the demo's)")
    args = ap.parse_args(argv)
    said: dict[str, tuple[str, dict[int, str]]] = {}
    with sim("--speed", SPEED, "--enable-metrics") as inc:
        for name, speed in (("equal", SPEED), ("slower", "17")):
            for busy in (False, True):
                with sim("--speed", speed, "--enable-metrics") as cand:
                    if busy:
                        with BackgroundLoad(inc.url, clients=args.clients, pause_s=0.05) as load:
                            if not load.wait_for(10, 60):
                                raise SystemExit(f"the incumbent's clients did not get going: {load.summary()}")
                            verdict, ratios, outside, lines = gate(cand.url, inc.url)
                        extra = f"; the incumbent's clients: {load.summary()}"
                    else:
                        verdict, ratios, outside, lines = gate(cand.url, inc.url)
                        extra = ""
                key = f"{name}_{'busy' if busy else 'quiet'}"
                said[key] = (verdict, ratios)
                counted = ", ".join(f"C={c} {n}" for c, n in outside.items())
                print(f"{key}: {verdict}; {lines}{extra}; the gate counted the incumbent's other requests: "
                      f"{counted}", flush=True)

    def r(key: str) -> str:
        return f"{said[key][1].get(1, '-')}/{said[key][1].get(8, '-')}"

    print(f"busy_incumbent: clients={args.clients} equal_quiet={r('equal_quiet')} equal_busy={r('equal_busy')} "
          f"slower_quiet={said['slower_quiet'][0]} slower_busy={said['slower_busy'][0]}")


if __name__ == "__main__":
    main()
