"""UnitProbe (systemd + the host's socket table) against the scripted FakeHost and its clock."""

from __future__ import annotations

from dataclasses import replace

from helpers_deploy import CANDIDATE, MAIN, PATHS, PORT, fake_host, unit_text

from stackbuild.effects.readiness import Readiness, wait_ready
from stackbuild.host import units
from stackbuild.host.ssh import sh_argv
from stackbuild.host.unit_probe import POLL_SCRIPT, UnitProbe
from stackbuild.testing.fake_host import NEVER_LISTENS, FakeHost, crashes

LOG = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


def started(host: FakeHost) -> None:
    host.dirs["/srv"] = host.now
    host.files["/srv/u.service"] = unit_text(CANDIDATE)
    units.install(host, "/srv/u.service", PATHS.unit_path(MAIN))
    units.start(host, MAIN)
    host.commands.clear()


class AlwaysOpen:
    """An HTTP side that would say yes to everything (a tunnel that accepts before the server listens)."""

    def crashed(self) -> str | None:
        return None

    def port_open(self) -> tuple[bool, str]:
        return True, ""

    def health(self) -> tuple[bool, str]:
        return True, "/health answered 200"

    def identity(self) -> str | None:
        return None

    def generate(self) -> tuple[bool, str]:
        return True, "generated 'x'"


def test_a_crash_between_polls_is_seen_at_the_next_poll() -> None:
    host = fake_host(candidate=replace(crashes(LOG, after_s=0.8), listens_after_s=0.5))
    started(host)
    probe = UnitProbe(host, MAIN, PORT, host.http_probe(f"http://127.0.0.1:{PORT}"))
    seen = []
    for _ in range(3):
        seen.append((probe.crashed(), probe.port_open()))
        host.sleep(0.5)
    assert seen == [
        (None, (False, f"port {PORT} not listening on the host")),
        (None, (True, "")),
        ("unit activating/auto-restart, result exit-code, exit status 1, restarts 0",
         (False, f"port {PORT} not listening on the host")),  # the port went with the process
    ]
    assert host.commands == [sh_argv(POLL_SCRIPT, MAIN)] * 3
    assert [ln for _, ln in host.journal[MAIN]][-3:] == [
        LOG, f"{MAIN}: Main process exited, code=exited, status=1/FAILURE", f"{MAIN}: Failed with result 'exit-code'."]


def test_the_port_is_the_hosts_socket_table_not_what_http_claims() -> None:
    host = fake_host(candidate=NEVER_LISTENS)
    started(host)
    host.strangers = {8080}
    probe = UnitProbe(host, MAIN, PORT, AlwaysOpen())
    assert probe.crashed() is None
    assert probe.port_open() == (False, f"port {PORT} not listening on the host")
    assert "0100007F:1F90 00000000:0000 0A" in host.socket_table()  # the stranger on 8080 is listed, ours is not


def test_wait_ready_on_the_fake_ends_at_the_crash_not_the_deadline() -> None:
    host = fake_host(candidate=replace(crashes(LOG, after_s=1.2), listens_after_s=None))
    started(host)
    ready = wait_ready(UnitProbe(host, MAIN, PORT, host.http_probe(f"http://127.0.0.1:{PORT}")),
                       start_deadline_s=60, ready_deadline_s=60, pace=host.pace(0.5))
    assert ready == Readiness(False, "crashed", "unit activating/auto-restart, result exit-code, exit status 1, "
                              "restarts 0", 1.5, {})


def test_a_unit_without_restart_fails_for_good() -> None:
    host = fake_host(candidate=crashes(LOG))
    host.dirs["/srv"] = host.now
    host.files["/srv/u.service"] = unit_text(CANDIDATE).replace("Restart=on-failure\n", "")
    units.install(host, "/srv/u.service", PATHS.unit_path(MAIN))
    units.start(host, MAIN)
    probe = UnitProbe(host, MAIN, PORT, host.http_probe(f"http://127.0.0.1:{PORT}"))
    assert probe.crashed() == "unit failed/failed, result exit-code, exit status 1, restarts 0"
    assert not units.is_active(host, MAIN)
