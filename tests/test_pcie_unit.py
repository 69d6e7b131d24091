"""host/pcie.py's parsers and checks, and the locked NCCL against the public bugs on the users' cards."""

from __future__ import annotations

import pytest

from stackbuild.host.pcie import Pcie, checks, facts, parse_p2p, parse_pcie
from stackbuild.paths import shipped_dir
from stackbuild.spec.load import load_stack
from stackbuild.spec.lock.check import nccl_findings, nccl_of, read_lock

# the shape `nvidia-smi topo -p2p r` prints (4 GPUs, one pair the chipset does not support)
TOPO = """ \tGPU0\tGPU1\tGPU2\tGPU3\t
 GPU0\tX\tOK\tOK\tCNS\t
 GPU1\tOK\tX\tOK\tOK\t
 GPU2\tOK\tOK\tX\tOK\t
 GPU3\tCNS\tOK\tOK\tX\t

Legend:

  X    = Self
  OK   = Status Ok
  CNS  = Chipset not supported
  GNS  = GPU not supported
  TNS  = Topology not supported
  NS   = Not supported
  U    = Unknown
"""
ROOT = shipped_dir("stacks").parent


def test_parse_p2p_reads_every_pair_once() -> None:
    assert parse_p2p(TOPO) == {(0, 1): "OK", (0, 2): "OK", (0, 3): "CNS", (1, 2): "OK", (1, 3): "OK", (2, 3): "OK"}
    assert parse_p2p("NVIDIA-SMI has failed\n") == {}


@pytest.mark.parametrize(("text", "want"), [
    ("== cmdline\nro quiet\n== iommu\n== acs\n", Pcie("none", None, 0)),
    ("== cmdline\nro intel_iommu=on iommu=pt\n== iommu\ndmar0\n== acs\n\t\tACSCtl:\tSrcValid+ ReqRedir- CmpltRedir-\n",
     Pcie("pt", 0, 1)),
    ("== cmdline\nro amd_iommu=off\n== iommu\n== acs\nno lspci\n", Pcie("off", None, 0)),
    ("== cmdline\nro\n== iommu\nivhd0\n== acs\n\t\tACSCtl:\tSrcValid+ ReqRedir+ CmpltRedir+\n"
     "\t\tACSCtl:\tSrcValid- ReqRedir- CmpltRedir-\n", Pcie("on", 1, 2)),
])
def test_parse_pcie(text: str, want: Pcie) -> None:
    assert parse_pcie(text) == want


def _sim(**env: str):  # type: ignore[no-untyped-def]
    s = load_stack("sim", root=ROOT, variant="pcie-ipc-allreduce")
    return s.model_copy(update={"server": s.server.model_copy(update={"env": {**s.server.env, **env}})})


def test_checks_for_a_tp4_slice_of_the_host() -> None:
    s = load_stack("sim", root=ROOT, variant="pcie-ipc-allreduce")
    s = s.model_copy(update={"runtime": s.runtime.model_copy(update={"tp": 3})})
    got = checks(s, parse_p2p(TOPO), Pcie("on", 0, 4))
    assert [(c.name, c.ok, c.detail) for c in got] == [
        ("gpu p2p", True, "OK on all 3 pairs of GPUs 0-2; FlashInfer's PCIe-IPC all-reduce "
                          "(SGLANG_ENABLE_PCIE_IPC_ALLREDUCE) needs it"),
        ("pcie acs", True, "0 redirecting bridges, IOMMU on")]
    assert facts(parse_p2p(TOPO), Pcie("on", 0, 4), 4) == {
        "p2p_read": "1 of 6 pairs without P2P: GPU0-GPU3 CNS", "iommu": "on",
        "acs": "0 of 4 bridges redirect (ReqRedir+/CmpltRedir+)"}


def test_nccl_p2p_off_lets_acs_redirect_pass() -> None:
    got = checks(_sim(NCCL_P2P_DISABLE="1"), {}, Pcie("on", 3, 8))
    assert [(c.name, c.ok, c.detail) for c in got] == [
        ("gpu p2p", True, "not read; FlashInfer's PCIe-IPC all-reduce (SGLANG_ENABLE_PCIE_IPC_ALLREDUCE) needs it"),
        ("pcie acs", True, "3 redirecting bridges, IOMMU on; NCCL_P2P_DISABLE=1 set")]
    assert [c.ok for c in checks(_sim(), {}, Pcie("on", 3, 8))] == [True, False]


def test_the_shipped_locks_nccl_against_the_known_bugs() -> None:
    for name, nccl in (("cuda13", ("nvidia-nccl-cu13", "2.30.7")), ("cuda12.8", ("nvidia-nccl-cu12", "2.27.5"))):
        s = load_stack(name, root=ROOT)
        lock = read_lock(s)
        assert lock is not None and nccl_of(lock) == nccl
        got = [f.message.split(": ")[1] for f in nccl_findings(s, lock)]
        assert got == ["NVIDIA/nccl#2418", "NVIDIA/nccl#1999"], got
    sim = load_stack("sim", root=ROOT)
    assert sim.arches == ()  # no sm_120, no NCCL: nothing to say


def test_nccl_tree_with_cuda_graphs_is_the_users_failed_row() -> None:
    from stackbuild.spec.rules import RULES, check_rules

    s = load_stack("cuda13", root=ROOT)
    rule = next(r for r in RULES if r.id == "nccl-algo-tree")
    tree = s.model_copy(update={"server": s.server.model_copy(update={"env": {"NCCL_ALGO": "Tree"}})})
    assert [f.message for f in check_rules(tree, (rule,))] == [
        "NCCL_ALGO=Tree with CUDA graphs on: on this host it failed CUDA graph capture; drop NCCL_ALGO (NCCL picks "
        "per size) or run without CUDA graphs"]
    off = tree.model_copy(update={"server": tree.server.model_copy(
        update={"flags": {**tree.server.flags, "--disable-cuda-graph": True}})})
    assert check_rules(off, (rule,)) == [] and check_rules(s, (rule,)) == []


def test_the_cuda12_nvfp4_moe_is_warned_and_cuda13_is_not() -> None:
    from stackbuild.spec.rules import RULES, check_rules

    rule = next(r for r in RULES if r.id == "sm120-nvfp4-moe-cuda12")
    got = check_rules(load_stack("cuda12.8", root=ROOT), (rule,))
    assert [(f.path.rsplit("/", 1)[-1], f.line, f.severity) for f in got] == [("_blackwell.yaml", 14, "warning")]
    assert "flashinfer#2723, cutlass#3096" in got[0].message
    assert check_rules(load_stack("cuda13", root=ROOT), (rule,)) == []
