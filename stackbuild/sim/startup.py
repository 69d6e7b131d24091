"""The startup log lines sglang 0.5.23 prints about its all-reduce path, as the simulator prints them (pure).

The simulator stands in for sglang on one host, so it says what sglang would say there for the same
flags and environment: which all-reduce backend a TP group set up, and the fallbacks. The host it
models is the users' (PCIe-only RTX PRO 6000, no NVLink, so no multicast) unless told it has
multicast (`--host-multicast`). A variant's server.expect_log is judged against these lines exactly
as against sglang's own (host/expect_log.py). Sources, sglang 0.5.23 (paths under sglang/):

- srt/distributed/device_communicators/pcie_ipc_ar.py:77 (world sizes 2, 4, 8), :104-107 (enabled by
  SGLANG_ENABLE_PCIE_IPC_ALLREDUCE, an EnvBool, for the "tp" group), :242 (enabled), :299 (workspace
  built, in the warmup's prepare());
- srt/distributed/bootstrap.py:257: --flashinfer-allreduce-fusion-backend set = the flashinfer
  all-reduce is tried first (parallel_state.py all_reduce), its workspace made before graph capture;
- srt/layers/flashinfer_comm_fusion.py:300-306: the workspace preflight always asks
  cuMulticastGetGranularity, which fails on a GPU without multicast; :368 and :387 the two warnings
  that follow, then NCCL; :580 the line a working workspace prints.
"""

from __future__ import annotations

from dataclasses import dataclass

from stackbuild.spec.sglang import env_bool

PCIE_IPC_WORLD_SIZES = (2, 4, 8)
# what the simulated model's warmup sizes the PCIe-IPC workspace from (decode width x hidden)
HIDDEN = 4096
DECODE_WIDTH = 128
FUSION_MAX_TOKENS = 2048


@dataclass(frozen=True)
class AllReduceSetup:
    tp: int = 1
    pcie_ipc_env: str | None = None  # SGLANG_ENABLE_PCIE_IPC_ALLREDUCE as set, None when unset
    fusion_backend: str | None = None  # --flashinfer-allreduce-fusion-backend
    multicast: bool = False  # the GPUs' CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED


def allreduce_lines(s: AllReduceSetup) -> list[str]:
    """What rank 0 logs about its TP all-reduce at startup, in order (prefix as sglang's logger: [TP0])."""
    if s.tp <= 1:
        return []
    out = []
    pcie_ipc = env_bool(s.pcie_ipc_env, False) and s.tp in PCIE_IPC_WORLD_SIZES
    if pcie_ipc:
        out.append(f"FlashInfer PCIe-IPC all-reduce enabled (world={s.tp}, workspace sized on first reduction)")
    if s.fusion_backend is not None:
        backend = "trtllm" if s.fusion_backend == "auto" else s.fusion_backend
        if s.multicast:
            out.append(f"FlashInfer AllReduce Fusion enabled and workspace initialized: backend={backend}, rank=0, "
                       f"world_size={s.tp}, max_token_num={FUSION_MAX_TOKENS}, hidden_dim={HIDDEN}")
        else:
            out += [
                "FlashInfer workspace preflight probe failed (cuMulticastGetGranularity failed for FlashInfer "
                "workspace preflight: CUresult.CUDA_ERROR_NOT_SUPPORTED). Skipping allreduce fusion.",
                "FlashInfer workspace preflight: cuMemCreate probe failed on at least one rank. Skipping allreduce "
                "fusion to avoid cross-rank desync inside the flashinfer collective.",
            ]
    if pcie_ipc:
        out.append(f"FlashInfer PCIe-IPC workspace built (world={s.tp}, max_numel={DECODE_WIDTH * HIDDEN}, "
                   f"hidden={HIDDEN})")
    return [f"[TP0] {ln}" for ln in out]
