"""Compatibility rules as data: one table of (id, severity, condition, message, source).

Each condition is a small pure function of the Stack that yields the spec
paths it objects to (and values for the message). `check_rules` turns hits
into findings that point at those paths in the YAML.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from stackbuild.errors import Finding
from stackbuild.spec import conditions as cond
from stackbuild.spec.conditions import Hit
from stackbuild.spec.facts import driver_floor as driver_floor  # re-exported: preflight checks the same floor
from stackbuild.spec.load import positions
from stackbuild.spec.stack import Stack


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
        cond.sglang_cuda13,
        "sglang {version} requires cuda-python>=13.0 (every sglang from 0.5.11 on): a CUDA 13 closure "
        "(nvidia-cuda-runtime 13, libcudart.so.13) needing driver >= 580, but this stack is CUDA {cuda} "
        "(driver >= {floor}); pin sglang {last} (the last all-CUDA-12 release) or use a CUDA 13 base",
        "sglang wheels' Requires-Dist on PyPI (cuda-python>=13.0 from 0.5.11; ==12.9 in 0.5.10.post1)",
    ),
    Rule(
        "python-distro",
        "error",
        cond.python_distro,
        'python {python} is not what {distro} installs (it has python{have}); set python: "{have}"',
        "packages.ubuntu.com / packages.debian.org (see stackbuild.spec.lock.target.DISTROS)",
    ),
    Rule(
        "python-sglang",
        "error",
        cond.python_sglang,
        "sglang {sglang} ships wheels for python {have} only, not {python}; pick one of those",
        "sglang's files and Requires-Python on PyPI",
    ),
    Rule(
        "env-presence-bool",
        "error",
        cond.presence_env,
        "{name} is set: {why}; remove it to keep the default",
        "flashinfer 0.7.2 flashinfer/jit/core.py",
    ),
    Rule(
        "cmake-option-env",
        "error",
        cond.cmake_env,
        "{name} is a CMake option of {comp}, not an environment variable: the build never sees it; "
        "move it to components.{comp}.source.cmake",
        "sgl-kernel CMakeLists.txt option()/cache variables",
    ),
    Rule(
        "flashinfer-source-noop",
        "warning",
        cond.flashinfer_noop,
        "a flashinfer {version} source build compiles no CUDA (the wheel is the same py3-none-any as PyPI's); "
        "drop source:, and for kernels in the image set components.flashinfer.aot: {{arches: [...]}}",
        "flashinfer 0.7.2 build backend and aot.py",
    ),
    Rule(
        "patch-trtllm-displaces-ipc",
        "warning",
        cond.patch_trtllm_ipc,
        "this patch lets FlashInfer's trtllm allreduce run on sm_120, and all_reduce() tries it before "
        "pcie_ipc: it displaces the PCIe-IPC allreduce SGLANG_ENABLE_PCIE_IPC_ALLREDUCE asks for; fused "
        "allreduce+RMSNorm stays off (add_norm.py flashinfer_ar_fusion_applies: SM90/SM100 only)",
        "sglang 0.5.23 distributed/parallel_state.py all_reduce, layer_boundary/residual/add_norm.py",
    ),
    Rule(
        "arch-cuda",
        "error",
        cond.arch_cuda,
        "{arch} needs CUDA >= {need} (stack has {cuda}); raise cuda or drop the arch",
        "NVIDIA CUDA 12.8/12.9 release notes: Blackwell targets",
    ),
    Rule(
        "flashinfer-arch",
        "error",
        cond.fi_arch,
        "FLASHINFER_CUDA_ARCH_LIST '{arch}' needs CUDA >= 12.9 (stack has {cuda}); use '{alt}'",
        "flashinfer build docs: family-specific 'f' targets need nvcc 12.9",
    ),
    Rule(
        "flashinfer-aot-cover",
        "error",
        cond.fi_aot_cover,
        "flashinfer AOT builds {have} but the stack targets {arch}, which would JIT at first use; add '{want}'",
        "flashinfer 0.7.2 compilation_context.py _normalize_cuda_arch (sm_120 -> 12.0f on CUDA >= 12.9)",
    ),
    Rule(
        "flashinfer-aot-build",
        "error",
        cond.fi_aot_build,
        "flashinfer aot: {why}",
        "flashinfer 0.7.2 aot.py compile_and_package_modules (nvcc from CUDA_HOME, sources from the package)",
    ),
    Rule(
        "torch-wheel",
        "error",
        cond.torch_wheel,
        "torch {version} has no {tag} wheel (it ships {have}); build torch from source or pick another torch",
        "download.pytorch.org wheel index",
    ),
    Rule(
        "torch-index-cuda",
        "error",
        cond.torch_index_cuda,
        "torch index {tag} does not match the stack's CUDA {cuda}; use {want}",
        "torch wheels bundle their CUDA runtime; mixing majors breaks extensions",
    ),
    Rule(
        "sglang-pins",
        "error",
        cond.pins,
        "{comp} {have} disagrees with sglang {sglang}, which pins {want}; pin {want} or change sglang",
        "sglang wheel METADATA Requires-Dist",
    ),
    Rule(
        "sm120-fusion-patch",
        "error",
        cond.fusion_patch,
        "{flag} on sm_120: sglang {sglang} {how}; drop it (fused allreduce+RMSNorm is gated to SM90/SM100 "
        "in add_norm.py) or add a patch that lets SM120 through that gate, like stacks/patches/"
        "sglang-0.5.23-sm120-trtllm-allreduce.patch (FlashInfer's plain trtllm allreduce only)",
        "sglang 0.5.23 srt/layers/flashinfer_comm_fusion.py, 0.5.10.post1 srt/layers/communicator.py",
    ),
    Rule(
        "sm120-fusion-unknown",
        "warning",
        cond.fusion_unknown,
        "{flag} on sm_120: whether sglang {sglang} runs allreduce fusion on SM120 is unknown (stackbuild has "
        "read its gate up to {last}); check srt/layers/flashinfer_comm_fusion.py and communicator.py of {sglang}",
        "stackbuild.spec.facts.FUSION_SM120 (the releases read)",
    ),
    Rule(
        "sm120-fusion-cuda",
        "error",
        cond.fusion_cuda128,
        "{flag} on sm_120 under CUDA {cuda} fails in FlashInfer's JIT; use the CUDA 13 stack",
        "users' results table: 'FlashInfer fusion SM120: FAILED (JIT unsupported)'",
    ),
    Rule(
        "sm120-symm-mem",
        "warning",
        cond.symm_mem,
        "--enable-torch-symm-mem has no effect on sm_120 (capability 12 is not in sglang's "
        "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES, which has 9 and 10 only)",
        "sglang 0.5.23 TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES; it logs 'not supported'",
    ),
    Rule(
        "sm120-nvfp4-moe-cuda12",
        "warning",
        cond.nvfp4_moe_cuda12,
        "an NVFP4 MoE through flashinfer_cutlass on sm_120 under CUDA {cuda}: its grouped GEMM is built for "
        "12.0a, where upstream reports invalid output on SM120, fixed only by building for 120f on CUDA 13 "
        "(flashinfer#2723, cutlass#3096); wrong numbers a throughput gate cannot see: use the CUDA 13 stack, "
        "or check output agreement against it",
        "flashinfer-ai/flashinfer#2723, NVIDIA/cutlass#3096",
    ),
    Rule(
        "nccl-algo-tree",
        "error",
        cond.nccl_tree_graphs,
        "NCCL_ALGO={value} with CUDA graphs on: on this host it failed CUDA graph capture; drop NCCL_ALGO "
        "(NCCL picks per size) or run without CUDA graphs",
        "users' results table: 'NCCL Tree: FAILED (CUDA graph incompatible)'",
    ),
    Rule(
        "spec-running-cap",
        "warning",
        cond.spec_cap,
        "speculative decoding without --max-running-requests silently caps the batch at 48; set it",
        "sglang 0.5.23 speculative_hook: default max_running_requests=48",
    ),
    Rule(
        "spec-adaptive-topk",
        "error",
        cond.adaptive_topk,
        "--speculative-adaptive needs --speculative-eagle-topk 1 (have {topk}); set topk to 1",
        "sglang 0.5.23 speculative_hook",
    ),
    Rule(
        "sm120-moe-runner",
        "warning",
        cond.moe_runner,
        "--moe-runner-backend {value} picks flashinfer_trtllm, which is SM100-only; use flashinfer_cutlass",
        "sglang 0.5.23 moe_hook",
    ),
    Rule(
        "driver-floor",
        "error",
        cond.driver,
        "driver {driver} is below {floor}, the floor for CUDA {cuda}; upgrade the host driver",
        "NVIDIA CUDA toolkit release notes, minimum driver versions",
    ),
    Rule(
        "tp-gpus",
        "error",
        cond.tp_gpus,
        "tensor parallel size and GPUs disagree ({values}); make --tp-size, runtime.tp and runtime.gpus agree",
        "sglang needs one GPU per TP rank",
    ),
    Rule(
        "base-image-digest",
        "warning",
        cond.base_by_tag,
        "base_image '{image}' is unpinned ({why}): its registry can move the tag, and nothing records which "
        "image a build used; pin it: run `{lock}` where its registry answers (the lock records the digest, FROM "
        "carries it, build checks it), or write `base_image: {image}@sha256:DIGEST` with the digest "
        "`docker buildx imagetools inspect {image}` prints",
        "docker: a tag is mutable, a digest names one image (FROM NAME:TAG@sha256:D builds exactly D)",
    ),
    Rule(
        "base-image-cuda",
        "error",
        cond.base_cuda,
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
