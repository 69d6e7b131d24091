"""The FakeHost stays honest: it refuses what it does not model and behaves as systemd and a shell do."""

from __future__ import annotations

import pytest
from helpers_deploy import CANDIDATE, INCUMBENT, MAIN, PATHS, PORT, fake_host, unit_text

from stackbuild.host import units
from stackbuild.host.ssh import ConnectionLost, sh_argv
from stackbuild.testing.fake_host import FakeHost, UnknownCommand


def staged(host: FakeHost, text: str, path: str = "/srv/u.service") -> str:
    host.dirs["/srv"] = host.now
    host.files[path] = text
    return path


def test_a_script_changed_by_one_character_is_unknown() -> None:
    with pytest.raises(UnknownCommand, match="does not model this script"):
        FakeHost().run(sh_argv(units.REMOVE_SCRIPT.replace("; true", ";true"), MAIN, PATHS.unit_path(MAIN)))


def test_an_image_without_a_behaviour_is_unknown() -> None:
    host = FakeHost(images={CANDIDATE})
    units.install(host, staged(host, unit_text(CANDIDATE)), PATHS.unit_path(MAIN))
    with pytest.raises(UnknownCommand, match="no Behaviour scripted"):
        units.start(host, MAIN)


def test_systemd_starts_the_unit_it_loaded_not_a_file_written_since() -> None:
    host = fake_host()
    host.images |= {INCUMBENT, CANDIDATE}
    units.install(host, staged(host, unit_text(INCUMBENT)), PATHS.unit_path(MAIN))
    host.files[PATHS.unit_path(MAIN)] = unit_text(CANDIDATE)  # no daemon-reload after
    units.start(host, MAIN)
    assert host.running[MAIN].image == INCUMBENT


def test_a_second_server_on_a_held_port_dies_with_eaddrinuse() -> None:
    host = fake_host()
    host.images |= {INCUMBENT, CANDIDATE}
    units.install(host, staged(host, unit_text(INCUMBENT)), PATHS.unit_path(MAIN))
    units.start(host, MAIN)
    host.now += 2.0  # it listens
    other = PATHS.unit_path("other.service")
    units.install(host, staged(host, unit_text(CANDIDATE, name="other"), "/srv/o.service"), other)
    units.start(host, "other.service")
    # it loads first (the incumbent still answers on the port), and dies where it binds it
    assert host.state_of("other.service") == "active" and host.serving(PORT) == INCUMBENT
    host.now += 2.0
    host.run(["date", "+%s"])
    assert host.state_of("other.service") == "activating" and host.serving(PORT) == INCUMBENT
    assert [ln for _, ln in host.journal["other.service"]][-3] == "OSError: [Errno 98] Address already in use"


def test_a_lost_connection_stays_lost_until_a_new_one() -> None:
    host = FakeHost()
    host.drop_on(1)
    with pytest.raises(ConnectionLost):
        host.run(["date", "+%s"])
    with pytest.raises(ConnectionLost):
        host.run(["date", "+%s"])
    assert host.reconnect().run(["date", "+%s"]).stdout == f"{int(host.now)}\n"
    assert host.connections == 2


def test_a_scripted_failure_answers_once_then_the_host_answers() -> None:
    host = FakeHost()
    host.fail_when(lambda a: a == ["date", "+%s"], rc=1, stderr="date: boom")
    assert host.run(["date", "+%s"], check=False).returncode == 1
    assert host.run(["date", "+%s"]).ok
