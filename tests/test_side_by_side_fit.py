"""Side-by-side that cannot fit on the GPUs is refused from the spec alone: exact lines, exit 2, no host touched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers_spec import BASE, project, run_cli

from stackbuild.errors import InfraError
from stackbuild.host.fit import side_by_side_refusal
from stackbuild.paths import shipped_dir
from stackbuild.spec.load import load_stack

ROOT = shipped_dir("stacks").parent
WHAT_TO_DO = ("deploy with --strategy swap (the incumbent stops first), or serve the candidate from a second host "
              "behind the gateway [side-by-side-fit]")
CUDA13 = ("stacks/_blackwell.yaml:18:9: error: side-by-side: the candidate would run on GPUs 0-7, held by the "
          "incumbent (gpus: all, tp 8: sglang places its ranks from GPU 0), and each keeps 85% of every one of "
          "them for weights and KV cache (--mem-fraction-static 0.85); " + WHAT_TO_DO)


def test_the_users_tp8_stack_cannot_run_twice() -> None:
    refusal = side_by_side_refusal(load_stack("cuda13", root=ROOT))
    assert refusal is not None
    assert str(refusal).replace(str(ROOT) + "/", "") == CUDA13


@pytest.mark.parametrize(("runtime", "flags", "expected"), [
    pytest.param("  gpus: 4\n  tp: 4\n", "    --tp-size: 4\n",
                 "stacks/s.yaml:16:9: error: side-by-side: the candidate would run on GPUs 0-3, held by the incumbent "
                 "(gpus: 4: docker's --gpus count=4 hands every container GPUs 0-3), and each sizes its KV "
                 "cache to most of every one of them (--mem-fraction-static unset); " + WHAT_TO_DO, id="count"),
    pytest.param("  gpus: all\n  tp: 2\n", "    --tp-size: 2\n    --base-gpu-id: 4\n    --mem-fraction-static: 0.4\n",
                 "stacks/s.yaml:18:9: error: side-by-side: the candidate would run on GPUs 4-5, held by the incumbent "
                 "(gpus: all, tp 2: sglang places its ranks from GPU 4), and each keeps 40% of every one of them "
                 "for weights and KV cache (--mem-fraction-static 0.4); " + WHAT_TO_DO, id="all-low-fraction"),
    pytest.param("  gpus: 1\n  tp: 1\n", "    --tp-size: 1\n    --dp-size: 2\n",
                 "stacks/s.yaml:17:9: error: side-by-side: the candidate would run on GPU 0, held by the incumbent "
                 "(gpus: 1: docker's --gpus count=1 hands every container GPU 0), and each sizes its KV "
                 "cache to most of every one of them (--mem-fraction-static unset); " + WHAT_TO_DO, id="dp-over-count"),
])
def test_every_way_a_stack_asks_for_gpus_shares_them(tmp_path: Path, runtime: str, flags: str, expected: str) -> None:
    text = BASE.replace("    --tp-size: 8\n", flags).replace("  gpus: 8\n  tp: 8\n", runtime)
    refusal = side_by_side_refusal(load_stack("s", root=project(tmp_path, {"s.yaml": text})))
    assert str(refusal).replace(str(tmp_path) + "/", "") == expected


def test_stacks_without_gpus_fit() -> None:
    sim = load_stack("sim", root=ROOT)
    assert side_by_side_refusal(sim) is None
    # the simulator never touches a GPU it is handed
    assert side_by_side_refusal(sim.model_copy(update={"runtime": sim.runtime.model_copy(update={"gpus": 2})})) is None


def _never_connect(*_: Any, **__: Any) -> Any:
    raise InfraError("connect called")


@pytest.mark.parametrize(("strategy", "rc", "last"), [
    # refused from the spec: exit 2, the one line, and connect never called
    ("side-by-side", 2, CUDA13),
    # swap passes the check and goes on to connect (here: a stand-in that refuses)
    ("swap", 4, "stackbuild: connect called"),
])
def test_deploy_checks_the_fit_before_connecting(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                                 strategy: str, rc: int, last: str) -> None:
    monkeypatch.setattr("stackbuild.host.reach.connect", _never_connect)
    got, err, out = run_cli(capsys, "--root", str(ROOT), "deploy", "cuda13", "--host", "root@127.0.0.1:1",
                            "--strategy", strategy, "--dry-run")
    assert (got, err[-1], out) == (rc, last, "")
