"""flows.deploy_host's `status` and `rollback` entry points (what the CLI calls) on the scripted FakeHost."""

from __future__ import annotations

import pytest
from helpers_deploy import CANDIDATE, INCUMBENT, PATHS, run, snapshot, with_incumbent
from helpers_fleet import FakeReach, look

from stackbuild.errors import InputError
from stackbuild.flows.deploy_host import read_status, run_rollback
from stackbuild.host.ssh import SshOptions, sh_argv
from stackbuild.host.state import SERVICES_SCRIPT


def promoted_candidate() -> FakeReach:
    host = with_incumbent()
    assert run(host).outcome == "promoted"
    return FakeReach({"gpu1": host})


def test_rollback_finds_the_only_service_and_puts_the_previous_release_back() -> None:
    reach = promoted_candidate()
    host = reach.fakes["gpu1"]
    rep = run_rollback("root@gpu1", SshOptions(), service=None, state_dir=PATHS.state_dir, timeout_s=60.0,
                       tunnel=False, dry_run=False, echo=lambda _: None, reach=reach)
    assert (rep.outcome, rep.exit_code, rep.service, rep.image) == ("rolled-back", 0, PATHS.service, INCUMBENT)
    assert sh_argv(SERVICES_SCRIPT, PATHS.state_dir) in host.commands and host.closed  # its connection closed
    st = look(host)
    assert st.current is not None and st.current.image == INCUMBENT and st.previous.image == CANDIDATE  # type: ignore[union-attr]
    assert host.serving(31000) == INCUMBENT and PATHS.lease_dir not in host.dirs


def test_a_dry_run_rollback_prints_and_changes_nothing() -> None:
    reach = promoted_candidate()
    host = reach.fakes["gpu1"]
    before = snapshot(host)
    said: list[str] = []
    run_rollback("root@gpu1", SshOptions(), service=PATHS.service, state_dir=PATHS.state_dir, timeout_s=60.0,
                 tunnel=False, dry_run=True, echo=said.append, reach=reach)
    assert snapshot(host) == before
    assert any(s.startswith("would run: ") for s in said) and any(s.startswith("read: ") for s in said)


def test_status_reads_the_hosts_only_service_and_refuses_to_guess_between_two() -> None:
    reach = promoted_candidate()
    host = reach.fakes["gpu1"]
    address, st = read_status("gpu1", SshOptions(), service=None, state_dir=PATHS.state_dir, reach=reach)
    assert str(address) == "gpu1" and st.active and st.state.current.image == CANDIDATE  # type: ignore[union-attr]
    assert st.render("gpu1").startswith("gpu1 stackbuild-sim: active, enabled (starts on boot)")
    host.dirs[f"{PATHS.state_dir}/other"] = host.now
    with pytest.raises(InputError, match=r"several services \(other, stackbuild-sim\); pass --service NAME"):
        read_status("gpu1", SshOptions(), service=None, state_dir=PATHS.state_dir, reach=reach)
    with pytest.raises(InputError, match="no stackbuild service under /nowhere"):
        read_status("gpu1", SshOptions(), service=None, state_dir="/nowhere", reach=reach)
