"""Facts the compatibility rules reason with, as data, each with where it was read.

Kept apart from the conditions (stackbuild.spec.rules) so a fact can be checked against its
source, and updated, without touching the logic that uses it.
"""

from __future__ import annotations

from dataclasses import dataclass

# Driver floor per CUDA major.minor (NVIDIA CUDA toolkit release notes, table 3).
DRIVER_FLOOR: dict[tuple[int, int], int] = {(12, 0): 525, (12, 8): 570, (12, 9): 575, (13, 0): 580, (13, 1): 590}

# cuXYZ wheels on the PyTorch index by torch release (minor -> tags).
# Source: the pytorch.org "previous versions" matrix; 2.12+ dropped cu128.
TORCH_CUDA_WHEELS: dict[tuple[int, int], frozenset[str]] = {
    (2, 7): frozenset({"cu118", "cu126", "cu128"}),
    (2, 8): frozenset({"cu126", "cu128", "cu129"}),
    (2, 9): frozenset({"cu126", "cu128", "cu130"}),
    (2, 10): frozenset({"cu126", "cu128", "cu130"}),
    (2, 11): frozenset({"cu126", "cu128", "cu130"}),
    (2, 12): frozenset({"cu126", "cu130"}),
    (2, 13): frozenset({"cu126", "cu130", "cu132"}),
    (2, 14): frozenset({"cu126", "cu130", "cu132"}),
}

# What each sglang release pins (Requires-Dist of its wheel), by component (the table names each one's
# distribution); used when the release's own metadata is not at hand (offline, no cache).
SGLANG_PINS: dict[str, dict[str, str]] = {
    "0.5.23": {"torch": "2.14.1", "sgl_kernel": "0.4.10", "flashinfer": "0.7.2"},
}

# The first sglang whose closure is CUDA 13: from 0.5.11 every release requires cuda-python>=13.0
# (Requires-Dist of each wheel on PyPI); 0.5.10.post1 pins cuda-python==12.9, torch==2.9.1.
SGLANG_CUDA13_FROM = (0, 5, 11)
SGLANG_LAST_CUDA12 = "0.5.10.post1"

# CPython versions each sglang release ships wheels for (its files on PyPI; 0.5.23: cp311-cp313,
# manylinux_2_34 only, Requires-Python >=3.11). A py3-none-any release takes what Requires-Python allows.
SGLANG_PYTHONS: dict[str, tuple[str, ...]] = {
    "0.5.23": ("3.11", "3.12", "3.13"),
    "0.5.10.post1": ("3.10", "3.11", "3.12", "3.13"),
}

# Boolean environment variables each project tests for presence, not value: any value, "0" included,
# turns the feature on. flashinfer 0.7.2 jit/core.py: `if os.environ.get("FLASHINFER_DISABLE_JIT")`.
PRESENCE_ENV: dict[str, str] = {
    "FLASHINFER_DISABLE_JIT": 'flashinfer 0.7.2 tests it for presence: any value, "0" too, disables the JIT',
}

# sgl-kernel's CMakeLists.txt reads these as CMake options/cache variables (option()/set(... CACHE)),
# never from the environment.
CMAKE_OPTION_PREFIXES = ("SGL_KERNEL_",)

# flashinfer-python from 0.7 packages sources and headers only: a source build yields the same
# py3-none-any wheel as PyPI's (kernels come from JIT, AOT jit-cache or cubin wheels).
FLASHINFER_PURE_FROM = (0, 7, 0)

# What sglang's FlashInfer allreduce fusion does on SM120, per release, read in each release's wheel.
FUSION_SM120: dict[str, str] = {
    "0.5.10.post1": "turns it off without a word (srt/layers/communicator.py:96-110 apply_flashinfer_allreduce_fusion "
    "needs SM90 or SM100)",
    "0.5.23": "raises 'FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs.' (srt/layers/"
    "flashinfer_comm_fusion.py:46-50 _resolve_backend)",
}
FUSION_SM120_READ_THROUGH = (0, 5, 23)  # the newest release whose fusion gate was read
# The gate lines themselves (file -> the condition's text), where a patch must change the condition to let
# SM120 through: 0.5.23 flashinfer_comm_fusion.py:48, 0.5.10.post1 communicator.py:100.
FUSION_GATES: dict[str, str] = {
    "sglang/srt/layers/flashinfer_comm_fusion.py": "get_platform().is_sm90 or get_platform().is_sm100",
    "sglang/srt/layers/communicator.py": "_is_sm90_supported or _is_sm100_supported",
}

# Boolean env vars' defaults (sglang 0.5.23 srt/environ.py:1539: EnvBool(False)): what sglang uses when the
# variable is unset or not a boolean it reads.
SGLANG_ENV_BOOL_DEFAULTS: dict[str, bool] = {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": False}

# Arches that need at least this CUDA (sm_100/sm_120 arrived in 12.8, sm_103/sm_121 in 12.9).
ARCH_MIN_CUDA: dict[str, tuple[int, int]] = {"sm_100": (12, 8), "sm_120": (12, 8), "sm_103": (12, 9), "sm_121": (12, 9)}


def driver_floor(cuda: str | None) -> int | None:
    if not cuda:
        return None
    major, minor = (int(x) for x in cuda.split(".")[:2])
    floors = [v for (ma, mi), v in DRIVER_FLOOR.items() if (ma, mi) <= (major, minor)]
    return max(floors) if floors else None


@dataclass(frozen=True)
class NcclIssue:
    """A public NCCL bug on the users' cards (RTX PRO 6000 Blackwell over PCIe), by the versions it names."""

    issue: str
    first: tuple[int, int, int]  # the oldest release it was reported on
    fixed: tuple[int, int, int] | None  # the first release reported good; None: none reported
    what: str


NCCL_ISSUES: tuple[NcclIssue, ...] = (
    NcclIssue("NVIDIA/nccl#2418", (2, 26, 2), (2, 31, 2),
              "illegal memory access in all-reduces of 512 KiB and more on RTX PRO 6000 Blackwell over PCIe: "
              "reported on 2.26.2, not reproducible on 2.31.2; releases between were not reported either way"),
    NcclIssue("NVIDIA/nccl#1999", (2, 26, 5), None,
              "all-reduce hangs with P2P on RTX PRO 6000 Blackwell over PCIe: reported on 2.26.5, 2.27.7, "
              "2.29.2 (and 2.30.4, local-inference-lab/rtx6kpro#15), no release reported fixed; where a cause was "
              "found it was the host's PCIe ACS redirecting P2P through the IOMMU (NVIDIA/nccl#2079, "
              "vllm-project/vllm#33041): preflight reads ACS and IOMMU, and NCCL_P2P_DISABLE=1 avoids it"),
)
