"""How close the gate's measured output tok/s is to what the simulator truly emitted.

Starts `stackbuild sim` (baseline profile) as a separate process, and at each
concurrency C runs one gate run (builder.gate.loadgen.run_once, the code the gate
uses) after resetting the simulator's ground-truth counters. Truth is
GET /sim/stats: tokens written to clients / (last token write - first request
arrival). Also prints the client's CPU seconds per 1000 streamed tokens.

sglang's own client (python -m sglang.bench_serving) cannot run here: it imports
transformers and needs a tokenizer download, and this machine has neither.

Last line: `gate_accuracy: max_error_pct=X cpu_s_per_1k_tokens=Y`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_sim_process import sim

from builder.gate import loadgen
from builder.gate.result import Workload

# (concurrency, output tokens per request): each run lasts a few seconds at --speed 2
LEVELS = ((1, 512), (8, 256), (64, 128), (256, 64))


def _post(url: str) -> None:
    req = urllib.request.Request(url, data=b"{}", method="POST")
    urllib.request.urlopen(req, timeout=10).read()


def _get(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return dict(json.load(r))


def measure(url: str, concurrency: int, output_len: int, api: str) -> tuple[float, float, float]:
    wl = Workload(api=api, input_len=128, output_len=output_len, warmup=0,  # type: ignore[arg-type]
                  concurrency=(concurrency,), timeout_s=300)
    _post(url + "/sim/stats/reset")
    cpu0 = time.process_time()
    run = asyncio.run(loadgen.run_once(url, wl, concurrency, 0))
    cpu = time.process_time() - cpu0
    truth = _get(url + "/sim/stats")
    assert run.failed == 0, run.errors
    assert truth["output_tokens"] == run.output_tokens, (truth, run.output_tokens)
    true_rate = truth["output_tok_s"]
    err = abs(run.output_tok_s - true_rate) / true_rate * 100
    cpu_per_1k = cpu / (run.output_tokens / 1000)
    print(f"{api:12s} C={concurrency:4d}  gate {run.output_tok_s:8.1f} tok/s  truth "
          f"{true_rate:8.1f} tok/s  error {err:5.2f}%  client cpu {cpu_per_1k:.4f} s/1k tok  "
          f"({run.output_tokens} tokens in {run.duration_s:.2f}s)", flush=True)
    return err, cpu, run.output_tokens


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--speed", type=float, default=2.0)
    ap.add_argument("--api", choices=["completions", "generate", "both"], default="completions")
    args = ap.parse_args()
    apis = ["completions", "generate"] if args.api == "both" else [args.api]
    errors: list[float] = []
    cpu_total = tokens_total = 0.0
    with sim("--speed", str(args.speed), "--profile", "baseline") as s:
        for api in apis:
            for c, out_len in LEVELS:
                err, cpu, tokens = measure(s.url, c, out_len, api)
                errors.append(err)
                cpu_total += cpu
                tokens_total += tokens
    print(f"gate_accuracy: max_error_pct={max(errors):.3f} "
          f"cpu_s_per_1k_tokens={cpu_total / (tokens_total / 1000):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
