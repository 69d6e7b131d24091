"""Regenerate docs/report-example.*: a real sweep of the three calibrated simulator profiles.

Runs `stackbuild sim` for baseline, eagle3-topk1-v2 and eagle3-topk4-v1 at
--speed 20 (every rate x20, so read tok/s / 20 for the users' scale), gates the
speculative ones (with --max-running-requests 256, as the stacks run them)
against baseline at C=1,2,8,30,64,250 into a scratch ledger,
and writes the report with its plot into docs/. About two minutes.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from stackbuild.gate.runner import run_gate
from stackbuild.results.ledger import Ledger
from stackbuild.results.recorder import Recorder
from stackbuild.results.writer import write_report
from stackbuild.sim.process import sim
from stackbuild.spec.profile import GateProfile

ROOT = Path(__file__).resolve().parent.parent

SWEEP = GateProfile(concurrency=(1, 2, 8, 30, 64, 250), input_len=32, output_len=128, runs=3, max_runs=6,
                    warmup=2, tolerance=0.02, requests_per_slot=4, min_requests=16, timeout_s=120)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        # recorded as every command records (results/recorder.py); the report goes to docs/, not beside it
        rec = Recorder(Path(tmp) / "ledger.db", report=False)
        rec.check()
        with sim("--speed", "20", "--profile", "baseline") as s:
            base = run_gate(s.url, SWEEP, name="baseline")
        rec.gate(base)
        for name in ("eagle3-topk1-v2", "eagle3-topk4-v1"):
            with sim("--speed", "20", "--profile", name, "--max-running-requests", "256") as s:
                rec.gate(run_gate(s.url, SWEEP, name=name, baseline=base))
        with Ledger(rec.path) as ledger:
            print(write_report(ledger, ROOT / "docs" / "report-example.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
