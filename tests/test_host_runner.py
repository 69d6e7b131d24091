"""Pure parts of the deploy glue and the GPU preflight checks, with exact expectations."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers_deploy import gate_result

from stackbuild.errors import InputError
from stackbuild.flows.deploy_host import gate_profile
from stackbuild.host.decide import verdict_of
from stackbuild.host.preflight import Gpu, check_gpus
from stackbuild.image.ref import pin, split_pinned
from stackbuild.spec.load import load_stack

ROOT = Path(__file__).resolve().parents[1]
DIGEST = "sha256:" + "ab" * 32


def test_pin_drops_the_tag_and_keeps_the_registry_port() -> None:
    assert pin("127.0.0.1:5000/stackbuild:sim-0123", DIGEST) == f"127.0.0.1:5000/stackbuild@{DIGEST}"
    assert pin("127.0.0.1:5000/a/b", DIGEST) == f"127.0.0.1:5000/a/b@{DIGEST}"
    assert pin(f"127.0.0.1:5000/x@{'sha256:' + '0' * 64}", DIGEST) == f"127.0.0.1:5000/x@{DIGEST}"


def test_split_pinned() -> None:
    assert split_pinned(f"127.0.0.1:5000/s@{DIGEST}") == ("127.0.0.1:5000/s", DIGEST)
    with pytest.raises(InputError, match="pinned reference"):
        split_pinned("127.0.0.1:5000/s:latest")


def test_gate_profile_lookup() -> None:
    stack = load_stack("sim", root=ROOT)
    assert gate_profile(stack, None) == stack.gate.profiles["quick"]
    assert gate_profile(stack, "users").runs == 5  # builtin
    with pytest.raises(InputError, match="not a gate profile"):
        gate_profile(stack, "nope")


def test_first_deploy_verdict_uses_bars_and_probe_only() -> None:
    assert verdict_of(gate_result("reference"), first=True) == "pass"
    assert verdict_of(gate_result("reference", bars=("C=1 too slow",)), first=True) == "fail"
    assert verdict_of(gate_result("reference", probe_ok=False), first=True) == "fail"
    assert verdict_of(gate_result("fail"), first=True) == "fail"
    assert verdict_of(gate_result("inconclusive"), first=False) == "inconclusive"


def _gpus(n: int, arch: str = "sm_120", driver: str = "580.65.06") -> list[Gpu]:
    return [Gpu(i, "NVIDIA RTX PRO 6000 Blackwell", arch, driver, 97887) for i in range(n)]


def test_gpu_checks_pass_on_the_blackwell_host() -> None:
    stack = load_stack("cuda13", root=ROOT)
    checks = check_gpus(stack, _gpus(8), None)
    assert [(c.name, c.ok) for c in checks] == [("gpu count", True), ("gpu arch", True),
                                                ("driver", True)]


def test_gpu_checks_report_each_failure() -> None:
    stack = load_stack("cuda13", root=ROOT)
    checks = check_gpus(stack, _gpus(4, arch="sm_90", driver="570.12"), None)
    assert [(c.name, c.ok) for c in checks] == [("gpu count", False), ("gpu arch", False),
                                                ("driver", False)]
    by = {c.name: c.detail for c in checks}
    assert by["gpu count"] == f"4 GPU(s), the stack needs 8 (tp={stack.runtime.tp})"
    assert "sm_90 not covered" in by["gpu arch"]
    assert by["driver"] == f"driver 570.12, CUDA {stack.cuda} needs >= 580"
    assert check_gpus(stack, [], "NVIDIA-SMI has failed")[0].detail.startswith("nvidia-smi failed")
