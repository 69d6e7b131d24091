"""Preflight of a GPU host's PCIe for TP all-reduces: P2P between every GPU pair, ACS, IOMMU (parsers pure).

On PCIe-only cards (the users' 8x RTX PRO 6000 Blackwell, no NVLink) every all-reduce crosses PCIe:
NCCL uses P2P where the driver allows it, else shared memory through the host; FlashInfer's PCIe-IPC
and trtllm all-reduces map peer memory and need P2P between every pair. Where NCCL hung on these
cards (NVIDIA/nccl#1999, #2079, vllm-project/vllm#33041) the cause found was ACS on the PCIe bridges
redirecting P2P requests up through the IOMMU. So preflight reads, and records in the host facts:

- `nvidia-smi topo -p2p r`: the driver's P2P read status per GPU pair (OK, NS, CNS, GNS, TNS, U);
- `/proc/cmdline` and `/sys/class/iommu`: whether an IOMMU translates (on), passes through (pt) or is off;
- `lspci -vvv`'s `ACSCtl:` lines: bridges with request/completion redirect on (ReqRedir+/CmpltRedir+).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from stackbuild.spec.sglang import env_bool
from stackbuild.spec.stack import Stack

TOPO_P2P_READ = ["nvidia-smi", "topo", "-p2p", "r"]
PCIE_SCRIPT = (
    'echo "== cmdline"; cat /proc/cmdline 2>/dev/null; '
    'echo "== iommu"; ls /sys/class/iommu 2>/dev/null; '
    'echo "== acs"; if command -v lspci >/dev/null 2>&1; then lspci -vvv 2>/dev/null | grep "ACSCtl:"; '
    'else echo "no lspci"; fi; true'
)
_GPU = re.compile(r"GPU(\d+)")


def parse_p2p(text: str) -> dict[tuple[int, int], str]:
    """(i, j) -> status for i < j, from `nvidia-smi topo -p2p r`'s matrix (pure)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    header = next((ln for ln in lines if ln.split() and all(_GPU.fullmatch(w) for w in ln.split())), None)
    if header is None:
        return {}
    cols = [int(m) for m in _GPU.findall(header)]
    out = {}
    for ln in lines:
        f = ln.split()
        if ln is header or not f or not _GPU.fullmatch(f[0]) or len(f) < len(cols) + 1:
            continue
        i = int(f[0][3:])
        for j, status in zip(cols, f[1 : len(cols) + 1], strict=True):
            if i < j:
                out[(i, j)] = status
    return out


@dataclass(frozen=True)
class Pcie:
    iommu: str  # "on" | "pt" (passthrough) | "off" | "none" (no IOMMU registered)
    acs_redirect: int | None  # bridges with ReqRedir+ or CmpltRedir+; None: lspci absent or unreadable
    acs_read: int  # ACSCtl lines read


def parse_pcie(text: str) -> Pcie:
    sections: dict[str, list[str]] = {}
    cur = ""
    for ln in text.splitlines():
        if ln.startswith("== "):
            cur = ln[3:].strip()
            sections[cur] = []
        elif cur:
            sections[cur].append(ln)
    cmdline = " ".join(sections.get("cmdline", []))
    units = [ln for ln in sections.get("iommu", []) if ln.strip()]
    if re.search(r"\b(intel_iommu|amd_iommu)=off\b|\biommu=off\b", cmdline):
        iommu = "off"
    elif re.search(r"\biommu=pt\b|\biommu\.passthrough=1\b", cmdline):
        iommu = "pt"
    else:
        iommu = "on" if units else "none"
    acs = sections.get("acs", [])
    if any("no lspci" in ln for ln in acs):
        return Pcie(iommu, None, 0)
    ctl = [ln for ln in acs if "ACSCtl:" in ln]
    redirect = sum(1 for ln in ctl if "ReqRedir+" in ln or "CmpltRedir+" in ln)
    return Pcie(iommu, redirect if ctl else None, len(ctl))


def needs_p2p(stack: Stack) -> str | None:
    """Which all-reduce path of the stack maps peer memory (needs P2P between every pair), or None."""
    env, flags = stack.server.env, stack.server.flags
    if env_bool(env.get("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"), False):
        return "FlashInfer's PCIe-IPC all-reduce (SGLANG_ENABLE_PCIE_IPC_ALLREDUCE)"
    if flags.get("--flashinfer-allreduce-fusion-backend") not in (None, False):
        return "FlashInfer's trtllm all-reduce (--flashinfer-allreduce-fusion-backend)"
    return None


def p2p_summary(pairs: dict[tuple[int, int], str], tp: int) -> tuple[list[str], str]:
    """(pairs among the first `tp` GPUs without P2P, one-line summary) (pure)."""
    used = {k: v for k, v in pairs.items() if k[1] < tp}
    bad = [f"GPU{i}-GPU{j} {s}" for (i, j), s in sorted(used.items()) if s != "OK"]
    if not used:
        return [], "not read"
    if not bad:
        return bad, f"OK on all {len(used)} pairs of GPUs 0-{tp - 1}"
    return bad, f"{len(bad)} of {len(used)} pairs without P2P: {', '.join(bad[:6])}{' ...' if len(bad) > 6 else ''}"


def facts(pairs: dict[tuple[int, int], str], pcie: Pcie, tp: int) -> dict[str, str]:
    _, summary = p2p_summary(pairs, tp)
    acs = ("not read (no lspci)" if pcie.acs_redirect is None
           else f"{pcie.acs_redirect} of {pcie.acs_read} bridges redirect (ReqRedir+/CmpltRedir+)")
    return {"p2p_read": summary, "iommu": pcie.iommu, "acs": acs}


@dataclass(frozen=True)
class PcieCheck:
    name: str
    ok: bool
    detail: str


def checks(stack: Stack, pairs: dict[tuple[int, int], str], pcie: Pcie) -> list[PcieCheck]:
    """P2P where the stack's all-reduce needs it; no ACS redirect under NCCL's P2P (nccl#1999's cause)."""
    tp = stack.runtime.tp
    if tp < 2:
        return []
    out = []
    bad, summary = p2p_summary(pairs, tp)
    path = needs_p2p(stack)
    if path and bad:
        out.append(PcieCheck("gpu p2p", False, f"{summary}; {path} maps peer memory and needs P2P between every "
                                               "pair: enable P2P in the BIOS/driver or drop that path"))
    else:
        out.append(PcieCheck("gpu p2p", True, summary + (f"; {path} needs it" if path else
                                                         "; NCCL uses shared memory where P2P is missing")))
    p2p_off = stack.server.env.get("NCCL_P2P_DISABLE") == "1"  # NCCL reads it as an integer
    if pcie.acs_redirect and not p2p_off:
        out.append(PcieCheck(
            "pcie acs", False,
            f"{pcie.acs_redirect} PCIe bridge(s) redirect P2P through the root complex (ACS ReqRedir+/CmpltRedir+, "
            f"IOMMU {pcie.iommu}): NCCL all-reduces hung so on these cards (NVIDIA/nccl#1999, #2079); disable ACS "
            "(BIOS, or the kernel's pci=noacs) or set server.env NCCL_P2P_DISABLE: \"1\" (slower: through the host)"))
    else:
        read = "not read (no lspci)" if pcie.acs_redirect is None else f"{pcie.acs_redirect} redirecting bridges"
        out.append(PcieCheck("pcie acs", True, f"{read}, IOMMU {pcie.iommu}"
                             + ("; NCCL_P2P_DISABLE=1 set" if p2p_off else "")))
    return out
