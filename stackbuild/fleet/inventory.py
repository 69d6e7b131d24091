"""Which hosts a rollout covers, and each host's view of the stack (its overrides applied).

Hosts come from the stack (`host.hosts`), from an inventory file (`host.inventory`
or `--inventory`), or from `--hosts a,b,c` (names from those, or addresses).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from stackbuild.errors import Finding, InputError, SpecError
from stackbuild.spec.addresses import clash_findings, placed
from stackbuild.spec.check import check_flags
from stackbuild.spec.fleet import Fleet, FleetHost, Inventory
from stackbuild.spec.kinds import SshTarget
from stackbuild.spec.load import control_char_findings, positions, read_located
from stackbuild.spec.stack import Stack
from stackbuild.spec.yamlpos import Located, Pos

_KEYS = {"hosts", "fleet", *FleetHost.model_fields, *Fleet.model_fields}


def load_inventory(path: Path) -> Inventory:
    """An inventory YAML file through the stack specs' boundary (size, UTF-8, YAML, control
    characters, kinds): every problem a file:line:col line (exit 2), before any host is touched."""
    return _load_inventory(path)[0]


def _load_inventory(path: Path) -> tuple[Inventory, Located]:
    loc = read_located(path, str(path), "inventory")
    problems = control_char_findings(loc.data, loc)
    seen = {(f.line, f.col) for f in problems}
    try:
        inv = Inventory.model_validate(loc.data if isinstance(loc.data, dict) else {"hosts": loc.data})
    except ValidationError as err:
        for e in err.errors():
            path_ = tuple(p for p in e["loc"] if isinstance(p, int) or str(p) in _KEYS or str(p).startswith("-"))
            if e["type"] == "extra_forbidden":
                path_ = (*path_, e["loc"][-1])
                pos = loc.keys.get(path_, loc.pos(path_))
                msg = "unknown key; remove it or fix its spelling"
            else:
                pos = loc.pos(path_)
                msg = e["msg"].removeprefix("Value error, ")
            what = ".".join(str(p) for p in path_) or "(top level)"
            if (pos.line, pos.col) not in seen:
                seen.add((pos.line, pos.col))
                problems.append(Finding(pos.file, pos.line, pos.col, "error", f"{what}: {msg}", "inventory"))
    if problems:
        raise SpecError(sorted(problems, key=lambda f: (f.line, f.col)))
    return inv, loc


def fleet_of(stack: Stack, inventory: Path | None = None) -> tuple[list[FleetHost], Fleet]:
    """The declared hosts and rollout policy: --inventory, else host.inventory, else host.hosts.

    Hosts that clash (the same machine and service twice, shared ports, a staging_port that is the
    port) are refused here, file:line:col (spec/addresses.py), before any host is touched."""
    path = inventory or (stack.root / stack.host.inventory if stack.host.inventory else None)
    rt = stack.runtime
    if path is not None:
        inv, loc = _load_inventory(path)
        top: tuple[str, ...] = ("hosts",) if isinstance(loc.data, dict) else ()
        hosts, fleet, where = list(inv.hosts), inv.fleet or stack.host.fleet, "hosts"

        def pos(i: int, key: str) -> Pos:
            return loc.pos((*top, i, key))
    else:
        spec = positions(stack)
        hosts, fleet, where = list(stack.host.hosts), stack.host.fleet, "host.hosts"

        def pos(i: int, key: str) -> Pos:
            return spec.pos(("host", "hosts", i, key))
    found = clash_findings(placed(hosts, stack.host.service, rt.port, rt.staging_port), pos, where)
    if found:
        raise SpecError(found)
    return hosts, fleet


def fleet_findings(stack: Stack) -> list[Finding]:
    """What `deploy --fleet` would refuse in the stack's fleet (host.hosts, or its host.inventory file),
    for `validate` to say first: none when the stack declares no fleet."""
    if not stack.host.hosts and not stack.host.inventory:
        return []
    try:
        fleet_of(stack)
    except SpecError as err:
        return list(err.findings)
    return []


def select(declared: list[FleetHost], wanted: list[str] | None, where: str) -> list[FleetHost]:
    """`--hosts a,b,c`: names of declared hosts keep their overrides; other words are addresses."""
    if not wanted:
        if not declared:
            raise InputError(f"{where}: no fleet: list hosts under host.hosts, point host.inventory at a "
                             "file, or pass --hosts a,b,c")
        _unique(declared, where)
        return declared
    by_name = {h.name: h for h in declared}
    chosen = [by_name.get(w) or _address_host(w) for w in wanted]
    _unique(chosen, where)
    return chosen


def check_chosen(stack: Stack, hosts: list[FleetHost]) -> None:
    """`--hosts` words that reach one machine twice (root@a and a), refused as the spec's own are."""
    rt = stack.runtime
    found = clash_findings(placed(hosts, stack.host.service, rt.port, rt.staging_port),
                           lambda i, key: Pos("--hosts", 1, 1), "--hosts")
    if found:
        raise InputError("\n".join(f"--hosts: {f.message}" for f in found))


def _address_host(word: str) -> FleetHost:
    """A `--hosts` word that names no declared host: an address, checked as the spec checks one."""
    try:
        address = TypeAdapter(SshTarget).validate_python(word)
    except ValidationError as err:
        why = err.errors()[0]["msg"].removeprefix("Value error, ")
        raise InputError(f"--hosts {word!r}: neither a host of the fleet nor an address: {why}") from None
    return FleetHost.model_construct(name=word, address=address, flags={})  # the row is named as typed


def _unique(hosts: list[FleetHost], where: str) -> None:
    seen: set[str] = set()
    for h in hosts:
        if h.name in seen:
            raise InputError(f"{where}: host {h.name!r} is listed twice; a host takes one place in the plan")
        seen.add(h.name)


def host_stack(stack: Stack, h: FleetHost) -> Stack:
    """The stack as this host runs it: its port, service, GPU count, driver and flags."""
    runtime = {k: v for k, v in {"port": h.port, "staging_port": h.staging_port, "gpus": h.gpus}.items()
               if v is not None}
    host = {"address": h.target} | {k: v for k, v in {"service": h.service, "driver": h.driver}.items() if v}
    server = {"flags": {**stack.server.flags, **h.flags}} if h.flags else {}
    return stack.model_copy(update={
        "runtime": stack.runtime.model_copy(update=runtime),
        "host": stack.host.model_copy(update=host),
        "server": stack.server.model_copy(update=server),
    })


def check_host_flags(stack: Stack, hosts: list[FleetHost], where: str) -> None:
    """Per-host flags pass the same flag check `validate` runs on server.flags, before any host
    is touched; every error is one line naming the host (exit 2)."""
    problems = []
    for h in hosts:
        if h.flags:
            for f in check_flags(host_stack(stack, h), offline=False):
                if f.severity == "error" and any(flag in f.message for flag in h.flags):
                    problems.append(f"{where}: error: host {h.name}: {f.message} [{f.rule}]")
    if problems:
        raise InputError("\n".join(problems))
