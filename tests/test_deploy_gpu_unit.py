"""A GPU stack (the shipped cuda13) on a scripted GPU host: preflight's GPU checks, host facts, kernel check."""

from __future__ import annotations

from functools import cache

from helpers_deploy import CANDIDATE, D_CAND, ROOT, FakeGate, fake_host, run, steps

from stackbuild.gate.result import GateResult
from stackbuild.host.state import HostPaths, release_key
from stackbuild.render.stack import render_unit
from stackbuild.sim.startup import AllReduceSetup, allreduce_lines
from stackbuild.spec.load import load_stack
from stackbuild.spec.stack import Stack
from stackbuild.testing.fake_host import Behaviour, FakeHost

GPU = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
SMI = "".join(f"{i}, {GPU}, 12.0, 580.65.06, 97887\n" for i in range(8))
LIMITS = (
    "Limit                     Soft Limit           Hard Limit           Units     \n"
    "Max stack size            8388608              unlimited            bytes     \n"
    "Max open files            1048576              {nofile}              files     \n"
    "Max locked memory         unlimited            unlimited            bytes     \n"
)
# `nvidia-smi topo -p2p r` on 8 cards whose driver allows P2P between every pair
P2P_OK = "\t" + "\t".join(f"GPU{j}" for j in range(8)) + "\n" + "".join(
    f"GPU{i}\t" + "\t".join("X" if i == j else "OK" for j in range(8)) + "\n" for i in range(8)) + (
    "\nLegend:\n\n  X    = Self\n  OK   = Status Ok\n  NS   = Not supported\n")
FACTS = {"gpu_model": GPU, "gpu_count": "8", "driver": "580.65.06", "arch": "sm_120",
         "p2p_read": "OK on all 28 pairs of GPUs 0-7", "iommu": "none",
         "acs": "0 of 2 bridges redirect (ReqRedir+/CmpltRedir+)", "nccl": "nvidia-nccl-cu13 2.30.7"}
ACS_OFF = "== cmdline\nBOOT_IMAGE=/vmlinuz ro\n== iommu\n== acs\n" + 2 * (
    "\t\tACSCtl:\tSrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-\n")
PATHS = HostPaths("/var/lib/stackbuild", "sglang")


@cache
def cuda13() -> Stack:
    return load_stack("cuda13", root=ROOT)


# what sglang 0.5.23 logs of its all-reduce on this host with the stack's PCIe-IPC env (the simulator's
# lines, sim/startup.py): the stack's expect_log holds
SGLANG = Behaviour(output=("server: loading weights",
                           *allreduce_lines(AllReduceSetup(tp=8, pcie_ipc_env="1"))))


def gpu_host(nofile: str = "1048576", **servers: Behaviour) -> FakeHost:
    host = fake_host(**{"incumbent": SGLANG, "candidate": SGLANG, **servers})
    host.runtimes = '{"nvidia":{"path":"nvidia-container-runtime"},"runc":{"path":"runc"}}'
    host.gpus_csv, host.dockerd_limits = SMI, LIMITS.format(nofile=nofile)
    host.p2p_matrix, host.pcie_text = P2P_OK, ACS_OFF
    return host


def test_gpu_host_promotes_and_the_result_carries_the_host_facts() -> None:
    host = gpu_host()
    gate = FakeGate(host)
    rep = run(host, stack=cuda13(), gate=gate)
    assert (rep.outcome, rep.exit_code) == ("promoted", 0)
    assert [n for n, _ in steps(rep)] == ["lock", "state", "preflight", "pull", "stage unit", "kernel check",
                                          "baseline", "mark pending", "secrets", "start", "ready", "gate", "promote"]
    assert rep.steps[2].detail == (
        "docker: docker 27.3.1; nvidia runtime: NVIDIA container runtime or CDI spec found; "
        "gpu count: 8 GPU(s), the stack needs 8 (tp=8); gpu arch: host has sm_120; stack is built for sm_120; "
        "driver: driver 580.65.06, CUDA 13.0.1 needs >= 580; "
        "gpu p2p: OK on all 28 pairs of GPUs 0-7; FlashInfer's PCIe-IPC all-reduce (SGLANG_ENABLE_PCIE_IPC_ALLREDUCE) "
        "needs it; pcie acs: 0 redirecting bridges, IOMMU none; "
        "disk: 200.0 GiB free under /var/lib/docker, the image needs 64.0 GiB; "
        "ulimit memlock: runtime.ulimits memlock=-1, the docker daemon's hard limit is unlimited; "
        "ulimit stack: runtime.ulimits stack=67108864, the docker daemon's hard limit is unlimited; "
        "ulimit nofile: runtime.ulimits nofile=1048576, the docker daemon's hard limit is 1048576; "
        "port: port 30000 is free")
    assert rep.steps[5].detail == "kernels import on the host's GPUs"
    assert rep.host_facts == FACTS
    key = release_key(D_CAND, render_unit(cuda13(), image=CANDIDATE, port=30000, name="sglang"))
    stored = GateResult.model_validate_json(host.files[PATHS.result_file(key)])
    assert stored.host == {"access": "direct", **FACTS}
    assert host.serving(30000) == CANDIDATE and gate.calls[0].served_by == CANDIDATE


def test_kernels_that_do_not_import_reject_the_candidate_before_anything_runs() -> None:
    err = "ImportError: libcuda.so.1: cannot open shared object file: No such file or directory"
    host = gpu_host(candidate=Behaviour(kernel_error=err))
    rep = run(host, stack=cuda13())
    assert (rep.outcome, rep.exit_code) == ("refused", 1)
    assert steps(rep)[-1] == ("kernel check", False)
    assert rep.cause == f"the candidate's kernels do not import on this host's GPUs: {err}"
    assert PATHS.state_file not in host.files and host.units == {} and host.running == {}
    assert PATHS.lease_dir not in host.dirs


def test_a_ulimit_above_the_daemons_hard_limit_is_refused_by_preflight() -> None:
    host = gpu_host(nofile="524288")
    rep = run(host, stack=cuda13())
    assert (rep.outcome, rep.exit_code, steps(rep)[-1]) == ("refused", 4, ("preflight", False))
    assert rep.cause == (
        f"preflight failed on {host.address} (1 problem): ulimit nofile: runtime.ulimits nofile=1048576, "
        "the docker daemon's hard limit is 524288: lower it in the spec or raise the daemon's")


def test_a_host_without_nvidia_names_each_missing_piece() -> None:
    host = fake_host()
    rep = run(host, stack=cuda13())
    assert (rep.outcome, rep.exit_code) == ("refused", 4)
    assert rep.cause is not None and rep.cause.splitlines()[1:] == [
        "  - nvidia runtime: neither the nvidia docker runtime nor an NVIDIA CDI spec: "
        "install nvidia-container-toolkit",
        "  - gpus: nvidia-smi failed: bash: line 1: nvidia-smi: command not found; install the NVIDIA driver",
    ]
    assert host.files.keys() <= {f"{PATHS.lease_dir}/owner.json"} and PATHS.lease_dir not in host.dirs


def test_pairs_without_p2p_refuse_a_stack_whose_all_reduce_maps_peer_memory() -> None:
    host = gpu_host()
    assert host.p2p_matrix is not None
    host.p2p_matrix = host.p2p_matrix.replace("GPU3\tOK\tOK\tOK\tX\tOK", "GPU3\tOK\tOK\tOK\tX\tNS")
    host.p2p_matrix = host.p2p_matrix.replace("GPU4\tOK\tOK\tOK\tOK\tX", "GPU4\tOK\tOK\tOK\tNS\tX")
    rep = run(host, stack=cuda13())
    assert (rep.outcome, rep.exit_code, steps(rep)[-1]) == ("refused", 4, ("preflight", False))
    assert rep.cause == (
        f"preflight failed on {host.address} (1 problem): gpu p2p: 1 of 28 pairs without P2P: GPU3-GPU4 NS; "
        "FlashInfer's PCIe-IPC all-reduce (SGLANG_ENABLE_PCIE_IPC_ALLREDUCE) maps peer memory and needs P2P between "
        "every pair: enable P2P in the BIOS/driver or drop that path")


def test_acs_redirect_is_refused_unless_nccl_p2p_is_off() -> None:
    host = gpu_host()
    host.pcie_text = ACS_OFF.replace("ReqRedir-", "ReqRedir+", 1).replace("ro\n", "ro amd_iommu=on\n")
    host.pcie_text = host.pcie_text.replace("== iommu\n", "== iommu\nivhd0\n")
    rep = run(host, stack=cuda13())
    assert (rep.outcome, rep.exit_code) == ("refused", 4)
    assert rep.cause == (
        f"preflight failed on {host.address} (1 problem): pcie acs: 1 PCIe bridge(s) redirect P2P through the root "
        "complex (ACS ReqRedir+/CmpltRedir+, IOMMU on): NCCL all-reduces hung so on these cards (NVIDIA/nccl#1999, "
        "#2079); disable ACS (BIOS, or the kernel's pci=noacs) or set server.env NCCL_P2P_DISABLE: \"1\" (slower: "
        "through the host)")
