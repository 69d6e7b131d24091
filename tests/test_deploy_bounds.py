"""A deploy's lock is bounded by what its own steps can take; steps are told as they happen."""

from __future__ import annotations

from pathlib import Path

import pytest

from stackbuild.errors import InfraError
from stackbuild.host.deploy import hold_bound_s
from stackbuild.host.outcome import DeployReport
from stackbuild.host.request import DeployRequest
from stackbuild.host.state import LeaseOwner, is_stale, me
from stackbuild.results.display import Event, Step
from stackbuild.spec.load import load_stack
from stackbuild.spec.profile import BUILTIN_PROFILES, GateProfile
from stackbuild.spec.stack import Stack


def test_lock_owner_declares_until_and_readers_honour_it() -> None:
    o = LeaseOwner("other", 1, 1000.0, "deploy x", until=1500.0)
    assert LeaseOwner.from_json(o.to_json()) == o
    # a reader assuming a 60 s TTL still waits for the holder's own bound, and not longer
    assert not is_stale(o, now=1400, ttl_s=60, local_host="box")
    assert is_stale(o, now=1501, ttl_s=10**6, local_host="box")
    old = LeaseOwner.from_json('{"host": "other", "pid": 1, "started": 1000, "what": "x"}')
    assert old is not None and old.until is None and is_stale(old, now=1061, ttl_s=60, local_host="box")
    mine = me("deploy y", 100.0)
    assert mine.until is not None and round(mine.until - mine.started, 3) == 100.0


def _stack(tmp_path: Path, text: str) -> Stack:
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "b.yaml").write_text(text)
    return load_stack("b", root=tmp_path)


def test_hold_bound_counts_every_step_at_its_timeout(tmp_path: Path) -> None:
    stack = _stack(tmp_path, "name: b\nbase_image: local/debian:bookworm\ncuda: null\n"
                   "server: {engine: sim, model_path: m}\nruntime: {start_timeout_s: 10, ready_timeout_s: 20}\n")
    prof = GateProfile(deadline_s=100.0)
    req = DeployRequest(stack=stack, image="r@sha256:" + "0" * 64, digest="d", strategy="swap", profile=prof,
                        pull_timeout_s=50.0)
    assert hold_bound_s(req) == 50 + 3 * (10 + 20) + 2 * 100 + 600
    assert BUILTIN_PROFILES["users"].gate_deadline_s() == 4 * 3600


def test_report_tells_each_step_as_it_starts_and_ends() -> None:
    told: list[Event] = []
    rep = DeployReport(host="h", service="s", stack="x", image="i", strategy="swap", live=told.append)
    with rep.step("pull") as st:
        assert told == [Step("h", "pull")]
        st.detail = "pulled"
    assert told == [Step("h", "pull"), Step("h", "pull", True, rep.steps[0].seconds, "pulled")]
    with pytest.raises(InfraError), rep.step("gate"):
        raise InfraError("the server went away\nmore")
    assert told[-1] == Step("h", "gate", False, rep.steps[1].seconds, "the server went away")
    assert '"live"' not in rep.to_json()


def test_switch_is_one_oneshot_unit_the_host_finishes() -> None:
    from stackbuild.host.units import switch_unit_text

    assert switch_unit_text("/st/switch.sh", ["s-candidate.service", "/u/s.service", "a b%"]) == (
        "# Written by stackbuild: the side-by-side switch, finished by systemd even if the client dies.\n"
        "[Unit]\nDescription=stackbuild switch\n\n"
        '[Service]\nType=oneshot\nExecStart=/bin/sh /st/switch.sh s-candidate.service /u/s.service "a b%%"\n'
    )


def test_prestart_noise_dropped_from_crash_logs() -> None:
    from stackbuild.host.units import without_prestart_noise

    logs = "== journalctl -u s\nError: No such container: s\nsim: fault\nError: No such container: other\n"
    assert without_prestart_noise(logs, "s") == "== journalctl -u s\nsim: fault\nError: No such container: other\n"
