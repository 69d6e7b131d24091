"""The service survives its host rebooting (issue 23), on a real systemd+sshd host of its own.

A power cycle here is what a real one does to a GPU host: the machine's processes die at once
(the test-host container is killed) and so do the server containers its units run (siblings on
this machine's dockerd, which a container restart alone would leave running), /run is empty
again (a tmpfs), and systemd boots and starts what is enabled. The promoted release must come
back by itself within a minute; a candidate that was being gated must not.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest
from test_deploy_support import (
    HostBox,
    Project,
    SimImage,
    docker,
    generate,
    need_infra,
    running_project,
    sim_image,  # noqa: F401  (fixture)
)

pytestmark = pytest.mark.integration

BOOT_BOUND_S = 300.0  # far above a boot (seconds): a bound for a loaded machine, not a speed claim


@pytest.fixture(scope="module")
def project(sim_image: SimImage, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:  # noqa: F811
    from stackbuild.host import local

    need_infra()
    lh = local.start(tmp_path_factory.mktemp("reboothost"))
    box = HostBox(lh.container, lh.port, lh.key, lh.known_hosts)
    try:
        with running_project(box, sim_image, tmp_path_factory.mktemp("reboot"), deployed=True) as p:
            yield p
    finally:
        local.stop(lh)


def _power_cycle(p: Project) -> float:
    """Kill the machine and what it runs, boot it; seconds from power-on until the service serves."""
    from stackbuild.host import local

    docker("kill", p.host.container)
    for name in (p.service, f"{p.service}-candidate"):  # the servers die with the machine
        docker("kill", name, check=False)
    t0 = time.monotonic()
    docker("start", p.host.container)
    local.wait_up(p.host.container, p.host.port, BOOT_BOUND_S)
    while time.monotonic() - t0 < BOOT_BOUND_S:
        if generate(p.port, timeout=2.0):
            return time.monotonic() - t0
        time.sleep(0.5)
    pytest.fail(f"nothing served on {p.port} {BOOT_BOUND_S:g}s after boot: "
                + p.host.sh(f"systemctl status --no-pager {p.service}; journalctl -b -u {p.service} | tail -20").stdout)


def _running_image(p: Project) -> str:
    return docker("inspect", "--format", "{{.Config.Image}}", p.service).stdout.strip()


def _enabled(p: Project, unit: str) -> str:
    res = p.host.sh(f"systemctl is-enabled {unit}")
    return res.stdout.strip() or res.stderr.strip()


def test_the_promoted_release_serves_again_after_a_reboot(project: Project) -> None:
    p = project
    promoted = p.state()["current"]
    assert isinstance(promoted, dict)
    assert _enabled(p, p.service) == "enabled"
    took = _power_cycle(p)
    assert took < BOOT_BOUND_S
    assert _running_image(p) == promoted["image"] and p.state()["current"] == promoted
    assert p.active() == "active" and _enabled(p, p.service) == "enabled"
    print(f"served again {took:.1f}s after power-on")


def test_a_reboot_while_a_candidate_is_gated_boots_the_promoted_release(project: Project) -> None:
    p = project
    promoted = p.state()["current"]
    assert isinstance(promoted, dict)
    proc = p.popen("good2", "--strategy", "side-by-side")
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:  # the gate's start, told as it happens: the candidate runs
        seen.append(line)
        if line.rstrip().endswith("] gate"):  # the plain line of the gate stage starting
            break
    else:
        pytest.fail("".join(seen))
    cand = f"{p.service}-candidate"
    assert p.active(cand) == "active", "".join(seen)
    assert (_enabled(p, p.service), _enabled(p, cand)) == ("enabled", "disabled")
    proc.send_signal(signal.SIGKILL)  # the client dies with the power cut, mid-gate
    proc.wait(timeout=30)
    took = _power_cycle(p)
    st = p.state()
    assert st["current"] == promoted and st.get("pending"), st  # the killed deploy is still marked
    assert _running_image(p) == promoted["image"] and "--seed 1" not in p.unit_text()
    assert _enabled(p, p.service) == "enabled"
    assert p.active(cand) != "active" and "No such file" in _enabled(p, cand)  # gone with /run
    print(f"served again {took:.1f}s after power-on")
    r = p.deploy("good2", "--strategy", "side-by-side")  # the re-run converges and finishes
    assert r.returncode == 0, r.stdout + r.stderr
    assert "recover" in r.stdout and "--seed 1" in p.unit_text() and p.serving()
    assert _enabled(p, p.service) == "enabled"
