"""The gateway (smg) as a unit on its host: preflight of its ports, its unit brought up to date, its pool file.

Like a server's release, the gateway runs from an image pulled by digest, as an enabled unit
in /etc/systemd/system (it starts on boot), under a lease of its own. Unlike a release it has
no candidate: a changed unit (another image, another setting) is installed and restarted in
place -- smg lets its in-flight requests finish first (`--shutdown-grace-period-secs`), and
new connections are refused for the seconds it takes to come back. An unchanged one is left
alone. Which servers it starts with is its pool file (render/gateway.py), edited here one URL
at a time under a host-side lease (flock), so concurrent deploys of several hosts behind one
gateway never lose each other's edits. Its record (image, port) lets `status --host` find it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError

from stackbuild.effects import http
from stackbuild.effects.gateway import Gateway, Worker
from stackbuild.effects.readiness import Pace
from stackbuild.errors import InfraError
from stackbuild.host import secrets, units
from stackbuild.host.preflight import TCP_SCRIPT, Check, parse_listening_ports
from stackbuild.host.ssh import READ_IF_EXISTS_SCRIPT, Remote, sh_argv
from stackbuild.host.state import HostLease, HostPaths, me, now_iso
from stackbuild.host.unit_probe import boot_facts
from stackbuild.render.gateway import (
    KEY_VAR,
    POOL_HEADER,
    POOL_VAR,
    key_file,
    pool_file,
    render_gateway_unit,
    secrets_file,
)
from stackbuild.spec.gateway import Gateway as GatewaySpec
from stackbuild.spec.stack import Stack

# The pool file edited in place under flock: "+URL" adds, "-URL" removes; every other URL is kept
# in its order, none twice; written to a temp name and renamed (a reader sees the old or the new).
POOL_SCRIPT = (
    'f=$1; shift; mkdir -p -m 0700 "$(dirname "$f")" && exec 9>>"$f.lock" && flock -w 60 9 || exit 3\n'
    f'cur=$(sed -n \'s/^{POOL_VAR}="\\(.*\\)"$/\\1/p\' "$f" 2>/dev/null); new=\n'
    'for u in $cur; do keep=1; for a in "$@"; do [ "$a" = "-$u" ] || [ "$a" = "+$u" ] && keep=; done\n'
    '  [ -n "$keep" ] && new="$new $u"; done\n'
    'for a in "$@"; do case $a in +*) new="$new ${a#+}";; esac; done\n'
    f'printf \'%s\\n{POOL_VAR}="%s"\\n\' "{POOL_HEADER}" "${{new# }}" > "$f.tmp" && chmod 0644 "$f.tmp" '
    '&& mv -f "$f.tmp" "$f"'
)


# The control-plane key: made on the gateway's host, never on this machine, never sent anywhere but to the
# gateway (`Authorization: Bearer`). The file is one line, KEY_VAR=<64 hex digits>, what `docker run
# --env-file` reads. "create" makes it once (32 random bytes; under flock, born 0600 by umask, renamed
# into place; "new" on a line first) and keeps it 0600; then, either way, the key is printed for the
# caller -- the only other output, and only on success (a failure's output carries no key).
KEY_SCRIPT = (
    'f=$1; v=$3\n'
    'if [ "$2" = create ]; then umask 077; mkdir -p -m 0700 "$(dirname "$f")" && exec 9>>"$f.lock" '
    '&& flock -w 60 9 || exit 3\n'
    '  grep -q "^$v=[0-9a-f]\\{64\\}$" "$f" 2>/dev/null || { printf "%s=%s\\n" "$v" '
    '"$(od -An -N32 -tx1 /dev/urandom | tr -d " \\n")" > "$f.tmp" && mv -f "$f.tmp" "$f" && echo new; } || exit 3\n'
    '  chmod 0600 "$f" || exit 3; fi\n'
    '[ -s "$f" ] && sed -n "s/^$v=//p" "$f"'
)


def control_key(remote: Remote, service: str, *, create: bool) -> str | None:
    """The gateway's control-plane key on its host, made there first when `create` (None: there is none)."""
    return _key(remote, service, create=create)[0]


def _key(remote: Remote, service: str, *, create: bool) -> tuple[str | None, bool]:
    """(the key or None, whether it was made just now)."""
    res = remote.run(sh_argv(KEY_SCRIPT, key_file(service), "create" if create else "read", KEY_VAR), check=False,
                     what="the gateway's control-plane key", changes=create)
    if create and not res.ok:
        raise InfraError(f"{remote.address}: cannot make the gateway's control-plane key {key_file(service)} "
                         f"(exit {res.returncode}); check that root can write {secrets.ENV_DIR}")
    lines = res.stdout.split() if res.ok else []
    made = lines[:1] == ["new"]
    return (lines[-1] if lines and lines[-1] != "new" else None), made


class GatewayRecord(BaseModel):
    """What runs as the gateway on this host (for `status --host`, which has no stack to read it from)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    service: str
    image: str
    port: int
    stack: str
    at: str


def gateway_paths(stack: Stack) -> HostPaths:
    """Its lease and record under <state_dir>/.gateway/<service>/: out of the servers' list (`ls` skips dot dirs)."""
    gw = _spec(stack)
    return HostPaths(f"{stack.host.state_dir.rstrip('/')}/.gateway", gw.service)


def unit_name(gw: GatewaySpec) -> str:
    return f"{gw.service}.service"


def _spec(stack: Stack) -> GatewaySpec:
    if stack.gateway is None:
        raise ValueError(f"{stack.label} has no gateway: section")
    return stack.gateway


def edit_pool(remote: Remote, gw: GatewaySpec, add: list[str], remove: list[str]) -> None:
    """The pool file on the gateway's host with `add` in it and `remove` out of it."""
    if add or remove:
        edits = [f"-{u}" for u in remove] + [f"+{u}" for u in add]
        remote.run(sh_argv(POOL_SCRIPT, pool_file(gw), *edits), what="edit the gateway's pool file")


def read_pool(remote: Remote, gw: GatewaySpec | str) -> str | None:
    res = remote.run(sh_argv(READ_IF_EXISTS_SCRIPT, pool_file(gw)), what="read the gateway's pool file",
                     changes=False)
    return res.stdout or None


def checks(remote: Remote, stack: Stack) -> list[Check]:
    """Preflight of the gateway's host: its ports free, or held by the gateway unit itself."""
    gw = _spec(stack)
    ours = units.is_active(remote, unit_name(gw))
    tcp = remote.run(sh_argv(TCP_SCRIPT), check=False, what="listening ports", changes=False)
    busy = parse_listening_ports(tcp.stdout)
    out = []
    for what, port in (("gateway.port", gw.port), ("gateway.metrics_port", gw.metrics_port)):
        if port not in busy:
            out.append(Check("gateway port", True, f"port {port} is free"))
        elif ours:
            out.append(Check("gateway port", True, f"port {port} is held by {unit_name(gw)}"))
        else:
            out.append(Check("gateway port", False, f"port {port} ({what}) is in use by another process: free it "
                                                    f"or change {what}"))
    if gw.api_keys:
        have = secrets.names_in(secrets.read(remote, secrets_file(gw)))
        missing = [n for n in gw.api_keys if n not in have]
        out.append(Check("gateway keys", not missing, f"{secrets_file(gw)} sets gateway.api_keys" if not missing else
                         f"gateway.api_keys: {', '.join(missing)} not set in {secrets_file(gw)} on "
                         f"{remote.address}; write NAME=\"VALUE\" lines there (mode 0600)"))
    return out


def ensure(remote: Remote, stack: Stack, image: str, workers: list[str], *, pull_timeout_s: float) -> str:
    """The gateway unit runs `image` with the spec's settings, enabled; `workers` are its pool when it has
    none yet (a first install). Returns what it did."""
    gw = _spec(stack)
    gp, unit = gateway_paths(stack), unit_name(gw)
    with HostLease(remote, gp, me(f"gateway {gw.service}", pull_timeout_s + 600)):
        if failed := [c.detail for c in checks(remote, stack) if not c.ok]:
            raise InfraError(f"{remote.address}: cannot run the gateway there: {'; '.join(failed)}")
        pulled = units.ensure_image(remote, image, pull_timeout_s)
        _, made = _key(remote, gw.service, create=True)  # before the unit: it reads the file at every start
        if not units.existing(remote, pool_file(gw)):
            edit_pool(remote, gw, workers, [])
        text = render_gateway_unit(stack, image=image)
        boot = boot_facts(remote, unit)
        if units.installed_text(remote, gp.unit_path(unit)) == text and boot.active == "active" and not made:
            if boot.enabled != "enabled":
                units.enable(remote, unit)
            return f"{unit} runs {image.rsplit('@', 1)[-1][:19]} (unchanged)"
        staged = units.stage_and_verify(remote, gp.staging_dir, unit, text)
        units.install(remote, staged, gp.unit_path(unit))
        units.enable(remote, unit)
        units.stop(remote, unit)  # a changed gateway: smg finishes what is in flight, then exits
        units.start(remote, unit)
        record = GatewayRecord(service=gw.service, image=image, port=gw.port, stack=stack.name, at=now_iso())
        remote.run(["mkdir", "-p", gp.base], what="create the gateway's state dir")
        remote.put_text(record.model_dump_json(indent=2) + "\n", gp.state_file)
        return f"{unit} {'started' if boot.active != 'active' else 'restarted'} with {image}" + (
            " (pulled)" if pulled else "")


def wait_answering(api: Gateway, timeout_s: float, pace: Pace | None = None) -> list[Worker]:
    """Until the gateway answers GET /workers (it binds its port a second or two after its start)."""
    p = pace or api.pace
    t0 = p.clock()
    while True:
        try:
            return api.workers()
        except http.HttpFailure as err:
            if p.clock() - t0 >= timeout_s:
                raise InfraError(f"the gateway at {api.url} does not answer after {timeout_s:.0f}s ({err}); "
                                 "see `journalctl -u` of its unit on its host") from None
        p.sleep(p.interval_s)


RECORDS_SCRIPT = 'for f in "$1"/*/state.json; do [ -f "$f" ] && { cat "$f"; echo; echo ---; }; done; true'


def records(remote: Remote, state_dir: str) -> list[GatewayRecord]:
    """The gateways stackbuild runs on this host."""
    res = remote.run(sh_argv(RECORDS_SCRIPT, f"{state_dir.rstrip('/')}/.gateway"), check=False,
                     what="look for gateways", changes=False)
    out = []
    for doc in res.stdout.split("\n---\n"):
        try:
            if doc.strip():
                out.append(GatewayRecord.model_validate_json(doc))
        except ValidationError:
            continue
    return out


def describe(workers: list[Worker], names: dict[str, str] | None = None, ours: set[str] | None = None) -> list[str]:
    """One line a worker: its URL (and the host it is, when known), its state, what it has in flight; one
    stackbuild did not put there (not in `ours`, the pool file's URLs) is said to be so."""
    names = names or {}
    odd = ", NOT put there by stackbuild (not in its pool file; `deploy --prune-workers` removes it)"
    return [f"    {w.url}{' (' + names[w.url] + ')' if w.url in names else ''}: {w.status}"
            f"{'' if w.healthy else ', unhealthy'}, {w.load} in flight"
            f"{odd if ours is not None and w.url not in ours else ''}" for w in workers] or ["    (no workers)"]
