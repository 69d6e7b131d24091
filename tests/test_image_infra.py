"""The real infrastructure the other integration tests stand on."""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TestHost

pytestmark = pytest.mark.integration


def test_registry_answers_v2(registry: str) -> None:
    with urllib.request.urlopen(f"http://{registry}/v2/_catalog", timeout=5) as resp:
        assert "repositories" in json.load(resp)


def test_base_image_is_debootstrapped_bookworm(docker_client: Any, base_image: str) -> None:
    out = docker_client.containers.run(base_image, ["cat", "/etc/debian_version"], network_mode="none", remove=True)
    assert out.decode().startswith("12.")


def test_testhost_serves_ssh_with_strict_host_key(testhost: TestHost) -> None:
    res = testhost.ssh(
        "systemctl is-active ssh && python3 -c 'print(6*7)' && docker version --format '{{.Server.Version}}'"
    )
    lines = res.stdout.split()
    assert lines[:2] == ["active", "42"]
    assert lines[2]  # the machine's daemon answers through the mounted socket
    # Another key recorded for this host must be refused: the file really is used.
    good = testhost.known_hosts.read_text()
    other = testhost.workdir / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    wrong = other.with_suffix(".pub").read_text().split()[:2]
    testhost.known_hosts.write_text(f"[{testhost.host}]:{testhost.port} {' '.join(wrong)}\n")
    bad = testhost.ssh("true", check=False)
    assert bad.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in bad.stderr
    testhost.known_hosts.write_text(good)


def test_testhost_kill_and_start_again(testhost: TestHost) -> None:
    testhost.kill()
    assert testhost.ssh("true", check=False, timeout=20).returncode == 255
    testhost.start()
    assert testhost.ssh("echo back").stdout.strip() == "back"


def test_two_hosts_run_side_by_side(testhost_factory: Any) -> None:
    a, b = testhost_factory(), testhost_factory()
    assert a.port != b.port
    cmd = "cat /etc/ssh/ssh_host_ed25519_key.pub"
    assert a.ssh(cmd).stdout != b.ssh(cmd).stdout


def test_a_host_that_never_comes_up_is_not_left_behind(docker_client: Any, tmp_path: Path) -> None:
    """Its sshd cannot bind: the port is held here (bound, never listening). Whatever systemd makes of
    that within the bound, start() raises and removes the container it made. (It used to be a host given
    0.05 s: one pass of the wait always runs, and beside two busy loops the host came up within it.)"""
    import docker.errors

    from stackbuild.errors import InfraError
    from stackbuild.host import local

    name = f"sb-testhost-timeout-{uuid.uuid4().hex[:8]}"
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        with pytest.raises(InfraError, match=f"^host container {name}: "):
            local.start(tmp_path, name=name, port=port, timeout_s=3)
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(name)
