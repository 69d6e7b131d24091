"""Compatibility rules as data: one table of (id, severity, condition, message, source).

Each condition is a small pure function of the Stack that yields the spec
paths it objects to (and values for the message). `check_rules` turns hits
into findings that point at those paths in the YAML.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from builder.errors import Finding
from builder.facts import (
    ARCH_MIN_CUDA,
    CMAKE_OPTION_PREFIXES,
    COMPONENT_DIST,
    FLASHINFER_PURE_FROM,
    PRESENCE_ENV,
    SGLANG_CUDA13_FROM,
    SGLANG_LAST_CUDA12,
    SGLANG_PINS,
    SGLANG_PYTHONS,
    TORCH_CUDA_WHEELS,
)
from builder.facts import driver_floor as driver_floor  # re-exported: preflight checks the same floor
from builder.paths import cache_dir
from builder.spec import Stack, positions

Hit = tuple[tuple[str | int, ...], dict[str, Any]]


# The facts each condition reads live in builder.facts, each with its source.


def _ver(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def _cu_tag(index: str | None) -> str | None:
    m = re.search(r"/(cu\d{3})/?$", index or "")
    return m.group(1) if m else None


def _flag_on(stack: Stack, name: str) -> bool:
    v = stack.server.flags.get(name)
    return v is not None and v is not False


def _source_env(stack: Stack, comp: str, key: str) -> tuple[str | None, tuple[str | int, ...]]:
    c = getattr(stack.components, comp)
    if c is None or c.source is None:
        return None, ()
    return c.source.env.get(key), ("components", comp, "source", "env", key)


def _fusion_patched(stack: Stack) -> bool:
    return any("flashinfer_comm_fusion.py" in p.text for p in stack.patches)


def _sm120(stack: Stack) -> bool:
    return "sm_120" in stack.arches


def _fusion_flags(stack: Stack) -> Iterator[str]:
    if _flag_on(stack, "--enable-flashinfer-allreduce-fusion"):
        yield "--enable-flashinfer-allreduce-fusion"
    if stack.server.flags.get("--flashinfer-allreduce-fusion-backend") not in (None, False, "none", "disabled"):
        yield "--flashinfer-allreduce-fusion-backend"


# --- conditions ---------------------------------------------------------------


def _arch_cuda(s: Stack) -> Iterator[Hit]:
    for i, arch in enumerate(s.arches):
        need = ARCH_MIN_CUDA.get(arch)
        if need and s.cuda_mm and s.cuda_mm < need:
            yield ("arches", i), {"arch": arch, "need": f"{need[0]}.{need[1]}", "cuda": s.cuda}


def _fi_arch(s: Stack) -> Iterator[Hit]:
    val, path = _source_env(s, "flashinfer", "FLASHINFER_CUDA_ARCH_LIST")
    if val and s.cuda_mm and s.cuda_mm < (12, 9):
        for tok in val.split():
            if tok.endswith("f"):
                yield path, {"arch": tok, "alt": tok[:-1] + "a", "cuda": s.cuda}
    aot = _fi_aot(s)
    if aot and s.cuda_mm and s.cuda_mm < (12, 9):
        for i, tok in enumerate(aot):
            if tok.endswith("f"):
                path = ("components", "flashinfer", "aot", "arches", i)
                yield path, {"arch": tok, "alt": tok[:-1] + "a", "cuda": s.cuda}


def _fi_aot(s: Stack) -> tuple[str, ...]:
    c = s.components.flashinfer
    return c.aot.arches if c is not None and c.aot is not None else ()


def aot_arch_for(arch: str, cuda_mm: tuple[int, int] | None) -> str | None:
    """The FLASHINFER_CUDA_ARCH_LIST word flashinfer's runtime picks for sm_XYZ (its _normalize_cuda_arch)."""
    m = re.fullmatch(r"sm_(\d+)(\d)", arch)
    if not m:
        return None
    major, minor = int(m.group(1)), m.group(2)
    if major == 12 and minor == "0":
        return "12.0f" if cuda_mm and cuda_mm >= (12, 9) else "12.0a"
    return f"{major}.{minor}" + ("a" if major >= 9 else "")


def _fi_aot_cover(s: Stack) -> Iterator[Hit]:
    aot = _fi_aot(s)
    have = {re.sub(r"[af]$", "", a) for a in aot}
    for arch in s.arches if aot else ():
        want = aot_arch_for(arch, s.cuda_mm)
        if want and re.sub(r"[af]$", "", want) not in have:
            yield ("components", "flashinfer", "aot", "arches"), {"arch": arch, "want": want, "have": " ".join(aot)}


def _fi_aot_build(s: Stack) -> Iterator[Hit]:
    c = s.components.flashinfer
    if c is None or c.aot is None:
        return
    if c.source is not None:
        yield ("components", "flashinfer", "aot"), {"why": "it compiles the locked wheel's sources: drop source:"}
    elif "devel" not in s.base_image.rsplit(":", 1)[-1]:
        why = f"it needs nvcc, which {s.base_image} lacks: use a -devel- base"
        yield ("components", "flashinfer", "aot"), {"why": why}


def _torch_wheel(s: Stack) -> Iterator[Hit]:
    t = s.components.torch
    if t is None or t.source is not None:
        return
    tag = _cu_tag(t.index)
    if tag is None:
        return
    minor = _ver(t.version)[:2]
    have = TORCH_CUDA_WHEELS.get((minor[0], minor[1])) if len(minor) == 2 else None
    if have is not None and tag not in have:
        yield ("components", "torch", "index"), {"version": t.version, "tag": tag, "have": ", ".join(sorted(have))}


def _torch_index_cuda(s: Stack) -> Iterator[Hit]:
    t = s.components.torch
    tag = _cu_tag(t.index if t else None)
    if t and tag and s.cuda_mm and tag[:4] != f"cu{s.cuda_mm[0]}":
        want = _torch_tag_for(t.version, s.cuda_mm)
        yield ("components", "torch", "index"), {"tag": tag, "cuda": s.cuda, "want": want}


def _torch_tag_for(version: str, cuda: tuple[int, int]) -> str:
    """The index to propose: a cuXYZ torch `version` ships, same CUDA major, not newer than the stack's."""
    minor = _ver(version)[:2]
    have = TORCH_CUDA_WHEELS.get((minor[0], minor[1])) if len(minor) == 2 else None
    fits = sorted(tag for tag in have or () if tag[2:4] == str(cuda[0]) and int(tag[4:]) <= cuda[1])
    if fits:
        return f"the {fits[-1]} index"
    return f"no index: torch {version} ships no CUDA {cuda[0]}.x<={cuda[0]}.{cuda[1]} wheel, so pin another torch"


def _pins(s: Stack) -> Iterator[Hit]:
    v = s.sglang_version
    if v is None:
        return
    pins = _release_pins(v)
    for comp, dist in COMPONENT_DIST.items():
        c = getattr(s.components, comp)
        want = pins.get(dist)
        if c is not None and want and c.version != want:
            yield ("components", comp, "version"), {"comp": comp, "have": c.version, "want": want, "sglang": v}


def _release_pins(version: str) -> dict[str, str]:
    from builder import sglang

    if sglang.wheel_path(version) or (cache_dir() / "sglang" / version / "flags.json").is_file():
        try:
            req = sglang.load_table(version, offline=True).requires
            if req:
                return req
        except Exception:  # a broken cache falls back to the table below
            pass
    return SGLANG_PINS.get(version, {})


def _sglang_cuda13(s: Stack) -> Iterator[Hit]:
    v = s.sglang_version
    if v and s.cuda_mm and s.cuda_mm[0] < 13 and _ver(v) >= SGLANG_CUDA13_FROM:
        yield (
            ("components", "sglang", "version"),
            {
                "version": v,
                "cuda": s.cuda,
                "floor": driver_floor(s.cuda),
                "last": SGLANG_LAST_CUDA12,
            },
        )


def _python_distro(s: Stack) -> Iterator[Hit]:
    from builder.lock.target import DISTROS, distro_of

    d = distro_of(s.base_image)
    if s.server.engine == "sglang" and d and s.python not in DISTROS[d].pythons:
        yield ("python",), {"python": s.python, "distro": d, "have": ", ".join(DISTROS[d].pythons)}


def _python_sglang(s: Stack) -> Iterator[Hit]:
    v = s.sglang_version
    have = SGLANG_PYTHONS.get(v or "")
    if v and have and s.python not in have:
        yield ("python",), {"python": s.python, "sglang": v, "have": ", ".join(have)}


def _presence_env(s: Stack) -> Iterator[Hit]:
    for name, c in s.components.items():
        for key in c.source.env if c.source else {}:
            if key in PRESENCE_ENV:
                yield ("components", name, "source", "env", key), {"name": key, "why": PRESENCE_ENV[key]}
    for key in s.server.env:
        if key in PRESENCE_ENV:
            yield ("server", "env", key), {"name": key, "why": PRESENCE_ENV[key]}


def _cmake_env(s: Stack) -> Iterator[Hit]:
    for name, c in s.components.items():
        for key in c.source.env if c.source else {}:
            if key.startswith(CMAKE_OPTION_PREFIXES):
                yield ("components", name, "source", "env", key), {"name": key, "comp": name}


def _flashinfer_noop(s: Stack) -> Iterator[Hit]:
    c = s.components.flashinfer
    if c is not None and c.source is not None and _ver(c.version) >= FLASHINFER_PURE_FROM:
        yield ("components", "flashinfer", "source"), {"version": c.version}


def _opens_trtllm_on_sm120(text: str) -> bool:
    """The patch edits flashinfer_comm_fusion.py and adds an SM120 case (an added line naming sm120)."""
    return "flashinfer_comm_fusion.py" in text and any(
        ln.startswith("+") and not ln.startswith("+++") and "sm120" in ln.lower() for ln in text.splitlines()
    )


def _patch_trtllm_ipc(s: Stack) -> Iterator[Hit]:
    if not _sm120(s) or s.server.env.get("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE") in (None, "0"):
        return
    for i, p in enumerate(s.patches):
        if _opens_trtllm_on_sm120(p.text):
            yield ("patches", i), {}


def _fusion_patch(s: Stack) -> Iterator[Hit]:
    if _sm120(s) and s.sglang_version and _ver(s.sglang_version) <= (0, 5, 23) and not _fusion_patched(s):
        for f in _fusion_flags(s):
            yield ("server", "flags", f), {"flag": f, "sglang": s.sglang_version}


def _fusion_cuda128(s: Stack) -> Iterator[Hit]:
    if _sm120(s) and s.cuda_mm and s.cuda_mm < (13, 0):
        for f in _fusion_flags(s):
            yield ("server", "flags", f), {"flag": f, "cuda": s.cuda}


def _symm_mem(s: Stack) -> Iterator[Hit]:
    if _sm120(s) and _flag_on(s, "--enable-torch-symm-mem"):
        yield ("server", "flags", "--enable-torch-symm-mem"), {}


def _spec_cap(s: Stack) -> Iterator[Hit]:
    if s.server.flags.get("--speculative-algorithm") and "--max-running-requests" not in s.server.flags:
        yield ("server", "flags", "--speculative-algorithm"), {}


def _adaptive_topk(s: Stack) -> Iterator[Hit]:
    if _flag_on(s, "--speculative-adaptive"):
        topk = s.server.flags.get("--speculative-eagle-topk")
        if topk is not None and str(topk) != "1":
            yield ("server", "flags", "--speculative-adaptive"), {"topk": topk}


def _moe_runner(s: Stack) -> Iterator[Hit]:
    v = s.server.flags.get("--moe-runner-backend")
    if _sm120(s) and v in ("auto", "flashinfer_trtllm") and not any(a.startswith("sm_10") for a in s.arches):
        yield ("server", "flags", "--moe-runner-backend"), {"value": v}


def _driver(s: Stack) -> Iterator[Hit]:
    floor = driver_floor(s.cuda)
    if floor and s.host.driver and _ver(s.host.driver)[0] < floor:
        yield ("host", "driver"), {"driver": s.host.driver, "floor": floor, "cuda": s.cuda}


def _tp_gpus(s: Stack) -> Iterator[Hit]:
    tp_flag = s.server.flags.get("--tp-size", s.server.flags.get("--tensor-parallel-size"))
    if tp_flag is not None and str(tp_flag) != str(s.runtime.tp):
        yield ("server", "flags", "--tp-size"), {"flag": tp_flag, "tp": s.runtime.tp}
    n = s.runtime.gpu_count
    if n is not None and s.runtime.tp > n:
        yield ("runtime", "tp"), {"tp": s.runtime.tp, "gpus": n}


def _base_cuda(s: Stack) -> Iterator[Hit]:
    m = re.search(r"cuda:(\d+\.\d+(?:\.\d+)?)", s.base_image)
    if m and s.cuda and not m.group(1).startswith(s.cuda) and not s.cuda.startswith(m.group(1)):
        yield ("base_image",), {"image": m.group(1), "cuda": s.cuda}


@dataclass(frozen=True)
class Rule:
    id: str
    severity: str
    condition: Callable[[Stack], Iterator[Hit]]
    message: str
    source: str


RULES: tuple[Rule, ...] = (
    Rule(
        "sglang-cuda13",
        "error",
        _sglang_cuda13,
        "sglang {version} requires cuda-python>=13.0 (every sglang from 0.5.11 on): a CUDA 13 closure "
        "(nvidia-cuda-runtime 13, libcudart.so.13) needing driver >= 580, but this stack is CUDA {cuda} "
        "(driver >= {floor}); pin sglang {last} (the last all-CUDA-12 release) or use a CUDA 13 base",
        "sglang wheels' Requires-Dist on PyPI (cuda-python>=13.0 from 0.5.11; ==12.9 in 0.5.10.post1)",
    ),
    Rule(
        "python-distro",
        "error",
        _python_distro,
        'python {python} is not what {distro} installs (it has python{have}); set python: "{have}"',
        "packages.ubuntu.com / packages.debian.org (see builder.lock.target.DISTROS)",
    ),
    Rule(
        "python-sglang",
        "error",
        _python_sglang,
        "sglang {sglang} ships wheels for python {have} only, not {python}; pick one of those",
        "sglang's files and Requires-Python on PyPI",
    ),
    Rule(
        "env-presence-bool",
        "error",
        _presence_env,
        "{name} is set: {why}; remove it to keep the default",
        "flashinfer 0.7.2 flashinfer/jit/core.py",
    ),
    Rule(
        "cmake-option-env",
        "error",
        _cmake_env,
        "{name} is a CMake option of {comp}, not an environment variable: the build never sees it; "
        "move it to components.{comp}.source.cmake",
        "sgl-kernel CMakeLists.txt option()/cache variables",
    ),
    Rule(
        "flashinfer-source-noop",
        "warning",
        _flashinfer_noop,
        "a flashinfer {version} source build compiles no CUDA (the wheel is the same py3-none-any as PyPI's); "
        "drop source:, and for kernels in the image set components.flashinfer.aot: {{arches: [...]}}",
        "flashinfer 0.7.2 build backend and aot.py",
    ),
    Rule(
        "patch-trtllm-displaces-ipc",
        "warning",
        _patch_trtllm_ipc,
        "this patch lets FlashInfer's trtllm allreduce run on sm_120, and all_reduce() tries it before "
        "pcie_ipc: it displaces the PCIe-IPC allreduce SGLANG_ENABLE_PCIE_IPC_ALLREDUCE asks for; fused "
        "allreduce+RMSNorm stays off (add_norm.py flashinfer_ar_fusion_applies: SM90/SM100 only)",
        "sglang 0.5.23 distributed/parallel_state.py all_reduce, layer_boundary/residual/add_norm.py",
    ),
    Rule(
        "arch-cuda",
        "error",
        _arch_cuda,
        "{arch} needs CUDA >= {need} (stack has {cuda}); raise cuda or drop the arch",
        "NVIDIA CUDA 12.8/12.9 release notes: Blackwell targets",
    ),
    Rule(
        "flashinfer-arch",
        "error",
        _fi_arch,
        "FLASHINFER_CUDA_ARCH_LIST '{arch}' needs CUDA >= 12.9 (stack has {cuda}); use '{alt}'",
        "flashinfer build docs: family-specific 'f' targets need nvcc 12.9",
    ),
    Rule(
        "flashinfer-aot-cover",
        "error",
        _fi_aot_cover,
        "flashinfer AOT builds {have} but the stack targets {arch}, which would JIT at first use; add '{want}'",
        "flashinfer 0.7.2 compilation_context.py _normalize_cuda_arch (sm_120 -> 12.0f on CUDA >= 12.9)",
    ),
    Rule(
        "flashinfer-aot-build",
        "error",
        _fi_aot_build,
        "flashinfer aot: {why}",
        "flashinfer 0.7.2 aot.py compile_and_package_modules (nvcc from CUDA_HOME, sources from the package)",
    ),
    Rule(
        "torch-wheel",
        "error",
        _torch_wheel,
        "torch {version} has no {tag} wheel (it ships {have}); build torch from source or pick another torch",
        "download.pytorch.org wheel index",
    ),
    Rule(
        "torch-index-cuda",
        "error",
        _torch_index_cuda,
        "torch index {tag} does not match the stack's CUDA {cuda}; use {want}",
        "torch wheels bundle their CUDA runtime; mixing majors breaks extensions",
    ),
    Rule(
        "sglang-pins",
        "error",
        _pins,
        "{comp} {have} disagrees with sglang {sglang}, which pins {want}; pin {want} or change sglang",
        "sglang wheel METADATA Requires-Dist",
    ),
    Rule(
        "sm120-fusion-patch",
        "error",
        _fusion_patch,
        "{flag} on sm_120 with sglang {sglang} raises 'requires SM90 or SM10X'; drop it (fused "
        "allreduce+RMSNorm is gated to SM90/SM100 in add_norm.py) or add the trtllm-allreduce patch "
        "(stacks/patches/), which enables FlashInfer's plain trtllm allreduce only",
        "sglang srt/layers/flashinfer_comm_fusion.py",
    ),
    Rule(
        "sm120-fusion-cuda",
        "error",
        _fusion_cuda128,
        "{flag} on sm_120 under CUDA {cuda} fails in FlashInfer's JIT; use the CUDA 13 stack",
        "users' results table: 'FlashInfer fusion SM120: FAILED (JIT unsupported)'",
    ),
    Rule(
        "sm120-symm-mem",
        "warning",
        _symm_mem,
        "--enable-torch-symm-mem has no effect on sm_120 (capability 12 is not in sglang's "
        "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES, which has 9 and 10 only)",
        "sglang 0.5.23 TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES; it logs 'not supported'",
    ),
    Rule(
        "spec-running-cap",
        "warning",
        _spec_cap,
        "speculative decoding without --max-running-requests silently caps the batch at 48; set it",
        "sglang 0.5.23 speculative_hook: default max_running_requests=48",
    ),
    Rule(
        "spec-adaptive-topk",
        "error",
        _adaptive_topk,
        "--speculative-adaptive needs --speculative-eagle-topk 1 (have {topk}); set topk to 1",
        "sglang 0.5.23 speculative_hook",
    ),
    Rule(
        "sm120-moe-runner",
        "warning",
        _moe_runner,
        "--moe-runner-backend {value} picks flashinfer_trtllm, which is SM100-only; use flashinfer_cutlass",
        "sglang 0.5.23 moe_hook",
    ),
    Rule(
        "driver-floor",
        "error",
        _driver,
        "driver {driver} is below {floor}, the floor for CUDA {cuda}; upgrade the host driver",
        "NVIDIA CUDA toolkit release notes, minimum driver versions",
    ),
    Rule(
        "tp-gpus",
        "error",
        _tp_gpus,
        "tensor parallel size and GPUs disagree ({values}); make --tp-size, runtime.tp and runtime.gpus agree",
        "sglang needs one GPU per TP rank",
    ),
    Rule(
        "base-image-cuda",
        "error",
        _base_cuda,
        "base image is CUDA {image} but the stack says cuda {cuda}; make them agree",
        "nvidia/cuda image tags",
    ),
)


def check_rules(stack: Stack, rules: tuple[Rule, ...] = RULES) -> list[Finding]:
    loc = positions(stack)
    out = []
    for rule in rules:
        for path, ctx in rule.condition(stack):
            pos = loc.keys.get(path) or loc.pos(path)
            ctx.setdefault("values", ", ".join(f"{k}={v}" for k, v in ctx.items()))
            out.append(Finding(pos.file, pos.line, pos.col, rule.severity, rule.message.format(**ctx), rule.id))
    return out
