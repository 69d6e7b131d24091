"""HostLease against the in-memory FakeHost: exact commands, refusal, stale/ownerless breaking, release."""

from __future__ import annotations

import os
import socket
import time

import pytest

from stackbuild.errors import InfraError
from stackbuild.host.ssh import ConnectionLost, sh_argv
from stackbuild.host.state import (
    ACQUIRE_SCRIPT,
    BREAK_SCRIPT,
    LEASE_AGE_SCRIPT,
    RELEASE_SCRIPT,
    HostLease,
    HostPaths,
    LeaseHeld,
    LeaseOwner,
)
from stackbuild.testing.fake_host import SERVES, FakeHost, UnknownCommand

PATHS = HostPaths(state_dir="/var/lib/stackbuild", service="svc")
LOCK = "/var/lib/stackbuild/svc/lock"
ME = LeaseOwner(socket.gethostname(), os.getpid(), 1_700_000_000.0, "deploy", 1_700_000_900.0)


# HostLease judges staleness by this machine's clock (time.time()), so owners are dated from it.
def other(host: str = "other-host", until_in_s: float = 600.0) -> LeaseOwner:
    now = time.time()
    return LeaseOwner(host, 4242, now - 10, "deploy", now + until_in_s)


def held_by(host: FakeHost, owner_json: str, age_s: float = 0.0) -> None:
    host.dirs[PATHS.base] = host.now
    host.dirs[LOCK] = host.now - age_s
    host.files[f"{LOCK}/owner.json"] = owner_json


def test_free_lock_taken_and_released_with_exact_commands() -> None:
    host = FakeHost()
    with HostLease(host, PATHS, ME, ttl_s=900) as lock:
        assert host.files[f"{LOCK}/owner.json"] == ME.to_json()
        assert lock.broke is None
    assert host.commands == [
        sh_argv(ACQUIRE_SCRIPT, LOCK, ME.to_json()),
        sh_argv(RELEASE_SCRIPT, LOCK, ME.to_json()),
    ]
    assert LOCK not in host.dirs and f"{LOCK}/owner.json" not in host.files


def test_live_owner_refused_and_nothing_changed() -> None:
    host = FakeHost()
    held_by(host, other().to_json())
    before = (dict(host.files), dict(host.dirs))
    with pytest.raises(LeaseHeld, match="another deploy holds the host lease"), HostLease(host, PATHS, ME, ttl_s=900):
        pytest.fail("must not enter")
    assert (host.files, host.dirs) == before
    assert host.commands == [sh_argv(ACQUIRE_SCRIPT, LOCK, ME.to_json())]


def test_expired_owner_broken_then_taken() -> None:
    host = FakeHost()
    stale = other(until_in_s=-1.0)
    held_by(host, stale.to_json())
    with HostLease(host, PATHS, ME, ttl_s=900) as lock:
        assert lock.broke == stale
        assert host.files[f"{LOCK}/owner.json"] == ME.to_json()
    assert host.commands[0] == sh_argv(ACQUIRE_SCRIPT, LOCK, ME.to_json())
    assert host.commands[1][:6] == sh_argv(BREAK_SCRIPT, LOCK, stale.to_json())
    assert host.commands[1][6].isdigit() and len(host.commands[1]) == 7  # the break stamp
    assert host.commands[2] == sh_argv(ACQUIRE_SCRIPT, LOCK, ME.to_json())
    kept = [d for d in host.dirs if d.startswith(LOCK + ".stale.")]
    assert len(kept) == 1 and host.files[f"{kept[0]}/owner.json"] == stale.to_json()


def test_ownerless_lock_broken_only_when_old() -> None:
    young = FakeHost()
    held_by(young, "", age_s=5)
    with pytest.raises(LeaseHeld, match="an owner still writing its name"), HostLease(young, PATHS, ME, ttl_s=900):
        pass
    assert young.commands == [sh_argv(ACQUIRE_SCRIPT, LOCK, ME.to_json()), sh_argv(LEASE_AGE_SCRIPT, LOCK)]

    old = FakeHost()
    held_by(old, "", age_s=120)
    with HostLease(old, PATHS, ME, ttl_s=900) as lock:
        assert lock.broke is not None and lock.broke.pid == 0
    assert old.files.get(f"{LOCK}/owner.json") is None  # released


def test_connection_lost_while_acquiring_propagates() -> None:
    host = FakeHost()
    host.drop_on(1)
    with pytest.raises(ConnectionLost), HostLease(host, PATHS, ME, ttl_s=900):
        pass


def test_fake_rejects_commands_it_does_not_model() -> None:
    with pytest.raises(UnknownCommand):
        FakeHost().run(["systemctl", "frobnicate"])


def test_state_round_trips_through_the_fake_with_exact_commands() -> None:
    from stackbuild.host.state import HostState, read_state, render_state, write_state

    host = FakeHost()
    assert read_state(host, PATHS) == HostState(service="svc")  # no file yet: empty state
    state = HostState(service="svc", last_verdict="pass", last_image="img@sha256:" + "a" * 64)
    write_state(host, PATHS, state)
    assert host.files[PATHS.state_file] == render_state(state)
    assert read_state(host, PATHS) == state
    read = sh_argv('[ ! -e "$1" ] || cat "$1"', PATHS.state_file)
    assert host.commands == [read, ["mkdir", "-p", PATHS.base], ["<put>", PATHS.state_file, "0644"], read]


def test_unit_install_start_stop_remove_against_the_fake() -> None:
    from stackbuild.host import units

    img = "127.0.0.1:5000/svc@sha256:" + "c" * 64
    host = FakeHost(images={img}, servers={img: SERVES})
    unit_path = PATHS.unit_path(PATHS.main_unit)
    with pytest.raises(InfraError, match=r"start svc\.service"):
        units.start(host, PATHS.main_unit)  # not installed: systemctl start fails, check=True raises
    host.dirs["/srv"] = host.now
    host.files["/srv/staged.service"] = (
        "[Service]\nExecStart=/usr/bin/docker run --rm --name svc --network host "
        f"--label dev.stackbuild.unit=svc {img} stackbuild sim --port 31000\n"
    )
    host.commands.clear()
    units.install(host, "/srv/staged.service", unit_path)
    units.start(host, PATHS.main_unit)
    assert units.is_active(host, PATHS.main_unit)
    units.stop(host, PATHS.main_unit)
    assert not units.is_active(host, PATHS.main_unit)
    units.remove(host, PATHS.main_unit, unit_path)
    assert unit_path not in host.files and host.daemon_reloads == 2
    assert host.commands == [
        sh_argv(units.INSTALL_SCRIPT, "/srv/staged.service", unit_path),
        ["systemctl", "reset-failed", "svc.service"],
        ["systemctl", "start", "svc.service"],
        ["systemctl", "is-active", "svc.service"],
        ["systemctl", "stop", "svc.service"],
        ["systemctl", "is-active", "svc.service"],
        sh_argv(units.REMOVE_SCRIPT, "svc.service", unit_path),
    ]


def test_ensure_image_pulls_once_and_a_failed_pull_changes_nothing() -> None:
    from stackbuild.host import units

    img = "127.0.0.1:5000/svc@sha256:" + "b" * 64
    host = FakeHost(registry={img})
    assert units.ensure_image(host, img, timeout=60) is True
    assert units.ensure_image(host, img, timeout=60) is False
    inspect = ["docker", "image", "inspect", "--format", "{{.Id}}", img]
    assert host.commands == [inspect, ["docker", "pull", "--quiet", img], inspect]

    empty = FakeHost()
    with pytest.raises(InfraError, match="cannot pull"):
        units.ensure_image(empty, img, timeout=60)
    assert empty.images == set()


def test_broken_locks_do_not_pile_up_and_status_shows_an_ownerless_one() -> None:
    from stackbuild.host.converge import status

    host = FakeHost()
    host.dirs[LOCK + ".stale.1"] = host.now - 3600  # the one an earlier break kept
    host.files[LOCK + ".stale.1/owner.json"] = ""
    held_by(host, "", age_s=120)
    assert "LOCKED: an owner that wrote no name" in status(host, PATHS).render(host.address)
    with HostLease(host, PATHS, ME, ttl_s=900) as lock:
        assert lock.broke is not None and lock.broke.what == "a lock with no owner written"
    kept = [d for d in host.dirs if d.startswith(LOCK + ".stale.")]
    assert len(kept) == 1 and kept[0] != LOCK + ".stale.1" and LOCK + ".stale.1/owner.json" not in host.files
    assert "LOCKED" not in status(host, PATHS).render(host.address)


def test_two_runs_of_one_process_never_break_each_other_s_lock() -> None:
    """Issue #29: a rollout's threads share the pid; a lease its other thread took 0.18 s ago was broken
    as stale. The owner is the run (rollout/host), so the second is refused; the first's own run (its
    recovery after a lost connection) may still take it back."""
    host = FakeHost()
    first = LeaseOwner(socket.gethostname(), os.getpid(), time.time(), "deploy", time.time() + 600, run="r1/a")
    second = LeaseOwner(socket.gethostname(), os.getpid(), time.time(), "deploy", time.time() + 600, run="r1/b")
    with HostLease(host, PATHS, first, ttl_s=900):
        with pytest.raises(LeaseHeld, match=r"another deploy holds the host lease \(deploy \(r1/a\) by pid"), \
                HostLease(host, PATHS, second, ttl_s=900):
            pytest.fail("must not enter")
        assert host.files[f"{LOCK}/owner.json"] == first.to_json()
        assert not any(d.startswith(LOCK + ".stale.") for d in host.dirs)
        again = LeaseOwner(first.host, first.pid, time.time(), "recover", None, run="r1/a")
        with HostLease(host, PATHS, again, ttl_s=900) as lock:
            assert lock.broke == first
