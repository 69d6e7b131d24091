"""Classify why a candidate server died from its journal and container logs (pure).

Patterns are the messages PyTorch, NCCL, argparse, Hugging Face and SGLang
print for each failure. Kinds are tried in a fixed order: failures that happen
before any GPU work (a bad flag, a missing model) are unambiguous; among GPU
failures the more specific wins (a graph capture that ran out of memory is a
graph-capture failure whose hint says to lower the memory fraction).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class CrashSignature:
    kind: str
    line: str  # the log line that matched, stripped
    hint: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.line}"


_KINDS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (
        "container-create",
        (
            r"OCI runtime create failed",
            r"docker: Error response from daemon: .*(create|rlimit|device|runtime)",
            r"could not select device driver .* with capabilities: \[\[gpu\]\]",
        ),
        "docker could not create the container: check runtime options in the spec "
        "(ulimits above the daemon's hard limit, --gpus without the NVIDIA runtime, volumes)",
    ),
    (
        "bad-server-flag",
        (
            r"error: unrecognized arguments?:",
            r"error: ambiguous option:",
            r"error: argument --?[\w-]+(/--?[\w-]+)*: (invalid|expected|ignored|not allowed)",
            r"error: the following arguments are required:",
            # click-based servers (our simulator's CLI)
            r"Error: (No such option|Invalid value for|Got unexpected extra argument)",
        ),
        "the server rejected its command line: fix server.flags in the stack spec",
    ),
    (
        "port-in-use",
        (r"Address already in use", r"\[Errno 98\]", r"error while attempting to bind on address"),
        "another process holds the server's port: give runtime.port and runtime.staging_port values "
        "nothing else on the host binds (see `ss -ltnp` there)",
    ),
    (
        "missing-model-path",
        (
            r"is not a local folder and is not a valid model identifier",
            r"does not appear to have a file named config\.json",
            r"HFValidationError",
            r"Repo id must (be in the form|use alphanumeric)",
            r"(?i)model path .* (does not exist|not found)",
        ),
        "server.model_path does not exist on the host: mount it (runtime.volumes) or fix the path",
    ),
    (
        "no-kernel-image",
        (r"no kernel image is available for execution on the device",),
        "the image has no kernels for this GPU's arch: add it to arches (e.g. sm_120) and rebuild",
    ),
    (
        "illegal-memory-access",
        (
            r"an illegal memory access was encountered",
            r"cudaErrorIllegalAddress",
            r"CUDA_ERROR_ILLEGAL_ADDRESS",
        ),
        "a kernel faulted: suspect the kernel/toolkit build for this arch or a patch; "
        "rerun with CUDA_LAUNCH_BLOCKING=1 to find it",
    ),
    (
        "cuda-graph-capture",
        (
            r"(?i)capture cuda graph failed",
            r"cudaErrorStreamCaptureInvalidated",
            r"cudaErrorStreamCaptureUnsupported",
            r"operation not permitted when stream is capturing",
            r"(?i)cuda ?graph.*(incompatible|capture.*(fail|error))",
        ),
        "CUDA graph capture failed: lower --cuda-graph-max-bs-decode or --mem-fraction-static, "
        "or drop the setting that breaks capture (e.g. NCCL_ALGO=Tree)",
    ),
    (
        "cuda-oom",
        (
            r"CUDA out of memory",
            r"torch\.(cuda\.)?OutOfMemoryError",
            r"CUDA error: out of memory",
            r"cudaErrorMemoryAllocation",
            r"Not enough memory\. Please try to increase --mem-fraction-static",
        ),
        "GPU memory ran out: lower --mem-fraction-static or --max-running-requests, or raise TP",
    ),
    (
        "nccl-error",
        (
            r"NCCL error",
            r"\bnccl(InternalError|SystemError|UnhandledCudaError|InvalidUsage|RemoteError)\b",
            r"ProcessGroupNCCL.*(Watchdog|timeout|error)",
        ),
        "a collective failed: check NCCL_* env (algo, channels, P2P/IPC) and that all GPUs are "
        "visible to the container",
    ),
)

_COMPILED = tuple((kind, tuple(re.compile(p) for p in pats), hint) for kind, pats, hint in _KINDS)

KINDS: tuple[str, ...] = tuple(k for k, _, _ in _KINDS)


def classify(log: str) -> CrashSignature | None:
    """The crash signature found in `log`, or None when no known one matches."""
    lines = log.splitlines()
    for kind, patterns, hint in _COMPILED:
        for line in lines:
            if any(p.search(line) for p in patterns):
                return CrashSignature(kind, line.strip()[:300], hint)
    return None
