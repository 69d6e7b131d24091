"""The conditions of the compatibility rules: small pure functions of a Stack that yield the spec
paths they object to (and values for the message). The table that names them is rules.py."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stackbuild.spec.components import aot_arches, dist_of
from stackbuild.spec.facts import (
    ARCH_MIN_CUDA,
    CMAKE_OPTION_PREFIXES,
    FLASHINFER_PURE_FROM,
    FUSION_GATES,
    FUSION_SM120,
    FUSION_SM120_READ_THROUGH,
    PRESENCE_ENV,
    SGLANG_CUDA13_FROM,
    SGLANG_ENV_BOOL_DEFAULTS,
    SGLANG_LAST_CUDA12,
    SGLANG_PINS,
    SGLANG_PYTHONS,
    TORCH_CUDA_WHEELS,
)
from stackbuild.spec.facts import driver_floor as driver_floor  # re-exported: preflight checks the same floor
from stackbuild.spec.lock.base import agrees
from stackbuild.spec.lock.base import parse as base_pin
from stackbuild.spec.lock.check import read_lock
from stackbuild.spec.lock.target import DISTROS, distro_of, lock_command, target_of
from stackbuild.spec.patches import changes
from stackbuild.spec.sglang import env_bool, known_table
from stackbuild.spec.stack import Stack

Hit = tuple[tuple[str | int, ...], dict[str, Any]]


# The facts each condition reads live in stackbuild.spec.facts, each with its source.


def ver(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def cu_tag(index: str | None) -> str | None:
    m = re.search(r"/(cu\d{3})/?$", index or "")
    return m.group(1) if m else None


def flag_on(stack: Stack, name: str) -> bool:
    v = stack.server.flags.get(name)
    return v is not None and v is not False


def source_env(stack: Stack, comp: str, key: str) -> tuple[str | None, tuple[str | int, ...]]:
    c = stack.components.get(comp)
    if c is None or c.source is None:
        return None, ()
    return c.source.env.get(key), ("components", comp, "source", "env", key)


def lifted_gates(text: str) -> set[str]:
    """The files whose SM90/SM100 fusion gate this patch opens to SM120: it removes the gate's condition
    line and adds a code line (not a comment) that tests for SM120 (pure)."""
    out = set()
    for file, change in changes(text).items():
        gate = FUSION_GATES.get(file)
        code = [ln for ln in change.added if not ln.strip().startswith("#")]
        if gate and any(gate in ln for ln in change.removed) and any(_SM120.search(ln) for ln in code):
            out.add(file)
    return out


_SM120 = re.compile(r"sm_?120", re.IGNORECASE)


def fusion_patched(stack: Stack) -> bool:
    return any(lifted_gates(p.text) for p in stack.patches)


def sm120(stack: Stack) -> bool:
    return "sm_120" in stack.arches


def fusion_flags(stack: Stack) -> Iterator[str]:
    if flag_on(stack, "--enable-flashinfer-allreduce-fusion"):
        yield "--enable-flashinfer-allreduce-fusion"
    if stack.server.flags.get("--flashinfer-allreduce-fusion-backend") not in (None, False, "none", "disabled"):
        yield "--flashinfer-allreduce-fusion-backend"


# --- conditions ---------------------------------------------------------------


def arch_cuda(s: Stack) -> Iterator[Hit]:
    for i, arch in enumerate(s.arches):
        need = ARCH_MIN_CUDA.get(arch)
        if need and s.cuda_mm and s.cuda_mm < need:
            yield ("arches", i), {"arch": arch, "need": f"{need[0]}.{need[1]}", "cuda": s.cuda}


def fi_arch(s: Stack) -> Iterator[Hit]:
    val, path = source_env(s, "flashinfer", "FLASHINFER_CUDA_ARCH_LIST")
    if val and s.cuda_mm and s.cuda_mm < (12, 9):
        for tok in val.split():
            if tok.endswith("f"):
                yield path, {"arch": tok, "alt": tok[:-1] + "a", "cuda": s.cuda}
    aot = fi_aot(s)
    if aot and s.cuda_mm and s.cuda_mm < (12, 9):
        for i, tok in enumerate(aot):
            if tok.endswith("f"):
                path = ("components", "flashinfer", "aot", "arches", i)
                yield path, {"arch": tok, "alt": tok[:-1] + "a", "cuda": s.cuda}


def fi_aot(s: Stack) -> tuple[str, ...]:
    return aot_arches(s.components.get("flashinfer"))


def aot_arch_for(arch: str, cuda_mm: tuple[int, int] | None) -> str | None:
    """The FLASHINFER_CUDA_ARCH_LIST word flashinfer's runtime picks for sm_XYZ (its _normalize_cuda_arch)."""
    m = re.fullmatch(r"sm_(\d+)(\d)", arch)
    if not m:
        return None
    major, minor = int(m.group(1)), m.group(2)
    if major == 12 and minor == "0":
        return "12.0f" if cuda_mm and cuda_mm >= (12, 9) else "12.0a"
    return f"{major}.{minor}" + ("a" if major >= 9 else "")


def fi_aot_cover(s: Stack) -> Iterator[Hit]:
    aot = fi_aot(s)
    have = {re.sub(r"[af]$", "", a) for a in aot}
    for arch in s.arches if aot else ():
        want = aot_arch_for(arch, s.cuda_mm)
        if want and re.sub(r"[af]$", "", want) not in have:
            yield ("components", "flashinfer", "aot", "arches"), {"arch": arch, "want": want, "have": " ".join(aot)}


def fi_aot_build(s: Stack) -> Iterator[Hit]:
    c = s.components.get("flashinfer")
    if c is None or not aot_arches(c):
        return
    if c.source is not None:
        yield ("components", "flashinfer", "aot"), {"why": "it compiles the locked wheel's sources: drop source:"}
    elif "devel" not in s.base_image.split("@", 1)[0].rsplit(":", 1)[-1]:  # the tag, not a digest
        why = f"it needs nvcc, which {s.base_image} lacks: use a -devel- base"
        yield ("components", "flashinfer", "aot"), {"why": why}


def torch_wheel(s: Stack) -> Iterator[Hit]:
    t = s.components.get("torch")
    if t is None or t.source is not None:
        return
    tag = cu_tag(t.index)
    if tag is None:
        return
    minor = ver(t.version)[:2]
    have = TORCH_CUDA_WHEELS.get((minor[0], minor[1])) if len(minor) == 2 else None
    if have is not None and tag not in have:
        yield ("components", "torch", "index"), {"version": t.version, "tag": tag, "have": ", ".join(sorted(have))}


def torch_index_cuda(s: Stack) -> Iterator[Hit]:
    t = s.components.get("torch")
    tag = cu_tag(t.index if t else None)
    if t and tag and s.cuda_mm and tag[:4] != f"cu{s.cuda_mm[0]}":
        want = torch_tag_for(t.version, s.cuda_mm)
        yield ("components", "torch", "index"), {"tag": tag, "cuda": s.cuda, "want": want}


def torch_tag_for(version: str, cuda: tuple[int, int]) -> str:
    """The index to propose: a cuXYZ torch `version` ships, same CUDA major, not newer than the stack's."""
    minor = ver(version)[:2]
    have = TORCH_CUDA_WHEELS.get((minor[0], minor[1])) if len(minor) == 2 else None
    fits = sorted(tag for tag in have or () if tag[2:4] == str(cuda[0]) and int(tag[4:]) <= cuda[1])
    if fits:
        return f"the {fits[-1]} index"
    return f"no index: torch {version} ships no CUDA {cuda[0]}.x<={cuda[0]}.{cuda[1]} wheel, so pin another torch"


def pins(s: Stack) -> Iterator[Hit]:
    v = s.sglang_version
    if v is None:
        return
    pins = release_pins(v, s.root)
    for comp, c in s.components.items():
        want = pins.get(dist_of(comp))
        if want and c.version != want:
            yield ("components", comp, "version"), {"comp": comp, "have": c.version, "want": want, "sglang": v}


def release_pins(version: str, root: Path | None = None) -> dict[str, str]:
    """The release's own Requires-Dist pins: from its committed or cached table, else the facts table."""
    known = known_table(version, root)
    facts = {dist_of(n): v for n, v in SGLANG_PINS.get(version, {}).items()}
    return (known.requires if known is not None else None) or facts


def sglang_cuda13(s: Stack) -> Iterator[Hit]:
    v = s.sglang_version
    if v and s.cuda_mm and s.cuda_mm[0] < 13 and ver(v) >= SGLANG_CUDA13_FROM:
        yield (
            ("components", "sglang", "version"),
            {
                "version": v,
                "cuda": s.cuda,
                "floor": driver_floor(s.cuda),
                "last": SGLANG_LAST_CUDA12,
            },
        )


def python_distro(s: Stack) -> Iterator[Hit]:
    d = distro_of(s.base_image)
    if s.server.engine == "sglang" and d and s.python not in DISTROS[d].pythons:
        yield ("python",), {"python": s.python, "distro": d, "have": ", ".join(DISTROS[d].pythons)}


def python_sglang(s: Stack) -> Iterator[Hit]:
    v = s.sglang_version
    have = SGLANG_PYTHONS.get(v or "")
    if v and have and s.python not in have:
        yield ("python",), {"python": s.python, "sglang": v, "have": ", ".join(have)}


def presence_env(s: Stack) -> Iterator[Hit]:
    for name, c in s.components.items():
        for key in c.source.env if c.source else {}:
            if key in PRESENCE_ENV:
                yield ("components", name, "source", "env", key), {"name": key, "why": PRESENCE_ENV[key]}
    for key in s.server.env:
        if key in PRESENCE_ENV:
            yield ("server", "env", key), {"name": key, "why": PRESENCE_ENV[key]}


def cmake_env(s: Stack) -> Iterator[Hit]:
    for name, c in s.components.items():
        for key in c.source.env if c.source else {}:
            if key.startswith(CMAKE_OPTION_PREFIXES):
                yield ("components", name, "source", "env", key), {"name": key, "comp": name}


def flashinfer_noop(s: Stack) -> Iterator[Hit]:
    c = s.components.get("flashinfer")
    if c is not None and c.source is not None and ver(c.version) >= FLASHINFER_PURE_FROM:
        yield ("components", "flashinfer", "source"), {"version": c.version}


def patch_trtllm_ipc(s: Stack) -> Iterator[Hit]:
    """A patch opening flashinfer_comm_fusion.py's trtllm allreduce to SM120 while the env asks for PCIe-IPC
    (sglang reads the variable as EnvBool: unset or false/0/no/n is off, its default False)."""
    name = "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"
    if not sm120(s) or not env_bool(s.server.env.get(name), SGLANG_ENV_BOOL_DEFAULTS[name]):
        return
    for i, p in enumerate(s.patches):
        if "sglang/srt/layers/flashinfer_comm_fusion.py" in lifted_gates(p.text):
            yield ("patches", i), {}


def _fusion_off(s: Stack) -> bool:
    """Fusion flags on sm_120 that no patch lets through, with a release stackbuild has read (or older)."""
    v = s.sglang_version
    return bool(sm120(s) and v and ver(v) <= FUSION_SM120_READ_THROUGH and not fusion_patched(s))


def fusion_patch(s: Stack) -> Iterator[Hit]:
    if _fusion_off(s):
        read = " and ".join(FUSION_SM120)
        how = FUSION_SM120.get(s.sglang_version or "", f"gates it to SM90/SM100, as {read} do")
        for f in fusion_flags(s):
            yield ("server", "flags", f), {"flag": f, "sglang": s.sglang_version, "how": how}


def fusion_unknown(s: Stack) -> Iterator[Hit]:
    """A release newer than any whose fusion gate was read: say so, rather than pass in silence."""
    v = s.sglang_version
    if sm120(s) and v and ver(v) > FUSION_SM120_READ_THROUGH and not fusion_patched(s):
        last = ".".join(map(str, FUSION_SM120_READ_THROUGH))
        for f in fusion_flags(s):
            yield ("server", "flags", f), {"flag": f, "sglang": v, "last": last}


def fusion_cuda128(s: Stack) -> Iterator[Hit]:
    if sm120(s) and s.cuda_mm and s.cuda_mm < (13, 0):
        for f in fusion_flags(s):
            yield ("server", "flags", f), {"flag": f, "cuda": s.cuda}


def symm_mem(s: Stack) -> Iterator[Hit]:
    if sm120(s) and flag_on(s, "--enable-torch-symm-mem"):
        yield ("server", "flags", "--enable-torch-symm-mem"), {}


_FP4 = re.compile(r"fp4", re.IGNORECASE)
_ON = ("1", "on", "true", "yes", "y")


def uses_fp4(stack: Stack) -> bool:
    """Does the stack run FP4 (NVFP4 weights, an fp4 quantization, an FP4 kernel build)? (pure)

    FP4 tensor-core instructions exist only in the arch-specific target (sm_120a, CUTLASS's
    `CUTLASS_ARCH_MMA_SM120_SUPPORTED`), not in plain sm_120 code.
    """
    s = stack.server
    if any(_FP4.search(str(v)) for v in (s.model_path, s.served_model_name, s.flags.get("--quantization")) if v):
        return True
    return any(_FP4.search(k) and v.lower() in _ON
               for _, c in stack.components.items() if c.source for k, v in c.source.cmake.items())


def nvfp4_moe_cuda12(s: Stack) -> Iterator[Hit]:
    """An FP4 MoE on sm_120 through flashinfer_cutlass under CUDA 12 (its kernels built for 12.0a, not 120f)."""
    backend = s.server.flags.get("--moe-runner-backend")
    if (sm120(s) and s.cuda_mm and s.cuda_mm < (13, 0) and uses_fp4(s) and backend == "flashinfer_cutlass"):
        yield ("server", "flags", "--moe-runner-backend"), {"cuda": s.cuda}


def base_by_tag(s: Stack) -> Iterator[Hit]:
    """A GPU stack's base image pinned neither by the spec nor by its committed lock (the registry did not
    answer `lock`, or the lock is older): FROM names a tag. The simulator's base is a local import, in no
    registry: `build` pins it by its local image id instead."""
    if s.server.engine != "sglang" or "@" in s.base_image:
        return
    lock = read_lock(s) if target_of(s) is not None else None
    pin = base_pin(lock.text) if lock else None
    if pin is not None and pin.digest and agrees(pin, s.base_image):
        return
    why = pin.why if pin is not None and pin.why else "a tag, not a digest"
    yield ("base_image",), {"image": s.base_image, "why": why, "lock": lock_command(s)}


def nccl_tree_graphs(s: Stack) -> Iterator[Hit]:
    """NCCL_ALGO naming Tree while CUDA graphs capture the decode (sglang's default)."""
    algo = s.server.env.get("NCCL_ALGO")
    if algo and "tree" in algo.lower() and not flag_on(s, "--disable-cuda-graph"):
        yield ("server", "env", "NCCL_ALGO"), {"value": algo}


def spec_cap(s: Stack) -> Iterator[Hit]:
    if s.server.flags.get("--speculative-algorithm") and "--max-running-requests" not in s.server.flags:
        yield ("server", "flags", "--speculative-algorithm"), {}


def adaptive_topk(s: Stack) -> Iterator[Hit]:
    if flag_on(s, "--speculative-adaptive"):
        topk = s.server.flags.get("--speculative-eagle-topk")
        if topk is not None and str(topk) != "1":
            yield ("server", "flags", "--speculative-adaptive"), {"topk": topk}


def moe_runner(s: Stack) -> Iterator[Hit]:
    v = s.server.flags.get("--moe-runner-backend")
    if sm120(s) and v in ("auto", "flashinfer_trtllm") and not any(a.startswith("sm_10") for a in s.arches):
        yield ("server", "flags", "--moe-runner-backend"), {"value": v}


def driver(s: Stack) -> Iterator[Hit]:
    floor = driver_floor(s.cuda)
    if floor and s.host.driver and ver(s.host.driver)[0] < floor:
        yield ("host", "driver"), {"driver": s.host.driver, "floor": floor, "cuda": s.cuda}


def tp_gpus(s: Stack) -> Iterator[Hit]:
    tp_flag = s.server.flags.get("--tp-size", s.server.flags.get("--tensor-parallel-size"))
    if tp_flag is not None and str(tp_flag) != str(s.runtime.tp):
        yield ("server", "flags", "--tp-size"), {"flag": tp_flag, "tp": s.runtime.tp}
    n = s.runtime.gpu_count
    if n is not None and s.runtime.tp > n:
        yield ("runtime", "tp"), {"tp": s.runtime.tp, "gpus": n}


def base_cuda(s: Stack) -> Iterator[Hit]:
    m = re.search(r"cuda:(\d+\.\d+(?:\.\d+)?)", s.base_image)
    if m and s.cuda and not m.group(1).startswith(s.cuda) and not s.cuda.startswith(m.group(1)):
        yield ("base_image",), {"image": m.group(1), "cuda": s.cuda}
