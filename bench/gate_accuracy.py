"""How close the gate's measured output tok/s is to what the simulator truly emitted.

Starts `stackbuild sim` (baseline profile) as a separate process, and at each
concurrency C runs one gate run (stackbuild.gate.loadgen.run_once, the code the gate
uses) after resetting the simulator's ground-truth counters. Truth is
GET /sim/stats: tokens written to clients / (last token write - first request
arrival). Also prints the client's CPU seconds per 1000 streamed tokens.

sglang's own client (python -m sglang.bench_serving, now sglang.benchmark.serving)
cannot run here. Tried with sglang 0.5.23 installed --no-deps plus its client's
imports (transformers, msgspec, orjson, ...) and the CPU build of torch: the client
imports sglang.srt.disaggregation.utils, which pulls in the model config, the
quantization layers and the communication kernels (triton, tvm_ffi, sgl-kernel),
i.e. the whole CUDA server stack; and its random dataset needs a Hugging Face
tokenizer download. `--raw` is the side-by-side client instead: a bare asyncio one.

Last line: `gate_accuracy: max_error_pct=X cpu_s_per_1k_tokens=Y`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import urllib.request

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
    ap.add_argument("--calibration", type=float, metavar="SPEED", default=None,
                    help="also print the profiles' C=1/30/250 figures over HTTP at this speed")
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
