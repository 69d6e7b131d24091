"""Put the host back to what its state file says runs (`current`), and rollback/status.

`to_current` is the one restore path: after a failed candidate, after an
interrupted run (a `pending` marker left behind), and for `stackbuild
rollback` (with `current` set to the previous release). It is idempotent: it
removes any candidate unit, reinstalls the current unit and image when the host
differs, starts it, checks that it serves, and only then clears `pending`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from stackbuild.effects.readiness import HttpProbe, Pace, Probe, wait_ready
from stackbuild.errors import InfraError, InputError
from stackbuild.host import secrets, units
from stackbuild.host.outcome import DeployReport
from stackbuild.host.pool import GatewayLink
from stackbuild.host.ssh import Remote
from stackbuild.host.state import (
    LEASE_TTL_S,
    HostLease,
    HostPaths,
    HostState,
    Pending,
    Slot,
    lease_holder,
    me,
    now_iso,
    other,
    read_lease,
    read_state,
    render_state,
    write_state,
)
from stackbuild.host.unit_probe import UnitProbe, boot_facts
from stackbuild.spec.stack import Stack


@dataclass
class Converger:
    endpoint: Callable[[int], AbstractContextManager[str]]
    report: DeployReport
    start_timeout_s: float = 300.0
    ready_timeout_s: float = 300.0
    http_probe: Callable[[str], Probe] = HttpProbe
    pace: Pace = field(default_factory=Pace)
    pull_timeout_s: float = 1800.0
    link: GatewayLink | None = None  # the gateway in front of the host: drained before a stop, joined once serving
    # False: what stops is still drained first, but the restored release is not joined here (a deploy's
    # recovery: its own gateway step brings the gateway up and the serving release in, after it)
    join: bool = True
    _down_since: float | None = None

    # Outages are timed on the poller's clock (monotonic; a fake one in tests), the clock
    # the readiness deadlines run on.
    def outage_begin(self) -> None:
        if self._down_since is None:
            self._down_since = self.pace.clock()

    def outage_end(self) -> None:
        if self._down_since is not None:
            self.report.outages.append((self._down_since, self.pace.clock()))
            self._down_since = None


def converger_for(
    stack: Stack,
    endpoint: Callable[[int], AbstractContextManager[str]],
    report: DeployReport,
    pull_timeout_s: float,
    *,
    http_probe: Callable[[str], Probe] = HttpProbe,
    pace: Pace | None = None,
) -> Converger:
    return Converger(
        endpoint=endpoint,
        report=report,
        http_probe=http_probe,
        pace=pace or Pace(),
        pull_timeout_s=pull_timeout_s,
        start_timeout_s=stack.runtime.start_timeout_s,
        ready_timeout_s=stack.runtime.ready_timeout_s,
    )


def to_current(remote: Remote, paths: HostPaths, state: HostState, conv: Converger) -> HostState:
    rep = conv.report
    staged: str | None = None
    # a dry run prints the host's commands; it sends the gateway nothing
    cur, slot, link = state.current, state.slot, None if remote.dry_run else conv.link
    # Behind a gateway the release comes back (and joins) before the service's other unit leaves, so
    # the pool is never empty (a rollback across units drops nothing); without one, the other unit
    # goes first, freeing its port and its GPUs.
    spare_first = link is None or cur is None
    with rep.step("restore") as st:
        said = _remove_spare(remote, paths, link, other(slot)) if spare_first else []
        units.remove(remote, paths.switch_unit, *paths.switch_paths)  # a switch whose client died
        # before the incumbent (re)starts: it reads the file it ran with, not the candidate's values
        secrets.restore(remote, paths)
        unit = paths.unit_of(slot)
        if cur is None:
            conv.outage_end()
            if link is not None:
                said.append(_leave(link, link.ports[slot]))
            units.remove(remote, unit, *paths.files_of(slot))
            st.detail = "no incumbent: candidate removed, nothing else was running"
        else:
            etc = paths.unit_path(unit)
            boot = boot_facts(remote, unit)
            installed = units.installed_text(remote, etc)
            if installed == cur.unit and boot.fragment == etc and boot.active == "active":
                st.detail = f"{unit} already runs {cur.image}"
                if boot.enabled != "enabled":
                    units.enable(remote, unit)
                    st.detail += f"; enabled it (it was {boot.enabled or 'not enabled'}: no start on boot)"
            else:
                if link is not None and boot.active == "active":  # what runs there now drains first
                    said.append(_leave(link, cur.port))
                # runs from the /run override until verified and committed, as a candidate does
                conv.outage_begin()
                units.stop(remote, unit)
                units.ensure_image(remote, cur.image, conv.pull_timeout_s)
                staged = f"{paths.staging_dir}/{unit}"
                remote.run(["mkdir", "-p", paths.staging_dir], what="create the staging dir")
                remote.put_text(cur.unit, staged)
                units.install(remote, staged, paths.runs_from(slot, serving=True))
                units.start(remote, unit)
                st.detail = f"reinstalled and started {cur.image}"
        st.detail += "".join(f"; {s}" for s in said if s)
    if cur is not None and not remote.dry_run:
        with rep.step("verify serving") as st, conv.endpoint(cur.port) as url:
            ready = wait_ready(
                UnitProbe(remote, paths.unit_of(slot), cur.port, conv.http_probe(url)),
                start_deadline_s=conv.start_timeout_s,
                ready_deadline_s=conv.ready_timeout_s,
                pace=conv.pace,
            )
            st.detail = f"{ready.stage}: {ready.detail}"
            if not ready.ok:
                raise InfraError(
                    f"{remote.address}: {cur.image} did not serve again after the restore "
                    f"({ready.detail}); check `journalctl -u {paths.unit_of(slot)}` on the host"
                )
        conv.outage_end()
    restored = state.model_copy(update={"pending": None})
    if staged is not None:
        commit(remote, paths, restored, staged)
    else:
        write_state(remote, paths, restored)
    if cur is not None and link is not None:
        t0 = time.monotonic()
        try:  # serving again: back into the gateway (a no-op when it never left)
            said, lost = [link.join(cur.port) if conv.join else ""], None
        except InfraError as err:  # the gateway gone (its unit stopped, say): not back in it
            said, lost = [], err
        # the candidate (or the release a rollback replaces) goes whatever the gateway says: a gateway that
        # does not answer must not leave a rejected build running
        said += _remove_spare(remote, paths, link, other(slot))
        if lost is not None:  # a failed step in the report (never silent), not an error: the host is restored
            said.insert(0, f"{cur.image.rsplit('@', 1)[-1][:19]} serves again but is NOT back in the gateway "
                           f"({str(lost).splitlines()[0][:200]}); the next deploy puts it back")
        rep.note("gateway", lost is None, "; ".join(s for s in said if s), time.monotonic() - t0)
    return restored


def _remove_spare(remote: Remote, paths: HostPaths, link: GatewayLink | None, spare: Slot) -> list[str]:
    """The service's other unit (a candidate, or the release a rollback replaces) out of the gateway, stopped
    and gone from every place its file may be."""
    said = [_leave(link, link.ports[spare])] if link is not None else []
    units.remove(remote, paths.unit_of(spare), *paths.files_of(spare))
    return said


def _leave(link: GatewayLink, port: int) -> str:
    """Drain what runs on `port` out of the gateway before a restore stops it; a gateway that does not
    answer (or a drain that does not end) does not keep the incumbent from coming back."""
    try:
        d = link.leave(port)
    except InfraError as err:
        return f"not drained from the gateway ({str(err).splitlines()[0][:160]})"
    return "" if d.detail.startswith("not in the gateway") else f"{d.url} drained ({d.detail})"


def commit(remote: Remote, paths: HostPaths, state: HostState, staged_unit: str, ran_from: str | None = None) -> None:
    """`state` becomes the host's and its current release (`staged_unit`) the enabled unit of its slot, in
    one host-side command (units.COMMIT_SCRIPT): the unit first, the state last, so a host that loses
    power in between still has the pending marker that makes the next run converge it. The service's
    other unit is disabled and its committed file removed (a boot starts one release), and the
    transaction's secrets files go with it: the operator's file now holds what runs. `ran_from`: the
    /run file the release ran from (default: its unit's override)."""
    slot = state.slot
    unit, spare = paths.unit_of(slot), paths.unit_of(other(slot))
    staged_state = f"{paths.staging_dir}/state.json"
    remote.put_text(render_state(state), staged_state)
    units.commit(remote, unit, (staged_unit, paths.unit_path(unit), ran_from or paths.runs_from(slot, serving=True)),
                 (staged_state, paths.state_file), spare, (paths.unit_path(spare), *secrets.transaction_files(paths)))


def settle(remote: Remote, paths: HostPaths, conv: Converger, lease_ttl_s: float = LEASE_TTL_S, run: str = "") -> str:
    """Before a rollout touches the host: what an interrupted run left there (its stale lease, its
    pending marker and the candidate it was running, a switch unit, the main unit's override) is
    put back to the committed state, as a single deploy does first. Returns what was done."""
    with HostLease(remote, paths, me("converge before a rollout", run=run), lease_ttl_s) as lock:
        state = read_state(remote, paths)
        done = [f"broke a stale lock ({lock.broke.what})"] if lock.broke else []
        if state.pending is not None:
            to_current(remote, paths, state, conv)
            done.append(f"put back an interrupted {state.pending.op} of {state.pending.image}")
        elif left := units.existing(remote, *paths.files_of(other(state.slot)), *paths.switch_paths,
                                    *paths.files_of(state.slot)[:2]):
            to_current(remote, paths, state, conv)
            done.append(f"removed what an interrupted run left: {', '.join(left)}")
    return "; ".join(done) or "nothing to converge"


def rollback(remote: Remote, paths: HostPaths, conv: Converger, lease_ttl_s: float = LEASE_TTL_S,
             run: str = "") -> HostState:
    """Make the previous release current again, verified serving."""
    rep = conv.report
    with HostLease(remote, paths, me("rollback", run=run), lease_ttl_s):
        state = read_state(remote, paths)
        if state.pending is not None:
            state = to_current(remote, paths, state, conv)
        if state.previous is None:
            raise InputError(
                f"{remote.address}: {paths.service} has no previous release to roll back to "
                "(see `stackbuild status --host ...`)"
            )
        assert state.current is not None
        pending = Pending(
            op="rollback",
            image=state.previous.image,
            strategy="swap",
            owner=me("rollback").to_json(),
            started_at=now_iso(),
        )
        write_state(remote, paths, state.model_copy(update={"pending": pending}))
        target = state.model_copy(
            update={
                "current": state.previous,
                "previous": state.current,
                "pending": pending,
                "last_verdict": "rollback",
                "last_cause": "manual rollback",
                "last_image": state.previous.image,
                "last_at": now_iso(),
            }
        )
        try:
            done = to_current(remote, paths, target, conv)
        except InfraError:
            to_current(remote, paths, state.model_copy(update={"pending": pending}), conv)
            raise
        rep.image = state.previous.image
        rep.finish("rolled-back", "manual rollback", 0)
        return done


@dataclass(frozen=True)
class HostStatus:
    state: HostState
    active: bool
    running_image: str | None
    lease_owner: str | None = None  # the host lease's owner.json, when a lease is held
    enabled: str = ""  # systemd's UnitFileState of the main unit: "enabled" starts it on boot
    under_test: bool = False  # its unit runs from a file in /run: a release not committed
    unit: str = ""  # the unit the committed release runs as
    gateways: tuple[str, ...] = ()  # lines on the gateways this host runs (host/gateway.py), when asked for

    @property
    def boot(self) -> str:
        if self.enabled == "enabled":
            return "enabled (starts on boot)"
        return f"{self.enabled or 'no unit file'}: does NOT start on boot"

    def render(self, address: str) -> str:
        s = self.state
        lines = [f"{address} {s.service}: {'active' if self.active else 'NOT active'}, {self.boot}"]
        if s.current:
            lines.append(
                f"  current:  {s.current.image} ({s.current.stack}"
                f"{'-' + s.current.variant if s.current.variant else ''}, "
                f"verdict {s.current.verdict}, since {s.current.at})"
            )
            lines.append(f"  serves:   port {s.current.port} ({self.unit or s.service + '.service'})")
        else:
            lines.append("  current:  none (nothing deployed)")
        if s.previous:
            lines.append(f"  previous: {s.previous.image} (since {s.previous.at})")
        if self.running_image:
            lines.append(f"  container runs image {self.running_image}"
                         + (" (a release under test, not committed)" if self.under_test else ""))
        if s.last_verdict:
            lines.append(
                f"  last deploy: {s.last_verdict} of {s.last_image} at {s.last_at}"
                + (f": {s.last_cause}" if s.last_cause else "")
            )
        if (who := lease_holder(self.lease_owner, time.time())) is not None:
            lines.append(f"  LOCKED: {who}")
        if s.pending:
            lines.append(
                f"  PENDING: interrupted {s.pending.op} of {s.pending.image} since "
                f"{s.pending.started_at}; the next deploy or rollback converges it"
            )
        return "\n".join([*lines, *self.gateways])


def status(remote: Remote, paths: HostPaths) -> HostStatus:
    state = read_state(remote, paths)
    unit = paths.unit_of(state.slot)  # the unit its committed release runs as
    boot = boot_facts(remote, unit)
    img = remote.run(units.container_image_argv(unit.removesuffix(".service")), check=False,
                     what="inspect the container", changes=False)
    return HostStatus(state, boot.active == "active", img.stdout.strip() if img.ok else None,
                      read_lease(remote, paths), boot.enabled, boot.fragment in paths.files_of(state.slot)[:2], unit)
