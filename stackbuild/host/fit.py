"""Whether a side-by-side candidate can run beside the incumbent on the host's GPUs (pure).

Checked from the spec alone, before any host is touched. The candidate is started
by the same unit template as the incumbent, so it asks docker for the same GPUs:
`--gpus all` hands a container every GPU and `--gpus count=N` the first N, devices
0..N-1, whatever the host has (moby daemon/nvidia_linux.go, countToDevices). Within
them sglang puts TP rank i on GPU `--base-gpu-id` + i * `--gpu-id-step` (0 and 1 by
default; sglang 0.5.23 entrypoints/engine.py:935, arg_groups/fields/device.py:28).
So two sglang servers of one stack always share GPUs 0..n-1. Sharing does not fit
either: each sizes its KV pool to `--mem-fraction-static` of the memory free when it
starts and keeps the rest as runtime headroom (mem_cache/kv_cache_configurator.py:2990,
`_profile_available_bytes`), so a candidate started beside a loaded incumbent takes
the headroom the incumbent's activations and CUDA graphs were sized against.
"""

from __future__ import annotations

from stackbuild.errors import Finding, SpecError
from stackbuild.spec.load import positions
from stackbuild.spec.stack import FlagValue, Stack

RULE = "side-by-side-fit"


def _int_flag(flags: dict[str, FlagValue], *names: str, default: int) -> int:
    for n in names:
        v = flags.get(n)
        if isinstance(v, int | str) and not isinstance(v, bool) and str(v).isdigit():
            return int(v)
    return default


def _span(ids: list[int]) -> str:
    if ids == list(range(ids[0], ids[0] + len(ids))):
        return f"GPU {ids[0]}" if len(ids) == 1 else f"GPUs {ids[0]}-{ids[-1]}"
    return "GPUs " + ",".join(str(i) for i in ids)


def shared_gpus(stack: Stack) -> tuple[list[int], str] | None:
    """The GPUs a second server of this stack would share with the first, and how the spec asks for them."""
    rt, flags = stack.runtime, stack.server.flags
    if stack.server.engine != "sglang" or rt.gpus == "none" or rt.gpus == 0:
        return None
    tp = _int_flag(flags, "--tp-size", "--tensor-parallel-size", default=rt.tp)
    n = tp * _int_flag(flags, "--pp-size", "--pipeline-parallel-size", default=1) * _int_flag(
        flags, "--dp-size", "--data-parallel-size", default=1)
    base = _int_flag(flags, "--base-gpu-id", default=0)
    step = _int_flag(flags, "--gpu-id-step", default=1) or 1
    ids = [base + i * step for i in range(n)]
    if rt.gpus == "all":
        how = f"gpus: all, tp {tp}: sglang places its ranks from GPU {base}"
    else:
        how = f"gpus: {rt.gpus}: docker's --gpus count={rt.gpus} hands every container {_span(list(range(rt.gpus)))}"
        ids = [i for i in ids if i < int(rt.gpus)] or list(range(int(rt.gpus)))
    return ids, how


def side_by_side_refusal(stack: Stack) -> Finding | None:
    """The one-line refusal of a side-by-side deploy that cannot fit, located at runtime.gpus; None if it fits."""
    shared = shared_gpus(stack)
    if shared is None:
        return None
    ids, how = shared
    f = stack.server.flags.get("--mem-fraction-static")
    mem = (f"each keeps {float(f):.0%} of every one of them for weights and KV cache (--mem-fraction-static {f})"
           if isinstance(f, int | float) and not isinstance(f, bool) else
           "each sizes its KV cache to most of every one of them (--mem-fraction-static unset)")
    msg = (f"side-by-side: the candidate would run on {_span(ids)}, held by the incumbent ({how}), and {mem}; "
           "deploy with --strategy swap (the incumbent stops first), or serve the candidate from a second host "
           "behind the gateway")
    pos = positions(stack).pos(("runtime", "gpus"))
    return Finding(pos.file, pos.line, pos.col, "error", msg, RULE)


def check_side_by_side(stack: Stack, strategy: str) -> None:
    """Raise the refusal (exit 2) when `strategy` is side-by-side and the candidate cannot fit."""
    if strategy == "side-by-side" and (refusal := side_by_side_refusal(stack)) is not None:
        raise SpecError([refusal])
