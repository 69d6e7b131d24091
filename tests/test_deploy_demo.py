"""`stackbuild demo` end to end: build, host container, deploys, gate, results table."""

from __future__ import annotations

import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers_gateway import DemoRun, demo_with_client
from test_deploy_support import REPO_ROOT, need_infra

from stackbuild.effects.net import free_port
from stackbuild.spec.lock.smg import LOCK_DIR

pytestmark = pytest.mark.integration
PER_TEST = True  # each demo has its own project, host container names and ports: two workers, not one
APART = True  # ~200 s each: never queued behind each other on one worker (tests/conftest.py, apart)


GATEWAY_SUMMARY = re.compile(r"^demo: through the gateway during the rollouts: (\d+) request\(s\) sent through "
                             r"(http://127\.0\.0\.1:\d+), (\d+) failed", re.M)


def _root(tmp_path: Path) -> Path:
    """A project with the shipped sim stack and the gateway's lock; its service, gateway and ports this run's
    own (the demo's hosts share this machine's network and docker daemon with whatever else runs)."""
    (tmp_path / "stacks").mkdir()
    spec = yaml.safe_load((REPO_ROOT / "stacks" / "sim.yaml").read_text())
    tag = secrets.token_hex(3)
    spec["host"]["service"] = f"stackbuild-sim-{tag}"
    spec["runtime"].update(port=free_port(), staging_port=free_port())
    spec["gateway"].update(service=f"stackbuild-gateway-{tag}", port=free_port(), metrics_port=free_port())
    (tmp_path / "stacks" / "sim.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    # the gateway's hash lock, where the copied stack looks for it
    locks = tmp_path / LOCK_DIR
    locks.mkdir(parents=True)
    for f in (REPO_ROOT / LOCK_DIR).iterdir():
        shutil.copy(f, locks / f.name)
    return tmp_path


def assert_nothing_failed_through_the_gateway(run: DemoRun) -> None:
    """The demo printed its gateway as soon as it served; an independent client streaming through it from
    then until the demo ended saw >= 50 requests and none failed; so did the demo's own client."""
    gw = re.search(r"^gateway: (http://127\.0\.0\.1:\d+)$", run.out, re.M)
    assert gw is not None and run.load is not None, run.out[-3000:]
    print(f"the independent client (4 streams): {run.load.summary()}")  # docs/gateway.md quotes it
    assert (run.load.url, run.load.failures) == (gw.group(1), []), run.out[-6000:]
    assert run.load.failed == 0 and run.load.ok >= 50, run.load.summary()
    own = GATEWAY_SUMMARY.search(run.out)
    assert own is not None and own.group(2) == gw.group(1), run.out[-3000:]
    assert int(own.group(1)) >= 50 and own.group(3) == "0", own.group(0)


def test_demo_runs_the_whole_pipeline(tmp_path: Path) -> None:
    need_infra()
    root = _root(tmp_path)
    name = f"stackbuild-demo-test-{secrets.token_hex(3)}"
    run = demo_with_client([sys.executable, "-m", "stackbuild", "--root", str(root), "demo", "--remove-host",
                            "--host-name", name], root, timeout_s=600)
    out = run.out
    assert run.code == 0, out[-4000:]
    assert_nothing_failed_through_the_gateway(run)
    assert "outcome: promoted (exit 0)" in out
    assert "=== results" in out
    table = out.split("=== results", 1)[1]
    assert "baseline" in table and "slower" in table and "rolled-back" in table
    # the build is in the ledger too, linked to the deploy that promoted it
    builds = table.split("## Builds", 1)[1]
    assert "| sim | `127.0.0.1:5000/stackbuild:sim-" in builds and "promoted on root@127.0.0.1:" in builds
    # eagle3-topk1-v2 under the sim stack's policy (C=1 may lose 8%, C>=2 must not lose), and the table
    # says why. By the model it is 6.5% slower at C=1, 1.5 points inside the bar: promoted on an idle
    # machine, but with the suite on two CPUs one CI run measured -7.1% (CI -8.5%..-5.6%) after 16
    # runs: inconclusive, which the gate must then say, never a failure. C=8 (55% faster by the
    # model) passes on an idle machine; beside two busy loops a fresh-clone CI read it
    # inconclusive once: the same rule, each level pass or inconclusive, the exit code theirs
    codes = re.search(r"^demo: exit codes: baseline=0, eagle3-topk1-v2=([03]), ", out, re.M)
    assert codes, out[-3000:]
    rows = "\n".join(ln for ln in table.splitlines() if "eagle3-topk1-v2" in ln)
    said = re.findall(r"(?:allowed -8%|must not lose \(margin 2%\)): ([A-Z]+)\)", rows)
    assert len(said) >= 2 and set(said) <= {"PASS", "INCONCLUSIVE"}, table
    assert (codes.group(1) == "0") == (set(said) == {"PASS"}), table
    gone = subprocess.run(["/usr/bin/docker", "inspect", name], capture_output=True)
    assert gone.returncode != 0, "--remove-host left the host container behind"


def test_demo_fleet_of_three_drops_no_request_through_its_gateway(tmp_path: Path) -> None:
    """`demo --fleet 3`: a rolled-back canary, then a candidate promoted wave by wave, every host drained
    out of the gateway before its server stops: through the gateway, nothing fails."""
    need_infra()
    root = _root(tmp_path)
    run = demo_with_client([sys.executable, "-m", "stackbuild", "--root", str(root), "demo", "--fleet", "3",
                            "--remove-host"], root, timeout_s=1200)
    out = run.out
    assert run.code == 0, out[-4000:]
    assert_nothing_failed_through_the_gateway(run)
    assert "demo: every host (3) runs the passing candidate" in out
    # the canary of the slower candidate was rolled back, the better one promoted everywhere
    assert re.search(r"^fleet: stop at canary: ", out, re.M) and "fleet: rollout " in out
    assert out.count(": completed (exit 0)") == 2, out[-3000:]
