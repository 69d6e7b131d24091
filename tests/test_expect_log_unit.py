"""server.expect_log: a variant proves the path it claims from the server's startup log before its numbers count.

The judge (host/expect_log.py) is pure; the readiness step reads the unit's journal on the scripted host;
the simulator prints what sglang 0.5.23 prints for the same flags and env (sim/startup.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers_deploy import CANDIDATE, INCUMBENT, ROOT, run, state, with_incumbent

from stackbuild.errors import SpecError
from stackbuild.host.expect_log import unmet
from stackbuild.paths import shipped_dir
from stackbuild.sim.startup import AllReduceSetup, allreduce_lines
from stackbuild.spec.expect_log_check import check_expect_log, line_problem
from stackbuild.spec.load import load_stack
from stackbuild.spec.stack import ExpectLog, LogLine
from stackbuild.testing.fake_host import Behaviour

FUSION = "sglang 0.5.23 srt/layers/flashinfer_comm_fusion.py"
PROBE_FAILED = ("FlashInfer workspace preflight probe failed (cuMulticastGetGranularity failed for FlashInfer "
                "workspace preflight: CUresult.CUDA_ERROR_NOT_SUPPORTED). Skipping allreduce fusion.")
TRTLLM = ExpectLog(
    present=(LogLine(text="FlashInfer AllReduce Fusion enabled and workspace initialized: backend=trtllm",
                     source=f"{FUSION}:580-581"),),
    absent=(LogLine(text="FlashInfer workspace preflight probe failed", source=f"{FUSION}:368"),),
)


def test_met_when_the_path_line_shows_and_no_fallback() -> None:
    log = ("[TP0] FlashInfer AllReduce Fusion enabled and workspace initialized: backend=trtllm, rank=0, "
           "world_size=8, max_token_num=2048, hidden_dim=4096\n[TP0] The server is fired up")
    assert unmet(TRTLLM, log) is None


def test_a_fallback_line_is_the_cause_even_when_the_path_line_shows_too() -> None:
    log = f"[TP3] {PROBE_FAILED}\n[TP0] FlashInfer AllReduce Fusion enabled and workspace initialized: backend=trtllm"
    assert unmet(TRTLLM, log) == (
        f"the startup log shows 'FlashInfer workspace preflight probe failed' ({FUSION}:368), a line the variant "
        f"says must not appear: the server took another path than it claims ({'[TP3] ' + PROBE_FAILED!r})")


def test_a_missing_path_line_is_the_cause() -> None:
    assert unmet(TRTLLM, "[TP0] Load weight end.\n") == (
        "the startup log never shows 'FlashInfer AllReduce Fusion enabled and workspace initialized: "
        f"backend=trtllm' ({FUSION}:580-581): the server did not take the path the variant claims, so its "
        "numbers would not be that path's")


def test_no_expectation_is_always_met() -> None:
    assert not ExpectLog() and unmet(ExpectLog(), "") is None


# --- what the simulator prints, as sglang 0.5.23 would ---------------------------------------------------

def test_sim_pcie_ipc_at_tp8() -> None:
    assert allreduce_lines(AllReduceSetup(tp=8, pcie_ipc_env="1")) == [
        "[TP0] FlashInfer PCIe-IPC all-reduce enabled (world=8, workspace sized on first reduction)",
        "[TP0] FlashInfer PCIe-IPC workspace built (world=8, max_numel=524288, hidden=4096)",
    ]


@pytest.mark.parametrize(("env", "tp"), [("0", 8), ("false", 8), (None, 8), ("1", 1), ("1", 3), ("maybe", 8)])
def test_sim_pcie_ipc_off(env: str | None, tp: int) -> None:
    # EnvBool: only true/1/yes/y turn it on; world sizes 2, 4, 8 only; TP 1 has no all-reduce at all
    assert allreduce_lines(AllReduceSetup(tp=tp, pcie_ipc_env=env)) == []


def test_sim_trtllm_without_multicast_falls_back() -> None:
    assert allreduce_lines(AllReduceSetup(tp=8, pcie_ipc_env="0", fusion_backend="auto")) == [
        f"[TP0] {PROBE_FAILED}",
        "[TP0] FlashInfer workspace preflight: cuMemCreate probe failed on at least one rank. Skipping allreduce "
        "fusion to avoid cross-rank desync inside the flashinfer collective.",
    ]


def test_sim_trtllm_with_multicast() -> None:
    assert allreduce_lines(AllReduceSetup(tp=8, fusion_backend="auto", multicast=True)) == [
        "[TP0] FlashInfer AllReduce Fusion enabled and workspace initialized: backend=trtllm, rank=0, "
        "world_size=8, max_token_num=2048, hidden_dim=4096"]


# --- the shipped stacks state theirs ---------------------------------------------------------------------

@pytest.mark.parametrize(("stack", "variant", "present"), [
    ("cuda13", None, "FlashInfer PCIe-IPC workspace built (world=8"),
    ("cuda13", "eagle3-topk1", "FlashInfer PCIe-IPC workspace built (world=8"),
    ("cuda13", "trtllm-allreduce", "FlashInfer AllReduce Fusion enabled and workspace initialized: backend=trtllm"),
    ("cuda12.8", "baseline", "is disabled because it's not supported on more than two PCIe-only GPUs"),
])
def test_shipped_variants_state_their_path(stack: str, variant: str | None, present: str) -> None:
    s = load_stack(stack, root=shipped_dir("stacks").parent, variant=variant)
    assert present in [ln.text for ln in s.server.expect_log.present]
    version = s.sglang_version
    assert all(ln.source.startswith(f"sglang {version} ") for ln in (*s.server.expect_log.present,
                                                                     *s.server.expect_log.absent))


def test_trtllm_variant_drops_the_pcie_ipc_expectation() -> None:
    s = load_stack("cuda13", root=shipped_dir("stacks").parent, variant="trtllm-allreduce")
    texts = [ln.text for ln in (*s.server.expect_log.present, *s.server.expect_log.absent)]
    assert not any("PCIe-IPC" in t for t in texts)
    assert "FlashInfer workspace preflight probe failed" in texts


def test_a_line_without_its_source_is_refused(tmp_path: Path) -> None:
    root = tmp_path
    (root / "stacks").mkdir()
    (root / "stacks" / "x.yaml").write_text(
        "base_image: local/debian:bookworm\ncuda: null\nserver:\n  engine: sim\n  model_path: /m\n"
        "  expect_log:\n    present:\n      - text: 'some line printed'\n        source: 'somewhere'\n")
    with pytest.raises(SpecError) as e:
        load_stack("x", root=root)
    assert "x.yaml:9:17: error: server.expect_log.present.0.source: not where the line is printed" in str(e.value)


# --- the readiness step on the scripted host -------------------------------------------------------------

def _sim(variant: str):  # type: ignore[no-untyped-def]
    return load_stack("sim", root=ROOT, variant=variant)


def test_a_fallback_at_startup_fails_the_start_with_that_cause() -> None:
    printed = tuple(allreduce_lines(AllReduceSetup(tp=8, pcie_ipc_env="0", fusion_backend="auto")))
    host = with_incumbent(candidate=Behaviour(output=printed))
    rep = run(host, stack=_sim("trtllm-allreduce"))
    assert (rep.outcome, rep.exit_code) == ("rolled-back", 1), rep.render()
    assert rep.cause == (
        "candidate serves, but not on the path its variant claims: the startup log shows 'FlashInfer workspace "
        f"preflight probe failed' ({FUSION}:368), a line the variant says must not appear: the server took "
        f"another path than it claims ({printed[0]!r})")
    assert state(host).last_verdict == "not-ready"
    assert host.serving(_sim("trtllm-allreduce").runtime.port) == INCUMBENT and CANDIDATE not in {
        p.image for p in host.running.values()}


def test_the_claimed_path_at_startup_passes_readiness() -> None:
    printed = tuple(allreduce_lines(AllReduceSetup(tp=8, fusion_backend="auto", multicast=True)))
    host = with_incumbent(candidate=Behaviour(output=printed))
    rep = run(host, stack=_sim("trtllm-allreduce"))
    assert (rep.outcome, rep.exit_code) == ("promoted", 0), rep.render()
    ready = next(s for s in rep.steps if s.name == "ready")
    assert ready.detail.endswith("; startup log shows the expected path")


# --- validate: the citations are read from the release's wheel -------------------------------------------

def _wheel(tmp: Path, lines: list[str]) -> Path:
    import zipfile

    w = tmp / "sglang-0.5.23-py3-none-any.whl"
    with zipfile.ZipFile(w, "w") as z:
        z.writestr("sglang/srt/layers/flashinfer_comm_fusion.py", "\n".join(lines) + "\n")
    return w


def test_a_citation_is_checked_against_the_cited_lines(tmp_path: Path) -> None:
    src = ["# filler"] * 370
    src[367] = '            "FlashInfer workspace preflight probe failed (%s). "'  # line 368
    w = _wheel(tmp_path, src)
    ok = LogLine(text="FlashInfer workspace preflight probe failed", source=f"{FUSION}:368")
    assert line_problem(ok, w) is None
    far = LogLine(text="FlashInfer workspace preflight probe failed", source=f"{FUSION}:300")
    assert line_problem(far, w) == (f"{FUSION}:300 does not print 'FlashInfer workspace' (not within 3 lines of "
                                    "the cited ones); cite the line that prints it")
    nofile = LogLine(text="FlashInfer workspace preflight probe failed",
                     source="sglang 0.5.23 srt/layers/nothing_here.py:1")
    assert line_problem(nofile, w) == ("sglang 0.5.23 srt/layers/nothing_here.py:1: sglang 0.5.23 has no file "
                                       "srt/layers/nothing_here.py; cite the file that prints the line")


def test_a_citation_of_another_release_is_an_error(tmp_path: Path) -> None:
    root = tmp_path
    (root / "stacks").mkdir()
    (root / "stacks" / "x.yaml").write_text(
        "base_image: nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04\ncuda: '13.0.1'\n"
        "components: {sglang: {version: 0.5.23}}\nserver:\n  model_path: /m\n"
        "  expect_log:\n    present:\n      - text: 'FlashInfer PCIe-IPC all-reduce enabled'\n"
        "        source: 'sglang 0.5.22 srt/distributed/device_communicators/pcie_ipc_ar.py:242'\n")
    s = load_stack("x", root=root)
    assert [str(f) for f in check_expect_log(s, offline=True)] == [
        f"{root / 'stacks' / 'x.yaml'}:9:17: error: server.expect_log.present.0.source: cites sglang 0.5.22 but "
        "the stack runs sglang 0.5.23; cite the line in the release it runs [expect-log-source]"]


# --- the simulator's variants meet or fail their expectation as their comments say -------------------------

def _setup(variant: str) -> AllReduceSetup:
    s = _sim(variant)
    f = s.server.flags
    backend = f.get("--flashinfer-allreduce-fusion-backend")
    return AllReduceSetup(tp=int(str(f.get("--tp-size", 1))), pcie_ipc_env=s.server.env.get(
        "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"), fusion_backend=None if backend is None else str(backend),
        multicast=bool(f.get("--host-multicast")))


@pytest.mark.parametrize(("variant", "met"), [("pcie-ipc-allreduce", True), ("trtllm-allreduce", False),
                                               ("trtllm-allreduce-multicast", True)])
def test_sim_variants(variant: str, met: bool) -> None:
    why = unmet(_sim(variant).server.expect_log, "\n".join(allreduce_lines(_setup(variant))))
    assert (why is None) == met, why
