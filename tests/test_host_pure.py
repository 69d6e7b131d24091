"""Exact expectations for the pure parts of stackbuild.host (no SSH, no docker)."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from stackbuild.errors import EXIT_GATE_FAILED, EXIT_INCONCLUSIVE, EXIT_INFRA, EXIT_OK, InputError
from stackbuild.host.crash import KINDS, classify
from stackbuild.host.dryrun import DryRunRemote
from stackbuild.host.outcome import DeployReport
from stackbuild.host.preflight import (
    parse_df_avail_kib,
    parse_listening_ports,
    parse_nvidia_smi,
    port_checks,
    ulimit_checks,
    version_tuple,
)
from stackbuild.host.ssh import (
    HostAddress,
    known_hosts_name,
    parse_host,
    quote_argv,
    sh_argv,
    trust_hint,
)
from stackbuild.host.state import HostPaths, HostState, LeaseOwner, is_stale, parse_state
from stackbuild.host.unit_probe import parse_show
from stackbuild.host.units import env_file_text, verify_errors

HOSTILE = ["a;touch /tmp/pwned", "$(id)", "`id`", "it's \"quoted\"", "two\nlines", "$HOME", ""]


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("gpu1", HostAddress("gpu1")),
        ("root@127.0.0.1:2222", HostAddress("127.0.0.1", "root", 2222)),
        ("deploy@gpu-box.lan", HostAddress("gpu-box.lan", "deploy", None)),
        ("[::1]:22", HostAddress("::1", None, 22)),
        ("me@[fe80::1]", HostAddress("fe80::1", "me", None)),
    ],
)
def test_parse_host(text: str, want: HostAddress) -> None:
    assert parse_host(text) == want


def test_host_address_round_trips() -> None:
    assert str(parse_host("root@127.0.0.1:2222")) == "root@127.0.0.1:2222"
    assert str(parse_host("[::1]:22")) == "[::1]:22"
    assert parse_host("root@127.0.0.1:2222").is_loopback
    assert not parse_host("gpu1").is_loopback


@pytest.mark.parametrize("bad", ["", "root@", "a b", "host:99999", "host:", "x;y", "@host"])
def test_parse_host_rejects(bad: str) -> None:
    with pytest.raises(InputError, match="--host"):
        parse_host(bad)


@pytest.mark.parametrize("value", HOSTILE)
def test_quote_argv_keeps_each_value_one_literal_word(value: str) -> None:
    line = quote_argv(["printf", "%s", value])
    assert shlex.split(line) == ["printf", "%s", value]
    # and a real POSIX shell agrees
    out = subprocess.run(["sh", "-c", line], capture_output=True, text=True, check=True)
    assert out.stdout == value


def test_sh_argv_passes_values_as_positional_parameters() -> None:
    argv = sh_argv('printf "%s|%s" "$1" "$2"', "$(id)", "a;b")
    assert argv == ["sh", "-c", 'printf "%s|%s" "$1" "$2"', "sh", "$(id)", "a;b"]
    out = subprocess.run(["sh", "-c", quote_argv(argv)], capture_output=True, text=True)
    assert out.stdout == "$(id)|a;b"


def test_quote_argv_rejects_empty() -> None:
    with pytest.raises(ValueError):
        quote_argv([])


def test_known_hosts_name_and_hint() -> None:
    assert known_hosts_name("127.0.0.1", 2222) == "[127.0.0.1]:2222"
    assert known_hosts_name("gpu1", 22) == "gpu1"
    assert trust_hint("127.0.0.1", 2222) == (
        "check the key with the host's owner, then add it: ssh-keyscan -p 2222 127.0.0.1 "
        ">> ~/.ssh/known_hosts (or re-run with --accept-new-host-key)"
    )


def test_dry_run_records_and_never_runs_changes() -> None:
    seen: list[str] = []
    dr = DryRunRemote("root@h", echo=seen.append)
    res = dr.run(["systemctl", "stop", "x y"])
    dr.put_text("TOKEN=abc", "/etc/stackbuild/s.env", mode=0o600, secret=True)
    assert res.ok and res.stdout == ""
    assert seen == [
        "would run: systemctl stop 'x y'",
        "would put: /etc/stackbuild/s.env (mode 0600, <secret, not shown>)",
    ]
    assert "abc" not in "".join(dr.commands)


# --- crash signatures ----------------------------------------------------------

CRASH_LOGS = {
    # uvicorn's, which sglang's HTTP server runs on, when the port is held
    "port-in-use": "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 30001): "
    "address already in use",
    "container-create": "docker: Error response from daemon: failed to create shim task: OCI "
    "runtime create failed: runc create failed: error setting rlimits for ready process",
    "cuda-oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    "cuda-graph-capture": "Exception: Capture cuda graph failed: operation not permitted when "
    "stream is capturing",
    "nccl-error": "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
    "unhandled system error",
    "illegal-memory-access": "RuntimeError: CUDA error: an illegal memory access was encountered",
    "bad-server-flag": "launch_server.py: error: unrecognized arguments: --cuda-graph-max-bs 128",
    "no-kernel-image": "RuntimeError: CUDA error: no kernel image is available for execution on "
    "the device",
    "missing-model-path": "OSError: /models/glm5 is not a local folder and is not a valid model "
    "identifier listed on 'https://huggingface.co/models'",
}


@pytest.mark.parametrize(("kind", "line"), sorted(CRASH_LOGS.items()))
def test_classify_each_kind(kind: str, line: str) -> None:
    log = f"[2026-12-02 10:00:00] loading weights\n{line}\n[rank0] exiting\n"
    sig = classify(log)
    assert sig is not None
    assert (sig.kind, sig.line) == (kind, line)


def test_classify_click_usage_error() -> None:
    sig = classify("Usage: stackbuild sim [OPTIONS]\nError: No such option: --bogus\n")
    assert sig is not None and (sig.kind, sig.line) == (
        "bad-server-flag", "Error: No such option: --bogus")


def test_kinds_cover_the_issue_list() -> None:
    assert set(KINDS) == set(CRASH_LOGS)


def test_classify_priority_graph_capture_over_oom() -> None:
    log = "Capture cuda graph failed: CUDA out of memory. Tried to allocate 20 MiB\n"
    sig = classify(log)
    assert sig is not None and sig.kind == "cuda-graph-capture"


def test_classify_ambiguous_flag_and_nothing() -> None:
    sig = classify("error: ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode")
    assert sig is not None and sig.kind == "bad-server-flag"
    assert classify("INFO: server started\nGET /health 200\n") is None


# --- tool output parsers ---------------------------------------------------------

def test_parse_nvidia_smi() -> None:
    text = (
        "0, NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 12.0, 580.65.06, 97887\n"
        "1, NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 12.0, 580.65.06, 97887\n"
    )
    gpus = parse_nvidia_smi(text)
    assert [(g.index, g.arch, g.driver, g.memory_mib) for g in gpus] == [
        (0, "sm_120", "580.65.06", 97887),
        (1, "sm_120", "580.65.06", 97887),
    ]
    assert version_tuple("580.65.06") == (580, 65, 6)


def test_gpu_runs_file_under_the_gpus_preflight_read() -> None:
    from stackbuild.host.preflight import PreflightReport
    from stackbuild.results.ledger import host_class_of

    line = "{}, NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 12.0, 580.65.06, 97887\n"
    facts = PreflightReport((), tuple(parse_nvidia_smi("".join(line.format(i) for i in range(8))))).host_facts()
    assert facts == {"gpu_model": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "gpu_count": "8",
                     "driver": "580.65.06", "arch": "sm_120"}
    assert host_class_of(facts) == "8x NVIDIA RTX PRO 6000 Blackwell Workstation Edition"


def test_parse_listening_ports() -> None:
    tcp = (
        "  sl  local_address rem_address   st tx_queue rx_queue\n"
        "   0: 0100007F:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0\n"
        "   1: 0100007F:08AE 0100007F:D2C4 01 00000000:00000000 00:00000000 00000000 0\n"
        "   0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A x\n"
    )
    assert parse_listening_ports(tcp) == {30000, 8080}


LIMITS = """Limit                     Soft Limit           Hard Limit           Units
Max stack size            8388608              unlimited            bytes
Max processes             unlimited            unlimited            processes
Max open files            20000                20000                files
Max locked memory         8388608              8388608              bytes
"""


def test_ulimit_checks_against_the_daemon() -> None:
    checks = ulimit_checks(LIMITS, {"nofile": 65536, "memlock": -1, "stack": 67108864,
                                    "rtprio": 5})
    assert [(c.name, c.ok) for c in checks] == [
        ("ulimit nofile", False), ("ulimit memlock", False), ("ulimit stack", True)]
    assert checks[0].detail == ("runtime.ulimits nofile=65536, the docker daemon's hard limit is "
                                "20000: lower it in the spec or raise the daemon's")
    assert ulimit_checks(LIMITS, {"nofile": "1024:16384"})[0].ok


def test_port_checks() -> None:
    checks = port_checks({30000, 30001}, {30001: False, 30000: True, 30002: False})
    assert [(c.ok, c.detail) for c in checks] == [
        (False, "port 30001 is in use by another process: free it or change runtime.port"),
        (True, "port 30000 is held by the incumbent (replaced on promotion)"),
        (True, "port 30002 is free"),
    ]


def test_parse_df() -> None:
    text = (
        "Filesystem     1024-blocks      Used Available Capacity Mounted on\n"
        "overlay          102400000  51200000  51200000      50% /\n"
    )
    assert parse_df_avail_kib(text) == 51200000
    assert parse_df_avail_kib("") is None


def test_parse_show_and_crash_states() -> None:
    st = parse_show("ActiveState=active\nSubState=running\nNRestarts=0\nResult=success\n"
                    "ExecMainStatus=0\n")
    assert not st.crashed
    assert parse_show("ActiveState=activating\nSubState=auto-restart\nNRestarts=1\n").crashed
    assert parse_show("ActiveState=failed\nSubState=failed\nResult=exit-code\n").crashed
    assert parse_show("ActiveState=inactive\nSubState=dead\nResult=exit-code\n"
                      "ExecMainStatus=1\n").crashed
    assert not parse_show("ActiveState=activating\nSubState=start\nNRestarts=0\n").crashed


def test_verify_errors_only_lines_about_our_unit() -> None:
    out = (
        "/etc/systemd/system/other.service:3: Unknown key name 'Foo' in section 'Unit'\n"
        "/var/lib/stackbuild/s/staging/s.service:9: Unknown key name 'Bogus' in section 'Service'\n"
        "s.service: Command /usr/bin/nope is not executable: No such file or directory\n"
    )
    assert verify_errors(out, "s.service", "/var/lib/stackbuild/s/staging/s.service") == [
        "/var/lib/stackbuild/s/staging/s.service:9: Unknown key name 'Bogus' in section 'Service'",
        "s.service: Command /usr/bin/nope is not executable: No such file or directory",
    ]


def test_env_file_text_escapes() -> None:
    assert env_file_text({"B": 'x"y', "A": "$(id) `id` \\n"}) == (
        "# written by stackbuild; mode 0600; secrets only, by name\n"
        'A="\\$(id) \\`id\\` \\\\n"\n'
        'B="x\\"y"\n'
    )
    with pytest.raises(InputError, match="secret name"):
        env_file_text({"BAD-NAME": "x"})


# --- state and lock ---------------------------------------------------------------

def test_paths() -> None:
    p = HostPaths("/var/lib/stackbuild/", "sglang")
    assert p.state_file == "/var/lib/stackbuild/sglang/state.json"
    assert p.lease_dir == "/var/lib/stackbuild/sglang/lock"
    assert p.result_file("0123abcd") == "/var/lib/stackbuild/sglang/results/0123abcd.json"
    assert (p.main_unit, p.candidate_unit) == ("sglang.service", "sglang-candidate.service")
    assert p.unit_path(p.main_unit) == "/etc/systemd/system/sglang.service"


def test_state_parse_empty_and_roundtrip() -> None:
    assert parse_state("", "svc", "h") == HostState(service="svc")
    st = HostState(service="svc", last_verdict="fail")
    assert parse_state(st.model_dump_json(), "svc", "h") == st
    with pytest.raises(Exception, match="host state file is not valid"):
        parse_state('{"service": 3, "current": "x"}', "svc", "h")


def test_lock_owner_roundtrip_and_staleness() -> None:
    o = LeaseOwner("box", 4242, 1000.0, "deploy sim")
    assert LeaseOwner.from_json(o.to_json()) == o
    assert LeaseOwner.from_json("") is None
    dead = lambda pid: False  # noqa: E731
    alive = lambda pid: True  # noqa: E731
    assert is_stale(o, now=1001, ttl_s=60, local_host="box", alive=dead)
    assert not is_stale(o, now=1001, ttl_s=60, local_host="box", alive=alive)
    # another machine's pid cannot be checked: only the TTL decides
    assert not is_stale(o, now=1001, ttl_s=60, local_host="other", alive=dead)
    assert is_stale(o, now=1061, ttl_s=60, local_host="other", alive=alive)
    assert not is_stale(None, now=10**9, ttl_s=60, local_host="box", alive=dead)
    # a run's own lock from a connection that died is taken back by that run (its recovery)...
    mine = LeaseOwner("box", 4242, 1000.0, "deploy sim", run="r1/h0")
    assert LeaseOwner.from_json(mine.to_json()) == mine
    assert is_stale(mine, now=1001, ttl_s=60, local_host="box", alive=alive, own_run="r1/h0")
    # ...never by another run of the same live process (a rollout's other thread: same pid)
    assert not is_stale(mine, now=1001, ttl_s=60, local_host="box", alive=alive, own_run="r1/h1")
    assert not is_stale(o, now=1001, ttl_s=60, local_host="box", alive=alive, own_run="")
    assert not is_stale(mine, now=1001, ttl_s=60, local_host="other", alive=dead, own_run="r1/h0")


# --- report -------------------------------------------------------------------------

def _rep() -> DeployReport:
    return DeployReport(host="h", service="s", stack="sim", image="i", strategy="swap")


def test_report_exit_codes() -> None:
    r = _rep()
    r.finish("promoted")
    assert r.exit_code == EXIT_OK
    r = _rep()
    r.finish("rolled-back", "gate fail")
    assert r.exit_code == EXIT_GATE_FAILED
    r = _rep()
    r.verdict = "inconclusive"
    r.finish("rolled-back", "gate inconclusive")
    assert r.exit_code == EXIT_INCONCLUSIVE
    r = _rep()
    r.finish("refused", "lock held")
    assert r.exit_code == EXIT_INFRA


def test_report_downtime_sums_outages() -> None:
    r = _rep()
    r.outages = [(10.0, 11.5), (20.0, 20.25)]
    r.finish("rolled-back", "x")
    assert r.downtime_s == 1.75
    assert "downtime: 1.75s in 2 outage(s)" in r.render()


def test_local_host_known_hosts_come_from_its_own_keys() -> None:
    from stackbuild.host.local import known_hosts_text, parse_pubkeys

    pubs = "ssh-ed25519 AAAAC3Nz root@box\necdsa-sha2-nistp256 AAAAE2Vj root@box\n\n"
    keys = parse_pubkeys(pubs)
    assert keys == ["ssh-ed25519 AAAAC3Nz", "ecdsa-sha2-nistp256 AAAAE2Vj"]
    assert known_hosts_text(2222, keys) == (
        "[127.0.0.1]:2222 ssh-ed25519 AAAAC3Nz\n[127.0.0.1]:2222 ecdsa-sha2-nistp256 AAAAE2Vj\n")
