"""The host's secrets file survives every deploy on a real host (issue 10, item 3).

A deploy from a shell without the secret must leave the operator's file as it
was; a rejected candidate given a new value must leave the incumbent running
with the file it ran with; a promoted one updates only the names it was given.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator

import pytest
from test_deploy_support import (
    HostBox,
    Project,
    SimImage,
    cleanup_project,
    deploy_host,  # noqa: F401  (fixture)
    docker,
    make_project,
    sim_image,  # noqa: F401  (fixture)
)

pytestmark = pytest.mark.integration

OPERATOR = "# the operator own file\nSB_TOK=operator-value\nOTHER=keep-me\n"
VARIANTS = (
    '  sec: {runtime: {secrets: [SB_TOK]}}\n'
    '  seccrash: {runtime: {secrets: [SB_TOK]}, server: {flags: {--fault: crash-on-start}}}\n'
)


@pytest.fixture
def project(deploy_host: HostBox, sim_image: SimImage,  # noqa: F811
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    p = make_project(deploy_host, sim_image, tmp_path_factory.mktemp("secrets"), VARIANTS)
    try:
        yield p
    finally:
        cleanup_project(p)
        p.host.sh(f"rm -f /etc/stackbuild/{p.service}.env")


def _deploy(p: Project, variant: str, token: str | None, strategy: str = "swap") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SB_TOK"} | ({"SB_TOK": token} if token else {})
    return subprocess.run(p.cmd("deploy", "simtest", "--variant", variant, "--strategy", strategy), capture_output=True,
                          text=True, timeout=180, cwd=p.root, env=env)


def _container_token(p: Project) -> str | None:
    env = json.loads(docker("inspect", p.service).stdout)[0]["Config"]["Env"]
    return next((e.split("=", 1)[1] for e in env if e.startswith("SB_TOK=")), None)


def test_operator_secrets_survive_deploys(project: Project) -> None:
    p = project
    env_file = f"/etc/stackbuild/{p.service}.env"
    p.host.sh(f"mkdir -p /etc/stackbuild && printf '%s' '{OPERATOR}' > {env_file} && chmod 600 {env_file}")

    r = _deploy(p, "sec", None)  # a shell without SB_TOK
    assert r.returncode == 0, r.stdout + r.stderr
    assert p.host.sh(f"cat {env_file}").stdout == OPERATOR
    assert _container_token(p) == "operator-value"

    r = _deploy(p, "seccrash", "candidate-value")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "rolled-back" in r.stdout + r.stderr
    assert p.host.sh(f"cat {env_file}").stdout == OPERATOR
    assert p.host.sh(f"stat -c %a {env_file}").stdout.strip() == "600"
    assert _container_token(p) == "operator-value" and p.serving()

    r = _deploy(p, "sec", "new-value")
    assert r.returncode == 0, r.stdout + r.stderr
    assert p.host.sh(f"cat {env_file}").stdout == OPERATOR.replace("operator-value", '"new-value"')
    assert _container_token(p) == "new-value"
    assert p.host.sh(f"ls /var/lib/stackbuild/{p.service}/ /etc/stackbuild/").stdout.count("env") == 1
    logs = sorted((p.ledger.parent / "logs").glob("deploy-*.log"))  # each deploy's step log
    assert len(logs) >= 3 and all("secrets ok" in f.read_text() for f in logs[-3:])
    assert not [f for f in logs if "candidate-value" in f.read_text() or "new-value" in f.read_text()]


