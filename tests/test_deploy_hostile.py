"""Hostile values from a spec reach the real host as one literal argument each; secrets stay secret.

A flag value and an env value carrying `;`, `$(...)`, backticks, quotes, `%`
specifiers and backslashes are deployed for real: the container must receive
them byte for byte, nothing may execute, and the EnvironmentFile secret must
appear nowhere but in its 0600 file and the container's environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

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

# no newline: the spec boundary refuses control characters (tests/test_values_are_data.py)
HOSTILE = "m; touch /tmp/pwned-a $(touch /tmp/pwned-b) `touch /tmp/pwned-c` 'sq' \"dq\" %h $HOME\\x"
SECRET = "s3cr3t-$(touch /tmp/pwned-d)-'q'\"dq\"-%n-$USER"


@pytest.fixture(scope="module")
def hostile(deploy_host: HostBox, sim_image: SimImage,  # noqa: F811
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    variant = {"server": {"served_model_name": HOSTILE, "env": {"SB_HOSTILE": HOSTILE}},
               "runtime": {"secrets": ["SB_TEST_SECRET"]}}
    extra = f"  hostile: {json.dumps(variant)}\n"
    p = make_project(deploy_host, sim_image, tmp_path_factory.mktemp("hostile"), extra)
    try:
        yield p
    finally:
        cleanup_project(p)


def _no_pwned(host: HostBox, container: str) -> None:
    assert host.sh("ls /tmp/pwned-* 2>/dev/null").stdout == ""
    assert not list(Path("/tmp").glob("pwned-*"))
    inside = docker("exec", container, "sh", "-c", "ls /tmp/pwned-* 2>/dev/null", check=False)
    assert inside.stdout == ""


def test_hostile_values_stay_literal_on_the_real_host(hostile: Project) -> None:
    p = hostile
    env = {**os.environ, "SB_TEST_SECRET": SECRET}
    r = subprocess.run(p.cmd("deploy", "simtest", "--variant", "hostile"), capture_output=True,
                       text=True, timeout=180, cwd=p.root, env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out

    info = json.loads(docker("inspect", p.service).stdout)[0]
    args = info["Args"]
    assert args[args.index("--served-model-name") + 1] == HOSTILE
    assert f"SB_HOSTILE={HOSTILE}" in info["Config"]["Env"]
    assert f"SB_TEST_SECRET={SECRET}" in info["Config"]["Env"]

    with urllib.request.urlopen(f"http://127.0.0.1:{p.port}/v1/models", timeout=5) as resp:
        models = json.loads(resp.read())
    assert [m["id"] for m in models["data"]] == [HOSTILE]
    _no_pwned(p.host, p.service)

    env_file = f"/etc/stackbuild/{p.service}.env"
    assert p.host.sh(f"stat -c '%a %U' {env_file}").stdout.strip() == "600 root"

    # the secret lives only in the EnvironmentFile (and the container's env)
    places = {
        "unit file": p.unit_text(),
        "ExecStart": p.host.sh(f"systemctl show -p ExecStart {p.service}").stdout,
        "state file": p.host.sh(f"cat /var/lib/stackbuild/{p.service}/state.json").stdout,
        "journal": p.host.sh(f"journalctl -u {p.service} --no-pager").stdout,
        "deploy output": out,
        "ledger": p.ledger.read_bytes().decode(errors="replace"),
    }
    for where, text in places.items():
        assert SECRET not in text, f"the secret leaked into the {where}"
        assert "s3cr3t" not in text, f"part of the secret leaked into the {where}"


def test_dry_run_never_prints_a_secret(hostile: Project) -> None:
    p = hostile
    env = {**os.environ, "SB_TEST_SECRET": SECRET}
    r = subprocess.run(p.cmd("deploy", "simtest", "--variant", "hostile", "--dry-run"),
                       capture_output=True, text=True, timeout=120, cwd=p.root, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    # the value is already on the host (the test above): nothing to write, and never shown
    assert "secrets" in r.stdout and "SB_TEST_SECRET" in r.stdout
    assert "s3cr3t" not in r.stdout + r.stderr


def test_first_deploy_through_an_ssh_tunnel(deploy_host: HostBox, sim_image: SimImage,  # noqa: F811
                                            tmp_path: Path) -> None:
    """What a remote GPU host gets: readiness and gate through SSH, not a direct socket."""
    p = make_project(deploy_host, sim_image, tmp_path)
    try:
        r = p.deploy(None, "--tunnel")
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        assert "outcome: promoted (exit 0)" in out
        assert p.serving()
    finally:
        cleanup_project(p)


def test_ssh_config_alias_and_default_files(deploy_host: HostBox, tmp_path: Path) -> None:  # noqa: F811
    """`--host ALIAS` resolves through ~/.ssh/config (HostName, Port, User, IdentityFile) and
    the default ~/.ssh/known_hosts is what decides trust."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        "Host gpu-test\n  HostName 127.0.0.1\n"
        f"  Port {deploy_host.port}\n  User root\n  IdentityFile {deploy_host.key}\n"
    )
    (home / ".ssh" / "known_hosts").write_text(deploy_host.known_hosts.read_text())
    argv = [sys.executable, "-m", "stackbuild", "status", "--host", "gpu-test", "--service", "none"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "HOME": str(home)})
    assert r.returncode == 0, r.stderr
    assert "gpu-test none: NOT active" in r.stdout and "nothing deployed" in r.stdout
