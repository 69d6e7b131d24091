"""A real fleet rollout behind the real gateway: zero failed requests through it.

Two systemd+sshd hosts, the sim image, the gateway image built from the committed smg lock and run
as a unit on the first host by `deploy --fleet` itself. A client streams completions through the
gateway while a slower candidate is rolled back at the canary and a better one is promoted on both
hosts (side-by-side: each candidate joins where it runs, the incumbent is drained and stopped);
every request is counted by its tokens. Bounded: each rollout within its timeout.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from test_deploy_support import (
    REPO_ROOT,
    HostBox,
    SimImage,
    docker,
    free_port,
    generate,
    need_infra,
    sim_image,  # noqa: F401  (fixture)
)
from test_fleet_integration import SPEC as FLEET_SPEC

from stackbuild.effects import http
from stackbuild.effects.gateway import HttpGateway, Unauthorized
from stackbuild.gate.background import BackgroundLoad
from stackbuild.render.gateway import pool_urls
from stackbuild.spec.lock.smg import LOCK_DIR

pytestmark = pytest.mark.integration

def spec(gw_service: str, gw_port: int, gw_metrics: int) -> str:
    """The fleet integration tests' stack (sim at high speed, tiny gate), behind its gateway: the servers
    export /metrics (a drain counts by it), each host deploys side-by-side, the gateway's image goes to
    the local registry."""
    tree = yaml.safe_load(FLEET_SPEC)
    tree["name"], tree["description"] = "gwfleet", "a fleet behind its gateway (sim at high speed, tiny gate)"
    tree["server"]["flags"]["--enable-metrics"] = True
    tree["runtime"]["secrets"] = ["HF_TOKEN"]  # a secret the servers get: it must land in their 0600 file only
    tree["host"] = {"strategy": "side-by-side", "registry": "127.0.0.1:5000/stackbuild",
                    "fleet": {"waves": [1, "100%"]}}
    tree["gateway"] = {"base_image": "local/debian:bookworm", "exclude_newer": "2026-12-03T00:00:00Z",
                       "service": gw_service, "listen": "127.0.0.1",
                       "port": gw_port, "metrics_port": gw_metrics, "policy": "round_robin",
                       "health": {"interval_s": 2, "timeout_s": 3}, "drain_timeout_s": 30, "shutdown_grace_s": 10}
    tree["variants"] = {v: tree["variants"][v] for v in ("good2", "slower")}
    # no dying candidate here (whose generation budget keeps the fleet test at 6): room past the first look
    # on a busy machine (looks start where a boundary can be crossed, correlation allowed for)
    tree["gate"]["profiles"]["tiny"]["max_runs"] = 10
    return yaml.safe_dump(tree, sort_keys=False)


ROLLOUT_TIMEOUT_S = 300
HF_TOKEN = "hf_" + secrets.token_hex(12)  # what the deploys get in their environment


@dataclass
class GatewayFleet:
    root: Path
    hosts: list[HostBox]
    ports: list[tuple[int, int]]
    image: SimImage
    gw_service: str
    gw_port: int

    def service(self, i: int) -> str:
        return f"gwfleet{i}{self.hosts[i].port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.gw_port}"

    def inventory(self) -> Path:
        lines = ["hosts:"]
        for i, h in enumerate(self.hosts):
            lines += [f"  - name: h{i}", f"    address: {h.target}", f"    port: {self.ports[i][0]}",
                      f"    staging_port: {self.ports[i][1]}", f"    service: {self.service(i)}"]
        path = self.root / "inv.yaml"
        path.write_text("\n".join(lines) + "\n")
        return path

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "stackbuild", "--root", str(self.root), *args,
                "--known-hosts", str(self.root / "known_hosts"), "--identity", str(self.hosts[0].key)]
        env = {**os.environ, "HF_TOKEN": HF_TOKEN}
        return subprocess.run(argv, capture_output=True, text=True, timeout=ROLLOUT_TIMEOUT_S, cwd=self.root, env=env)

    def deployed(self) -> None:
        """Every host serves behind the gateway (rolled out here unless an earlier test did)."""
        if self.hosts[0].sh(f"systemctl is-active {self.gw_service}").stdout.strip() != "active":
            run = self.rollout(None)
            assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]

    def key(self) -> str:
        """The gateway's control-plane key, as stackbuild made it on the gateway's host (h0)."""
        text = self.hosts[0].sh(f"cat /etc/stackbuild/{self.gw_service}.control-plane.key").stdout
        return text.strip().removeprefix("SMG_CONTROL_PLANE_KEY=")

    def api(self) -> HttpGateway:
        return HttpGateway(self.url, key=self.key())

    def rollout(self, variant: str | None) -> subprocess.CompletedProcess[str]:
        return self.cli("deploy", "gwfleet", *(["--variant", variant] if variant else []), "--fleet",
                        "--inventory", str(self.inventory()), "--image", self.image.ref,
                        "--ledger", str(self.root / "ledger.db"))

    def serving_urls(self) -> list[str]:
        """Each host's committed release, at the port its state says it serves on."""
        out = []
        for i, h in enumerate(self.hosts):
            st = json.loads(h.sh(f"cat /var/lib/stackbuild/{self.service(i)}/state.json").stdout)
            out.append(f"http://127.0.0.1:{st['current']['port']}")
        return sorted(out)


@pytest.fixture(scope="module")
def gw_fleet(sim_image: SimImage, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayFleet]:  # noqa: F811
    from stackbuild.host import local

    need_infra()
    root = tmp_path_factory.mktemp("gwfleet")
    tag = secrets.token_hex(3)
    gw_service, gw_port = f"gwfleet-gateway-{tag}", free_port()
    (root / "stacks").mkdir()
    (root / "stacks" / "gwfleet.yaml").write_text(spec(gw_service, gw_port, free_port()))
    shutil.copytree(REPO_ROOT / LOCK_DIR, root / LOCK_DIR)  # the gateway's hash lock, where the stack reads it
    hosts: list[HostBox] = []
    known = ""
    try:
        for i in range(2):
            lh = local.start(root / "keys", name=f"wt22-gwfleet-{i}-{tag}")
            hosts.append(HostBox(lh.container, lh.port, lh.key, lh.known_hosts))
            known += lh.known_hosts.read_text()
        (root / "known_hosts").write_text(known)
        yield GatewayFleet(root, hosts, [(free_port(), free_port()) for _ in hosts], sim_image, gw_service, gw_port)
    finally:
        for i, h in enumerate(hosts):
            local.stop(h, (f"gwfleet{i}{h.port}", *([gw_service] if i == 0 else [])))


def test_a_rolled_back_canary_and_a_promoted_candidate_fail_no_request_through_the_gateway(
        gw_fleet: GatewayFleet) -> None:
    f = gw_fleet
    base = f.rollout(None)
    assert base.returncode == 0, base.stdout[-4000:] + base.stderr[-2000:]
    assert f"fleet: gateway on h0: {f.gw_service}.service started with" in base.stdout
    # an independent client at the rate the issue measured drops at: 4 streams at once, small completions
    with BackgroundLoad(f.url, clients=4, pause_s=0.05) as client:
        assert client.wait_for(10, 60), client.summary()
        slower = f.rollout("slower")
        assert slower.returncode == 1, slower.stdout[-4000:]
        assert "fleet: stop at canary" in slower.stdout
        better = f.rollout("good2")
        assert better.returncode == 0, better.stdout[-4000:]
    print(f"through the gateway during both rollouts: {client.summary()}")  # docs/gateway.md quotes it
    assert (client.failed, client.failures) == (0, [])
    assert client.ok >= 50, client.summary()
    # both hosts now serve from their staging unit (the candidate took over where it ran): the gateway
    # routes to exactly those, and its unit's pool file names the same, for a restart
    urls = f.serving_urls()
    assert urls == sorted(f"http://127.0.0.1:{staging}" for _, staging in f.ports)
    assert sorted(w.url for w in f.api().workers() if w.routable) == urls
    pool = f.hosts[0].sh(f"cat /etc/stackbuild/{f.gw_service}.workers").stdout
    assert sorted(pool_urls(pool)) == urls
    status = f.cli("status", "--fleet", "gwfleet", "--inventory", str(f.inventory()),
                   "--ledger", str(f.root / "ledger.db"))
    assert status.returncode == 0, status.stdout + status.stderr
    assert f"  gateway {f.gw_service} on port {f.gw_port}" in status.stdout
    for i, (_, staging) in enumerate(f.ports):
        assert f"    http://127.0.0.1:{staging} (h{i}): ready" in status.stdout, status.stdout
    assert "NOT put there" not in status.stdout
    _secrets_stay_in_their_files(f, [base, slower, better, status])


def _secrets_stay_in_their_files(f: GatewayFleet, runs: list[subprocess.CompletedProcess[str]]) -> None:
    """The control-plane key and HF_TOKEN: in their 0600 files and the processes' environment, nowhere else --
    not the commands' output, the ledger, the step logs, the units, the pool file, the hosts' state."""
    key = f.key()
    assert len(key) == 64
    h0 = f.hosts[0]
    assert h0.sh(f"stat -c %a /etc/stackbuild/{f.gw_service}.control-plane.key").stdout.strip() == "600"
    for run in runs:
        assert key not in run.stdout + run.stderr and HF_TOKEN not in run.stdout + run.stderr
    for p in f.root.rglob("*"):  # the ledger, the step logs, the report
        if p.is_file():
            data = p.read_bytes()
            assert key.encode() not in data and HF_TOKEN.encode() not in data, p
    for i, h in enumerate(f.hosts):
        # every file of the host stackbuild writes: units, pool file, state; the secrets files only where they belong
        found = h.sh(f"grep -rlF -e {key} -e {HF_TOKEN} /etc/systemd/system /etc/stackbuild /var/lib/stackbuild "
                     "2>/dev/null; true").stdout.split()
        want = {f"/etc/stackbuild/{f.service(i)}.env"} | (
            {f"/etc/stackbuild/{f.gw_service}.control-plane.key"} if i == 0 else set())
        assert set(found) == want, found
        for path in want:
            assert h.sh(f"stat -c %a {path}").stdout.strip() == "600", path
        env = docker_env(f"{f.service(i)}-candidate")
        assert f"HF_TOKEN={HF_TOKEN}" in env  # the server's own environment: where it belongs
    # the gateway's argv (docker's record of its container, and its processes' command lines) has no key; its
    # environment has it, where the launcher took it from
    args = json.loads(docker("inspect", "--format", "{{json .Args}}", f.gw_service).stdout)
    assert key not in json.dumps(args) and key not in docker("top", f.gw_service).stdout
    assert f"SMG_CONTROL_PLANE_KEY={key}" in docker_env(f.gw_service)


def docker_env(container: str) -> list[str]:
    return list(json.loads(docker("inspect", "--format", "{{json .Config.Env}}", container).stdout))


def test_an_unauthenticated_control_plane_call_gets_401(gw_fleet: GatewayFleet) -> None:
    f = gw_fleet
    f.deployed()
    before = sorted(w.url for w in f.api().workers())
    rogue = json.dumps({"url": "http://127.0.0.1:9"}).encode()
    assert http.request("POST", f"{f.url}/workers", body=rogue, headers={"Content-Type": "application/json"}).status \
        == 401
    assert http.request("GET", f"{f.url}/workers").status == 401
    wid = f.api().workers()[0].id
    assert http.request("DELETE", f"{f.url}/workers/{wid}", headers={"Authorization": "Bearer nope"}).status == 401
    with pytest.raises(Unauthorized):
        HttpGateway(f.url, key="nope").workers()
    assert sorted(w.url for w in f.api().workers()) == before  # nothing changed


def test_after_a_power_cut_the_gateway_serves_within_5s_of_its_servers(gw_fleet: GatewayFleet) -> None:
    """Both hosts lose power (the gateway's with them) and boot: the gateway, ordered after the servers on its
    host and retrying its workers every second, serves within seconds of the first server that does."""
    from stackbuild.host import local

    f = gw_fleet
    f.deployed()
    ports = sorted(int(u.rsplit(":", 1)[1]) for u in f.serving_urls())
    for i, h in enumerate(f.hosts):
        docker("kill", h.container)
        for name in (f.service(i), f"{f.service(i)}-candidate", *([f.gw_service] if i == 0 else [])):
            docker("kill", name, check=False)  # siblings on this dockerd: they die with the machine
    t0 = time.monotonic()
    for h in f.hosts:
        docker("start", h.container)
    firsts: dict[str, float] = {}

    def watch(what: str, ok: Callable[[], bool]) -> None:
        while time.monotonic() - t0 < BOOT_BOUND_S and what not in firsts:
            if ok():
                firsts[what] = time.monotonic() - t0
            time.sleep(0.1)

    watchers = [threading.Thread(target=watch, args=("server", lambda: any(generate(p, 2.0) for p in ports))),
                threading.Thread(target=watch, args=("gateway", lambda: _completes(f.url)))]
    for t in watchers:
        t.start()
    for h in f.hosts:
        local.wait_up(h.container, h.port, BOOT_BOUND_S)
    for t in watchers:
        t.join(BOOT_BOUND_S + 10)
    assert set(firsts) == {"server", "gateway"}, (firsts, f.hosts[0].sh(
        f"journalctl -b -u {f.gw_service} | tail -20").stdout)
    lag = firsts["gateway"] - firsts["server"]
    print(f"after a power cut: a server served {firsts['server']:.1f}s after power-on, the gateway "
          f"{firsts['gateway']:.1f}s ({lag:.1f}s later)")  # docs/host-lifecycle.md quotes it
    assert lag < 5.0


BOOT_BOUND_S = 90.0


def _completes(url: str) -> bool:
    """One small completion through the gateway answers 200 (the model named, as smg routes by it)."""
    body = json.dumps({"model": "sim/model", "prompt": "hi", "max_tokens": 2}).encode()
    try:
        return http.request("POST", f"{url}/v1/completions", body=body, headers={"Content-Type": "application/json"},
                            timeout=2.0).status == 200
    except http.HttpFailure:
        return False


def test_a_take_over_killed_then_rerun_fails_no_request_and_serves_no_ungated_build(gw_fleet: GatewayFleet) -> None:
    """Issue #29: a rollout SIGKILLed once the canary's candidate joined the gateway (the take-over under
    way: the incumbent still to be drained and stopped), then run again. An independent client streams
    through the gateway the whole time: no request fails, and the re-run puts every host on the
    candidate (the candidate that joined is drained before it stops; the next one joins only after its gate)."""
    import signal

    f = gw_fleet
    base = f.rollout("good2")  # every host on good2 (already, after the first test)
    assert base.returncode == 0, base.stdout[-4000:] + base.stderr[-2000:]
    pool_file = f"/etc/stackbuild/{f.gw_service}.workers"
    before = set(pool_urls(f.hosts[0].sh(f"cat {pool_file}").stdout))
    assert before, f"the pool file names no server: {pool_file}"
    argv = [sys.executable, "-m", "stackbuild", "--root", str(f.root), "deploy", "gwfleet", "--fleet",
            "--inventory", str(f.inventory()), "--image", f.image.ref, "--ledger", str(f.root / "ledger.db"),
            "--known-hosts", str(f.root / "known_hosts"), "--identity", str(f.hosts[0].key)]
    with BackgroundLoad(f.url, clients=4, pause_s=0.05) as client:
        assert client.wait_for(10, 60), client.summary()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=f.root)
        # the canary's candidate, in the pool: taking over (a URL of the pool file's that was not there before)
        others = " ".join(f"-e {u}" for u in sorted(before))
        news = f"grep -o 'http://[^ \"]*' {pool_file} | grep -qvxF {others}"
        assert f.hosts[0].until(news, ROLLOUT_TIMEOUT_S, unless=proc), \
            "the rollout ended before its canary's candidate joined the gateway"
        joined = next(iter(set(pool_urls(f.hosts[0].sh(f"cat {pool_file}").stdout)) - before), None)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        again = f.rollout(None)
        assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-2000:]
        assert "(resumed)" in again.stdout
        assert client.wait_for(client.sent + 10, 60), client.summary()
    print(f"through the gateway, killed mid take-over ({joined}) and re-run: {client.summary()}")
    assert (client.failed, client.failures) == (0, [])
    urls = f.serving_urls()
    assert sorted(w.url for w in f.api().workers() if w.routable) == urls
    assert sorted(pool_urls(f.hosts[0].sh(f"cat {pool_file}").stdout)) == urls


def test_a_one_host_fleet_behind_the_gateway_is_refused_without_allow_outage(gw_fleet: GatewayFleet) -> None:
    """Issue #29: a 1-host fleet with waves ['100%'] dropped 367 of 508 requests over ~74 s, exit 0, and the
    plan said nothing. Now the plan says the outage and its length, and the rollout is refused (exit 2)
    before the host is touched."""
    f = gw_fleet
    h = f.hosts[0]
    one = f.root / "one.yaml"
    one.write_text(f"hosts:\n  - name: h0\n    address: {h.target}\n    port: {f.ports[0][0]}\n"
                   f"    staging_port: {f.ports[0][1]}\n    service: {f.service(0)}\nfleet:\n  waves: ['100%']\n")
    state = f"/var/lib/stackbuild/{f.service(0)}"
    before = h.sh(f"cat {state}/state.json; ls {state}").stdout
    r = f.cli("deploy", "gwfleet", "--variant", "slower", "--fleet", "--inventory", str(one),
              "--image", f.image.ref, "--ledger", str(f.root / "ledger.db"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "OUTAGE: the canary (h0) takes every host of the pool out of the gateway at once" in r.stderr
    assert "refused without --allow-outage" in r.stderr
    assert h.sh(f"cat {state}/state.json; ls {state}").stdout == before  # no lock, no state change
    dry = f.cli("deploy", "gwfleet", "--fleet", "--inventory", str(one), "--dry-run", "--allow-outage")
    assert dry.returncode == 0 and "fleet: OUTAGE: the canary (h0)" in dry.stdout, dry.stdout + dry.stderr
