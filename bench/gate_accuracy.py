"""How close the gate's measured output tok/s is to what the simulator truly emitted.

Starts `stackbuild sim` (baseline profile) as a separate process, and at each
concurrency C runs one gate run (stackbuild.gate.loadgen.run_once, the code the gate
uses) after resetting the simulator's ground-truth counters. Truth is
GET /sim/stats: tokens written to clients / (last token write - first request
arrival). Also prints the client's CPU seconds per 1000 streamed tokens.

`--sglang-client [PYTHON]` puts SGLang's own client (python -m sglang.benchmark.serving,
formerly sglang.bench_serving, sglang 0.5.23) side by side with the gate: same simulator,
same workload (128-token random-ids prompts, the level's output length, ignore_eos,
--max-concurrency C, --num-prompts = the gate's request count at C, no warm-up
requests), one table. PYTHON is the venv that bench/sglang_client_venv.sh builds
(default: the one under the user cache dir). Windows are defined the same way for both
clients: the simulator's counters are reset just before each client's run, so each
client's truth is the simulator's record of that client's own run (tokens written /
(last token write - first request arrival)), and each client's figure is its own
(output tokens / its own wall window). Client CPU is the client process's CPU seconds
per 1000 streamed tokens over the run alone (the gate: run_once; SGLang's: its benchmark()
coroutine); the SGLang client's whole-process CPU, most of it importing the server stack
it pulls in, is printed apart.

Last line: `gate_accuracy: max_error_pct=X cpu_s_per_1k_tokens=Y`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from stackbuild.gate import loadgen
from stackbuild.gate.result import Workload
from stackbuild.sim.process import sim

# (concurrency, output tokens per request): each run lasts a few seconds at --speed 2
LEVELS = ((1, 512), (8, 256), (64, 128), (256, 64))


def _post(url: str) -> None:
    req = urllib.request.Request(url, data=b"{}", method="POST")
    urllib.request.urlopen(req, timeout=10).read()


def _get(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return dict(json.load(r))


def measure(url: str, concurrency: int, output_len: int, api: str
            ) -> tuple[float, float, float, float, float]:
    """(error %, client cpu s, tokens, gate tok/s, truth tok/s) of one gate run."""
    wl = Workload(api=api, input_len=128, output_len=output_len, warmup=0,
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
    return err, cpu, run.output_tokens, run.output_tok_s, true_rate


async def _raw_request(host: str, port: int, body: bytes) -> tuple[int, float]:
    """A bare asyncio HTTP/1.1 SSE reader (chunked encoding), for comparison with aiohttp."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                 b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    await reader.readuntil(b"\r\n\r\n")
    tokens, buf, last = 0, b"", 0.0
    while True:
        size = int((await reader.readline()).strip(), 16)
        if size == 0:
            break
        buf += await reader.readexactly(size + 2)
        last = time.perf_counter()
        *events, buf = buf.replace(b"\r\n", b"").split(b"\n\n")
        for ev in events:
            if ev.startswith(b"data: {"):
                usage = json.loads(ev[6:]).get("usage")
                if usage:
                    tokens = usage["completion_tokens"]
    writer.close()
    return tokens, last


async def _raw_run(url: str, wl: Workload, concurrency: int) -> tuple[int, float]:
    host, port = url.removeprefix("http://").split(":")
    bodies = [json.dumps(loadgen.request_body(wl, loadgen.prompt_ids(wl, concurrency, 0, i))[1])
              .encode() for i in range(concurrency)]
    t0 = time.perf_counter()
    done = await asyncio.gather(*(_raw_request(host, int(port), b) for b in bodies))
    return sum(t for t, _ in done), max(e for _, e in done) - t0


def measure_raw(url: str, concurrency: int, output_len: int) -> tuple[float, float, float]:
    wl = Workload(input_len=128, output_len=output_len, warmup=0, concurrency=(concurrency,))
    _post(url + "/sim/stats/reset")
    cpu0 = time.process_time()
    tokens, duration = asyncio.run(_raw_run(url, wl, concurrency))
    cpu = time.process_time() - cpu0
    truth = _get(url + "/sim/stats")
    rate = tokens / duration
    err = abs(rate - truth["output_tok_s"]) / truth["output_tok_s"] * 100
    print(f"{'raw-asyncio':12s} C={concurrency:4d}  client {rate:8.1f} tok/s  truth "
          f"{truth['output_tok_s']:8.1f} tok/s  error {err:5.2f}%  client cpu "
          f"{cpu / (tokens / 1000):.4f} s/1k tok", flush=True)
    return err, cpu, tokens


SGLANG_VENV = (Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
               / "stackbuild" / "sglang-client-venv")
# Runs the client's own entry point with its benchmark() coroutine timed, so that its CPU
# cost is that of the run alone (as the gate's is), not of importing the server stack the
# client pulls in or of loading the tokenizer and making the prompts; those are printed apart.
_WRAPPER = """import sys, time
import sglang.benchmark.serving as m
t0, spent, orig = time.process_time(), [0.0], m.benchmark
async def timed(*a, **k):
    t = time.process_time()
    try:
        return await orig(*a, **k)
    finally:
        spent[0] += time.process_time() - t
m.benchmark = timed
try:
    m.cli_main()
finally:
    print(f"client_cpu import_s={t0:.3f} run_s={spent[0]:.3f} "
          f"total_s={time.process_time():.3f}", file=sys.stderr)
"""


def sglang_argv(python: str, url: str, model: str, tokenizer: str, concurrency: int,
                output_len: int, n: int, out_file: str) -> list[str]:
    """SGLang's client on the gate's workload at one level: closed loop at C (--max-concurrency
    with no request-rate cap), no warm-up requests, so its run is all the simulator sees."""
    return [python, "-c", _WRAPPER, "--backend", "sglang-oai", "--base-url", url,
            "--model", model, "--tokenizer", tokenizer, "--dataset-name", "random-ids",
            "--random-input-len", "128", "--random-output-len", str(output_len),
            "--random-range-ratio", "1.0", "--num-prompts", str(n),
            "--max-concurrency", str(concurrency), "--warmup-requests", "0",
            "--disable-tqdm", "--output-file", out_file]


def measure_sglang(python: str, url: str, concurrency: int, output_len: int
                   ) -> tuple[float, float, float, float, float]:
    """(error %, run cpu s, tokens, client tok/s, truth tok/s), and prints the import cost."""
    n = loadgen.requests_per_run(Workload(concurrency=(concurrency,)), concurrency)
    model = _get(url + "/v1/models")["data"][0]["id"]  # type: ignore[index]
    tokenizer = str(Path(python).absolute().parent.parent / "tokenizer")
    with tempfile.TemporaryDirectory(prefix="gate-accuracy-") as tmp:
        out = os.path.join(tmp, "out.jsonl")
        _post(url + "/sim/stats/reset")
        proc = subprocess.run(sglang_argv(python, url, model, tokenizer, concurrency, output_len,
                                          n, out), capture_output=True, text=True, timeout=900)
        truth = _get(url + "/sim/stats")
        if proc.returncode != 0 or not os.path.exists(out):
            raise SystemExit(f"sglang client failed (exit {proc.returncode}):\n"
                             f"{proc.stderr[-3000:]}")
        with open(out) as f:
            res = json.loads(f.read().splitlines()[-1])
    cpu = re.search(r"client_cpu import_s=([\d.]+) run_s=([\d.]+) total_s=([\d.]+)", proc.stderr)
    assert cpu, proc.stderr[-2000:]
    import_s, run_s, total_s = float(cpu[1]), float(cpu[2]), float(cpu[3])
    tokens = int(res["total_output_tokens"])
    assert res["completed"] == n, res
    assert truth["output_tokens"] == tokens, (truth, tokens)
    rate, true_rate = float(res["output_throughput"]), float(truth["output_tok_s"])
    err = abs(rate - true_rate) / true_rate * 100
    print(f"{'sglang-client':12s} C={concurrency:4d}  client {rate:8.1f} tok/s  truth "
          f"{true_rate:8.1f} tok/s  error {err:5.2f}%  client cpu {run_s / (tokens / 1000):.4f} "
          f"s/1k tok (process {total_s:.1f} s, {import_s:.1f} s of it imports)  "
          f"({tokens} tokens in {res['duration']:.2f}s)",
          flush=True)
    return err, run_s, tokens, rate, true_rate


Figures = tuple[float, float, float, float, float]


def table(rows: list[tuple[int, Figures, Figures]]) -> None:
    print("\n   C | truth(gate) |     gate  error  cpu s/1k | truth(sglang) |   sglang  error"
          "  cpu s/1k")
    for c, g, sg in rows:
        print(f"{c:4d} | {g[4]:11.1f} | {g[3]:8.1f} {g[0]:5.2f}% {g[1] / (g[2] / 1000):9.4f} | "
              f"{sg[4]:13.1f} | {sg[3]:8.1f} {sg[0]:5.2f}% {sg[1] / (sg[2] / 1000):9.4f}")


def find_sglang_python(given: str) -> str:
    python = given or str(SGLANG_VENV / "bin" / "python")
    if not os.access(python, os.X_OK):
        raise SystemExit(f"no sglang client at {python}: build it with bench/sglang_client_venv.sh")
    return python


# The users' sweep (seed-results.json "sweep"); topk4-v1 only has its plateau.
USERS = {"baseline": (92.7, 689.4, 718.1), "eagle3-topk1-v2": (86.8, 759.3, 754.4),
         "eagle3-topk4-v1": (None, None, 353.0)}


def calibration(speed: float) -> None:
    from stackbuild.sim.calibration import PROFILES
    from stackbuild.sim.model import steady_tok_s

    print(f"calibration over HTTP at --speed {speed:g}, figures divided by the speed:")
    for name, users in USERS.items():
        row = []
        profile = PROFILES[name].as_measured()
        cap = str(profile.max_running)
        with sim("--speed", str(speed), "--profile", name, "--max-running-requests", cap) as s:
            for (c, out_len, rps), want in zip(((1, 256, 4), (30, 128, 2), (250, 128, 2)),
                                               users, strict=True):
                wl = Workload(input_len=128, output_len=out_len, warmup=0, concurrency=(c,),
                              requests_per_slot=rps, timeout_s=600)
                run = asyncio.run(loadgen.run_once(s.url, wl, c, 0))
                got = run.output_tok_s / speed
                model = steady_tok_s(profile, c)
                ref = f"users {want:6.1f} ({(got / want - 1) * 100:+5.1f}%)" if want else "users    n/a"
                row.append(f"C={c}: {got:6.1f} (model {model:6.1f}, {ref})")
        print(f"  {name:16s} " + "  ".join(row), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--speed", type=float, default=2.0)
    ap.add_argument("--api", choices=["completions", "generate", "both"], default="completions")
    ap.add_argument("--raw", action="store_true",
                    help="also measure a bare asyncio client (the alternative to aiohttp)")
    ap.add_argument("--sglang-client", nargs="?", const="", default=None, metavar="PYTHON",
                    help="also run SGLang's own bench_serving at each level, side by side "
                         f"(PYTHON of the venv bench/sglang_client_venv.sh builds; default "
                         f"{SGLANG_VENV}/bin/python)")
    ap.add_argument("--calibration", type=float, metavar="SPEED", default=None,
                    help="also print the profiles' C=1/30/250 figures over HTTP at this speed")
    args = ap.parse_args()
    apis = ["completions", "generate"] if args.api == "both" else [args.api]
    sg_python = None if args.sglang_client is None else find_sglang_python(args.sglang_client)
    errors: list[float] = []
    cpu_total = tokens_total = 0.0
    rows: list[tuple[int, Figures, Figures]] = []
    with sim("--speed", str(args.speed), "--profile", "baseline") as s:
        for api in apis:
            for c, out_len in LEVELS:
                g = measure(s.url, c, out_len, api)
                errors.append(g[0])
                cpu_total += g[1]
                tokens_total += g[2]
                if sg_python and api == "completions":  # the sglang-oai backend's endpoint
                    rows.append((c, g, measure_sglang(sg_python, s.url, c, out_len)))
        if rows:
            table(rows)
        if args.raw:
            for c, out_len in LEVELS:
                measure_raw(s.url, c, out_len)
    if args.calibration:
        calibration(args.calibration)
    print(f"gate_accuracy: max_error_pct={max(errors):.3f} "
          f"cpu_s_per_1k_tokens={cpu_total / (tokens_total / 1000):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
