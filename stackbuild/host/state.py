"""Host state and the host lease: where they live, their format, the commands that touch them.

One JSON file per service on the host holds what runs (current), what ran
before (previous), the last verdict, and a `pending` marker while a deploy or
rollback is under way. It is only ever replaced whole (temp file + rename), so
a crash leaves the old state or the new one. The marker is what makes a re-run
converge: whoever takes the lease next first puts the host back to `current`.

The lease is a directory (mkdir is atomic) holding owner.json. Its owner is a run
(one deploy, or one host of one rollout: `LeaseOwner.run`), not a process: the
threads of a rollout share a pid and never break each other's locks. A lease
whose owner process is gone (same machine, dead pid), that its own run left
behind (a connection lost mid-deploy, taken back by that run's recovery), or
that is older than its TTL is stale and may be broken, by renaming it away only
if it still holds the owner we judged stale.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from stackbuild.errors import InfraError, InputError
from stackbuild.host.ssh import READ_IF_EXISTS_SCRIPT, Remote, sh_argv


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


Slot = Literal["main", "staging"]


class Release(_Frozen):
    """One image running as the service: what is needed to put it back exactly."""

    image: str  # pinned reference, REPO@sha256:...
    digest: str
    stack: str
    variant: str | None = None
    unit: str  # the unit file text it ran with
    port: int
    verdict: str | None = None  # gate verdict it was promoted with ("first" bars-only included)
    at: str  # ISO 8601 UTC of promotion
    # which of the service's two units runs it: "main" (<service>.service) or "staging"
    # (<service>-candidate.service), where a side-by-side promotion through the gateway
    # commits a candidate without restarting it (docs/host-lifecycle.md, "Two units")
    slot: Slot = "main"

    @property
    def key(self) -> str:
        return release_key(self.digest, self.unit)


def release_key(digest: str, unit: str) -> str:
    """What a measured result belongs to: the image and the exact command line (unit)."""
    return hashlib.sha256(f"{digest}\n{unit}".encode()).hexdigest()[:16]


class Pending(_Frozen):
    op: Literal["deploy", "rollback"]
    image: str
    strategy: str
    owner: str
    started_at: str


class HostState(_Frozen):
    service: str
    current: Release | None = None
    previous: Release | None = None
    last_verdict: str | None = None
    last_cause: str | None = None
    last_image: str | None = None
    last_at: str | None = None
    pending: Pending | None = None

    @property
    def slot(self) -> Slot:
        """The unit the committed release runs as (the main unit when nothing is deployed)."""
        return self.current.slot if self.current else "main"


def other(slot: Slot) -> Slot:
    return "staging" if slot == "main" else "main"


@dataclass(frozen=True)
class HostPaths:
    """Every path the deploy touches on the host, derived from state_dir and service."""

    state_dir: str
    service: str
    unit_dir: str = "/etc/systemd/system"  # the committed main unit, enabled (units.py says why where)
    runtime_dir: str = "/run/systemd/system"  # candidate and switch units: gone on reboot
    override_dir: str = "/run/systemd/system.control"  # the main unit running a release under test

    @property
    def base(self) -> str:
        return f"{self.state_dir.rstrip('/')}/{self.service}"

    @property
    def state_file(self) -> str:
        return f"{self.base}/state.json"

    @property
    def lease_dir(self) -> str:
        return f"{self.base}/lock"

    @property
    def staging_dir(self) -> str:
        return f"{self.base}/staging"

    def result_file(self, key: str) -> str:
        return f"{self.base}/results/{key}.json"

    @property
    def main_unit(self) -> str:
        return f"{self.service}.service"

    @property
    def candidate_unit(self) -> str:
        return f"{self.service}-candidate.service"

    def unit_path(self, unit: str) -> str:
        return f"{self.unit_dir}/{unit}"

    @property
    def main_path(self) -> str:
        return self.unit_path(self.main_unit)

    @property
    def override_path(self) -> str:
        return f"{self.override_dir}/{self.main_unit}"

    @property
    def candidate_paths(self) -> tuple[str, ...]:
        """Where the candidate unit is (/run), then where earlier stackbuild versions left it (/etc)."""
        return f"{self.runtime_dir}/{self.candidate_unit}", self.unit_path(self.candidate_unit)

    def unit_of(self, slot: Slot) -> str:
        """The unit a release in `slot` runs as (its container has the unit's name)."""
        return self.main_unit if slot == "main" else self.candidate_unit

    def runs_from(self, slot: Slot, *, serving: bool) -> str:
        """Where a release under test in `slot` runs from, in /run (gone on a reboot): the serving
        unit's override (read before its committed file in /etc), or the free unit's own file."""
        unit = self.unit_of(slot)
        return f"{self.override_dir}/{unit}" if serving else f"{self.runtime_dir}/{unit}"

    def files_of(self, slot: Slot) -> tuple[str, ...]:
        """Every place a unit file of `slot` may be: /run's two (under test), then /etc's (committed)."""
        unit = self.unit_of(slot)
        return f"{self.override_dir}/{unit}", f"{self.runtime_dir}/{unit}", self.unit_path(unit)

    @property
    def switch_unit(self) -> str:
        return f"stackbuild-switch-{self.service}.service"

    @property
    def switch_paths(self) -> tuple[str, ...]:
        return f"{self.runtime_dir}/{self.switch_unit}", self.unit_path(self.switch_unit)


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_state(text: str, service: str, where: str) -> HostState:
    if not text.strip():
        return HostState(service=service)
    try:
        return HostState.model_validate_json(text)
    except ValidationError as err:
        raise InfraError(
            f"{where}: host state file is not valid ({err.error_count()} problems); "
            "inspect it, fix or move it aside, then re-run"
        ) from None


def render_state(state: HostState) -> str:
    return state.model_dump_json(indent=2) + "\n"


def read_state(remote: Remote, paths: HostPaths) -> HostState:
    res = remote.run(
        sh_argv(READ_IF_EXISTS_SCRIPT, paths.state_file),
        what="read host state",
        changes=False,
    )
    return parse_state(res.stdout, paths.service, f"{remote.address}:{paths.state_file}")


def write_state(remote: Remote, paths: HostPaths, state: HostState) -> None:
    remote.run(["mkdir", "-p", paths.base], what="create state dir")
    remote.put_text(render_state(state), paths.state_file, mode=0o644)


SERVICES_SCRIPT = 'ls -1 "$1" 2>/dev/null'


def only_service(remote: Remote, state_dir: str) -> str:
    """The service to act on when none is named: the one the host has state for."""
    res = remote.run(sh_argv(SERVICES_SCRIPT, state_dir), check=False, what="list services", changes=False)
    found = sorted(n for n in res.stdout.split() if n)
    if len(found) == 1:
        return found[0]
    if not found:
        raise InputError(f"{remote.address}: no stackbuild service under {state_dir}; nothing deployed there yet")
    raise InputError(f"{remote.address} has several services ({', '.join(found)}); pass --service NAME")


# --- the lease ---------------------------------------------------------------

# How long a lease whose owner cannot be judged (another machine, an older writer that set no
# `until`) counts as held. A killed run's lease is broken sooner, by its dead pid (`is_stale`).
LEASE_TTL_S = 4 * 3600.0

ACQUIRE_SCRIPT = (
    'mkdir -p "$(dirname "$1")" || exit 2\n'
    'if mkdir "$1" 2>/dev/null; then\n'
    '  printf "%s" "$2" > "$1/owner.json" && echo acquired; exit 0\n'
    "fi\n"
    'cat "$1/owner.json" 2>/dev/null; exit 3'
)
# Keeps the last broken lease for a look, and only that one: stale dirs must not pile up.
BREAK_SCRIPT = (
    '[ "$(cat "$1/owner.json" 2>/dev/null)" = "$2" ] && rm -rf "$1".stale.* && mv "$1" "$1.stale.$3"'
)
# Seconds since the lease dir was made (for an owner file still empty: the writer died in between).
LEASE_AGE_SCRIPT = 'echo $(( $(date +%s) - $(stat -c %Y "$1") ))'
# Writing owner.json takes milliseconds; a lease with none after this long lost its writer.
EMPTY_OWNER_STALE_S = 60.0
RELEASE_SCRIPT = (
    '[ ! -d "$1" ] || { [ "$(cat "$1/owner.json" 2>/dev/null)" = "$2" ] && rm -rf "$1"; }'
)
# The owner file when the lease is held (exit 0, possibly empty: its writer is still at it), exit 1 when not.
READ_LEASE_SCRIPT = '[ -d "$1" ] && cat "$1/owner.json" 2>/dev/null; [ -d "$1" ]'


@dataclass(frozen=True)
class LeaseOwner:
    host: str
    pid: int
    started: float  # epoch seconds
    what: str
    # epoch seconds by which the holder is done, every step bounded by its timeouts; a
    # lease past it is stale whatever TTL the reader assumes (None: an older writer)
    until: float | None = None
    # the run that holds it: a deploy's own id, or `ROLLOUT/HOST` for one host of a rollout ("": an
    # older writer). Only the same run may take its lease back while its process lives.
    run: str = ""

    def to_json(self) -> str:
        d: dict[str, object] = {"host": self.host, "pid": self.pid, "started": self.started, "what": self.what}
        if self.until is not None:
            d["until"] = self.until
        if self.run:
            d["run"] = self.run
        return json.dumps(d, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> LeaseOwner | None:
        try:
            d = json.loads(text)
            until = float(d["until"]) if d.get("until") is not None else None
            return LeaseOwner(str(d["host"]), int(d["pid"]), float(d["started"]), str(d["what"]), until,
                             str(d.get("run") or ""))
        except (ValueError, KeyError, TypeError):
            return None

    def describe(self, now: float) -> str:
        return (
            f"{self.what}{f' ({self.run})' if self.run else ''} by pid {self.pid} on {self.host}, "
            f"started {now - self.started:.0f}s ago"
        )


def read_lease(remote: Remote, paths: HostPaths) -> str | None:
    """The lease's owner.json as the host has it ("" while its writer is at it), or None when nobody holds it."""
    res = remote.run(sh_argv(READ_LEASE_SCRIPT, paths.lease_dir), check=False, what="read the host lease",
                     changes=False)
    return res.stdout.strip() if res.ok else None


def lease_holder(owner_json: str | None, now: float) -> str | None:
    """Who holds the lease, in words (None: nobody)."""
    if owner_json is None:
        return None
    owner = LeaseOwner.from_json(owner_json)
    if owner is not None:
        return owner.describe(now)
    return f"an owner it cannot read ({owner_json[:80]})" if owner_json else "an owner that wrote no name yet"


def me(what: str, hold_s: float | None = None, run: str = "") -> LeaseOwner:
    now = round(time.time(), 3)
    until = None if hold_s is None else round(now + hold_s, 3)
    return LeaseOwner(socket.gethostname(), os.getpid(), now, what, until, run)


def new_run() -> str:
    """A deploy's own run id (lease ownership): unique per invocation, shared by its recovery."""
    return f"d{secrets.token_hex(6)}"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_stale(
    owner: LeaseOwner | None,
    *,
    now: float,
    ttl_s: float,
    local_host: str,
    alive: Callable[[int], bool] = pid_alive,
    own_run: str = "",
) -> bool:
    """A lease is stale when its owner is provably gone, or it outlived any deploy.

    `own_run`: a lease this very run took over a connection that has since died is
    ours to take back (the recovery after a lost connection). Another run of this
    same process (a rollout's other thread) holds its lease while it lives: a pid
    alone never makes a lease ours.
    """
    if owner is None:
        return False  # being written right now, or unreadable: never guess
    if owner.host == local_host and ((own_run and owner.run == own_run) or not alive(owner.pid)):
        return True
    if owner.until is not None:
        return now > owner.until
    return now - owner.started > ttl_s


class HostLease:
    """`with HostLease(remote, paths, owner):` — held for one deploy or rollback."""

    def __init__(self, remote: Remote, paths: HostPaths, owner: LeaseOwner, ttl_s: float = LEASE_TTL_S) -> None:
        self.remote, self.paths, self.owner, self.ttl_s = remote, paths, owner, ttl_s
        self.broke: LeaseOwner | None = None

    def _empty_owner_age(self) -> float:
        res = self.remote.run(sh_argv(LEASE_AGE_SCRIPT, self.paths.lease_dir), check=False, what="lock age",
                              changes=False)
        text = res.stdout.strip()
        return float(text) if res.ok and text.lstrip("-").isdigit() else 0.0

    def __enter__(self) -> HostLease:
        for _ in range(2):
            res = self.remote.run(
                sh_argv(ACQUIRE_SCRIPT, self.paths.lease_dir, self.owner.to_json()),
                check=False,
                what="take the host lease",
            )
            if res.ok:
                return self
            if res.returncode != 3:
                raise InfraError(
                    f"cannot take the host lease {self.paths.lease_dir} on {self.remote.address}",
                    command=res.command,
                    returncode=res.returncode,
                    output=res.stdout + res.stderr,
                )
            holder = LeaseOwner.from_json(res.stdout)
            now = time.time()
            if holder is None and self._empty_owner_age() > EMPTY_OWNER_STALE_S:
                holder = LeaseOwner("?", 0, 0.0, "a lock with no owner written")
                self.remote.run(sh_argv(BREAK_SCRIPT, self.paths.lease_dir, res.stdout, str(int(now))), check=False,
                                what="break the ownerless host lease")
                self.broke = holder
                continue
            if not is_stale(holder, now=now, ttl_s=self.ttl_s, local_host=socket.gethostname(),
                            own_run=self.owner.run):
                who = holder.describe(now) if holder else "an owner still writing its name"
                raise LeaseHeld(
                    f"{self.remote.address}: another deploy holds the host lease ({who}); "
                    f"wait for it to finish, or if it is gone remove {self.paths.lease_dir}"
                )
            assert holder is not None
            self.remote.run(
                sh_argv(BREAK_SCRIPT, self.paths.lease_dir, res.stdout, str(int(now))),
                check=False,
                what="break the stale host lease",
            )
            self.broke = holder
        raise LeaseHeld(f"{self.remote.address}: lost the race for the host lease; re-run")

    def __exit__(self, *exc: object) -> None:
        self.remote.run(
            sh_argv(RELEASE_SCRIPT, self.paths.lease_dir, self.owner.to_json()),
            check=False,
            what="release the host lease",
        )


class LeaseHeld(InfraError):
    """Another live deploy holds the host lease."""
