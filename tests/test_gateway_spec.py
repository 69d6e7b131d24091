"""The `gateway:` section: values checked by kind at load, and what `validate` checks of it, each one exact line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers_spec import project, run_cli

from stackbuild.paths import shipped_dir
from stackbuild.spec.gateway import Gateway
from stackbuild.spec.load import load_stack
from stackbuild.spec.lock.smg import LOCK_DIR, gateway_target, lock_name

ROOT = shipped_dir("stacks").parent
SIM = """\
base_image: local/debian:bookworm
cuda: null
server:
  engine: sim
  model_path: /models/sim
  flags:
    --enable-metrics: true
runtime:
  gpus: none
  port: 31000
  staging_port: 31001
gateway:
  port: 31080
  exclude_newer: "2026-12-03T00:00:00Z"
"""


OPEN = "[gateway-open]"  # SIM listens on 0.0.0.0 with no data-plane key: its own test below


def validate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, *, lock: bool = True, open_ok: bool = True
) -> tuple[int, list[str]]:
    root = project(tmp_path, {"g.yaml": text})
    if lock:  # the committed gateway lock, as a project that ran `stackbuild lock g --gateway` has it
        shutil.copytree(ROOT / LOCK_DIR, root / LOCK_DIR)
    rc, err, _ = run_cli(capsys, "--root", str(root), "validate", "g", "--offline")
    return rc, [ln for ln in err if not ln.startswith("stackbuild:") and not (open_ok and ln.endswith(OPEN))]


def test_listening_everywhere_with_no_data_plane_key_is_a_warning(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert validate(tmp_path / "1", capsys, SIM, open_ok=False) == (0, [
        "stacks/g.yaml:12:1: warning: gateway.listen: 0.0.0.0 serves completions to whoever reaches port 31080, "
        "with no key; set gateway.api_keys (their values in the gateway host's secrets file) or listen on a private "
        "address [gateway-open]"])
    assert validate(tmp_path / "2", capsys, SIM + "  listen: '::'\n", open_ok=False)[1] == [
        "stacks/g.yaml:15:11: warning: gateway.listen: :: serves completions to whoever reaches port 31080, "
        "with no key; set gateway.api_keys (their values in the gateway host's secrets file) or listen on a private "
        "address [gateway-open]"]
    assert validate(tmp_path / "3", capsys, SIM + "  api_keys: [TEAM_A]\n", open_ok=False) == (0, [])
    assert validate(tmp_path / "4", capsys, SIM + "  listen: 10.0.0.5\n", open_ok=False) == (0, [])
    assert load_stack("g", root=tmp_path / "3").gateway == Gateway(port=31080, exclude_newer="2026-12-03T00:00:00Z",
                                                                    api_keys=("TEAM_A",))


def test_a_gateway_with_its_lock_is_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert validate(tmp_path, capsys, SIM) == (0, [])
    gw = load_stack("g", root=tmp_path).gateway
    assert gw == Gateway(port=31080, exclude_newer="2026-12-03T00:00:00Z")
    assert (gw.listen, gw.policy, gw.health.interval_s, gw.retries, gw.service) == (
        "0.0.0.0", "cache_aware", 10, 5, "stackbuild-gateway")


CASES = [
    pytest.param("  metrics_port: 0\n", "stacks/g.yaml:15:17: error: gateway.metrics_port: Input should be greater "
                 "than or equal to 1 (got 0) [type]", id="port"),
    pytest.param("  prot: 1\n", "stacks/g.yaml:15:3: error: gateway.prot: unknown key 'prot' (did you mean 'port'?) "
                 "[unknown-key]", id="unknown-key"),
    pytest.param("  listen: everywhere\n", "stacks/g.yaml:15:11: error: gateway.listen: not an IP address to listen "
                 "on, like 0.0.0.0 or 127.0.0.1 (got 'everywhere') [type]", id="listen"),
    # the kind every SSH target has (spec/kinds.py SshTarget): a fleet host's name is one too
    pytest.param("  host: 'gpu a'\n", "stacks/g.yaml:15:9: error: gateway.host: not [USER@]HOST[:PORT] (e.g. "
                 "root@gpu1:22, or an ~/.ssh/config alias) (got 'gpu a') [type]", id="host"),
    pytest.param("  health: {endpoint: health}\n", "stacks/g.yaml:15:22: error: gateway.health.endpoint: not an HTTP "
                 "path like /health (got 'health') [type]", id="endpoint"),
    pytest.param("  health: {timeout_s: 1}\n", "stacks/g.yaml:15:23: error: gateway.health.timeout_s: sglang's "
                 "/health answers after a second at the earliest; give it at least 2 (got 1) [type]", id="timeout"),
    pytest.param("  policy: fastest\n", "stacks/g.yaml:15:11: error: gateway.policy: Input should be 'random', "
                 "'round_robin', 'passthrough', 'cache_aware', 'power_of_two', 'least_load', 'manual', "
                 "'consistent_hashing' or 'prefix_hash' (got 'fastest') [type]", id="policy"),
    pytest.param("  api_keys: [team-a]\n", "stacks/g.yaml:15:14: error: gateway.api_keys.0: not an environment "
                 "variable name (letters, digits, _) (got 'team-a') [type]", id="api-key-name"),
    pytest.param("  service: ../etc\n", "stacks/g.yaml:15:12: error: gateway.service: not an identifier: letters, "
                 "digits, _-. (max 63, no '..') (got '../etc') [type]", id="service"),
]


@pytest.mark.parametrize(("extra", "expected"), CASES)
def test_bad_values_are_refused_where_they_are(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: str, expected: str
) -> None:
    assert validate(tmp_path, capsys, SIM + extra) == (2, [expected])


CHECKS = [
    pytest.param(SIM.replace("  port: 31080\n", "  port: 31000\n"),
                 "stacks/g.yaml:13:9: error: gateway.port: 31000 is the servers' runtime.port on the same host; "
                 "pick another port [gateway-port]", id="port-clash"),
    pytest.param(SIM + "  metrics_port: 31080\n",
                 "stacks/g.yaml:15:17: error: gateway.metrics_port: the same port as gateway.port; pick another "
                 "[gateway-port]", id="metrics-port"),
    pytest.param(SIM.replace("    --enable-metrics: true\n", "    --speed: 2\n"),
                 "stacks/g.yaml:6:3: error: server.flags: a gateway drains a server by its in-flight count from "
                 "/metrics; add --enable-metrics: true [gateway-metrics]", id="metrics"),
    pytest.param(SIM + "  host: gw.example\nhost:\n  hosts:\n    - {name: a, address: root@gpu-a}\n"
                 "    - {name: b, address: gpu-b:2222}\n",
                 "stacks/g.yaml:15:9: error: gateway.host: the servers listen on loopback only, so a gateway on "
                 "gw.example cannot reach root@gpu-a, gpu-b:2222; set server.flags --host: 0.0.0.0 or run the "
                 "gateway on that host [gateway-reach]", id="reach"),
    pytest.param(SIM + "  base_image: alpine:3.20\n",
                 "stacks/g.yaml:15:15: error: gateway.base_image: cannot tell the python and glibc of 'alpine:3.20' "
                 "(known: bookworm, ubuntu20.04, ubuntu22.04, ubuntu24.04); use a Debian or Ubuntu base "
                 "[gateway-base]", id="base"),
]


@pytest.mark.parametrize(("text", "expected"), CHECKS)
def test_validate_checks_the_gateway(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str,
                                     expected: str) -> None:
    assert validate(tmp_path, capsys, text) == (2, [expected])


def test_a_gateway_reaches_its_own_host_over_loopback_and_others_when_servers_listen_wide(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = "  host: a\nhost:\n  hosts:\n    - {name: a, address: root@gpu-a}\n"
    assert validate(tmp_path / "1", capsys, SIM + fleet) == (0, [])
    wide = SIM.replace("    --enable-metrics: true\n", "    --enable-metrics: true\n    --host: 0.0.0.0\n")
    assert validate(tmp_path / "2", capsys, wide + fleet + "    - {name: b, address: gpu-b}\n") == (0, [])


def test_the_lock_must_exist_and_match_its_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = "smg-1.13.0-py3.11-x86_64-manylinux_2_36.txt"
    assert validate(tmp_path, capsys, SIM, lock=False) == (2, [
        f"stacks/g.yaml:12:1: error: gateway: no lock stacks/locks/gateway/{name}; run `stackbuild lock g --gateway` "
        "[gateway-lock]"])
    lock = tmp_path / LOCK_DIR / name
    lock.parent.mkdir(parents=True)
    lock.write_text((ROOT / LOCK_DIR / name).read_text().replace("# inputs-sha256: ", "# inputs-sha256: 0"))
    rc, err, _ = run_cli(capsys, "--root", str(tmp_path), "validate", "g", "--offline")
    assert (rc, err[0]) == (2, f"stacks/g.yaml:12:1: error: gateway: stacks/locks/gateway/{name} was resolved for "
                               "other inputs; run `stackbuild lock g --gateway` [gateway-lock]")


def test_the_lock_is_named_by_what_it_resolves_for() -> None:
    for base, name in [("debian:bookworm-slim", "smg-1.13.0-py3.11-x86_64-manylinux_2_36.txt"),
                       ("ubuntu:24.04", None),
                       ("nvidia/cuda:13.0.1-base-ubuntu24.04", "smg-1.13.0-py3.12-x86_64-manylinux_2_39.txt")]:
        t = gateway_target(Gateway(base_image=base))
        assert (lock_name(t) if t else None) == name
    t = gateway_target(Gateway(version="1.12.0"))
    assert t is not None and t.requirements == ("smg==1.12.0",)


def test_an_undated_gateway_lock_is_warned_and_a_hand_edit_is_stale(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from stackbuild.spec.lock import resolve

    root = project(tmp_path, {"g.yaml": SIM.replace('  exclude_newer: "2026-12-03T00:00:00Z"\n', "")})
    t = gateway_target(load_stack("g", root=root).gateway)  # type: ignore[arg-type]
    assert t is not None
    (root / LOCK_DIR).mkdir(parents=True)
    body = "six==1.17.0 \\\n    --hash=sha256:" + "a" * 64 + "\n"
    lock = root / LOCK_DIR / lock_name(t)
    lock.write_text(resolve.seal(f"# stackbuild lock of the gateway\n# inputs-sha256: {t.inputs_hash()}\n" + body))
    rc, err, _ = run_cli(capsys, "--root", str(root), "validate", "g", "--offline")
    assert (rc, [ln for ln in err if not ln.endswith(OPEN)]) == (0, [
        "stacks/g.yaml:12:1: warning: gateway.exclude_newer is not set: a relock of smg's closure resolves against "
        "today's index and may differ; set it to an instant before its lock was made [gateway-lock-date]"])
    lock.write_text(lock.read_text().replace("six==1.17.0", "six==1.16.0"))
    rc, err, _ = run_cli(capsys, "--root", str(root), "validate", "g", "--offline")
    assert rc == 2
    assert err[0].startswith(f"stacks/g.yaml:12:1: error: gateway: {LOCK_DIR.as_posix()}/{lock_name(t)} was edited "
                             "after it was resolved (its pins hash to ")
