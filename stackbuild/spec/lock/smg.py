"""What `validate` checks of a stack's gateway, and its hash lock (resolved with the stack lock's own uv path).

The gateway runs `smg` from a lock of its own: smg's whole closure for the gateway
image's python and glibc, every file pinned by sha256. The lock's name carries those
inputs (`stacks/locks/gateway/smg-1.13.0-py3.11-x86_64-manylinux_2_36.txt`), so stacks
with the same gateway share one file.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from stackbuild.errors import Finding, InputError
from stackbuild.spec.gateway import Gateway
from stackbuild.spec.load import positions
from stackbuild.spec.lock import resolve
from stackbuild.spec.lock.target import DISTROS, PYPI, Target, distro_of
from stackbuild.spec.stack import Stack

LOCK_DIR = Path("stacks") / "locks" / "gateway"


def gateway_target(gw: Gateway) -> Target | None:
    """smg for the gateway image's python and glibc (from its Debian/Ubuntu base); None if unknown."""
    d = distro_of(gw.base_image)
    if d is None:
        return None
    glibc = DISTROS[d].glibc
    return Target(
        python=DISTROS[d].pythons[0],
        platform=f"x86_64-manylinux_{glibc[0]}_{glibc[1]}",
        requirements=(f"smg=={gw.version}",),
        source_built=(),
        index_url=PYPI,
        extra_index_urls=(),
        exclude_newer=gw.exclude_newer,
        constraints=(),
    )


def lock_name(t: Target) -> str:
    return f"smg-{t.requirements[0].split('==', 1)[1]}-py{t.python}-{t.platform}.txt"


def lock_path(stack: Stack) -> Path | None:
    t = gateway_target(stack.gateway) if stack.gateway else None
    return stack.root / LOCK_DIR / lock_name(t) if t else None


def lock_command(stack: Stack) -> str:
    return f"stackbuild lock {stack.name} --gateway"


def lock_text(stack: Stack) -> str | None:
    p = lock_path(stack)
    return p.read_text(encoding="utf-8") if p is not None and p.is_file() else None


def header(t: Target, stack: Stack) -> str:
    return (
        f"{resolve.HEADER} of the gateway (smg); do not edit, regenerate with `{lock_command(stack)}`\n"
        f"# inputs-sha256: {t.inputs_hash()}\n"
        f"# target: python {t.python}, {t.platform}" + (f", as of {t.exclude_newer}" if t.exclude_newer else "")
        + "\n"
    )


def lock_gateway(stack: Stack, *, offline: bool = False) -> tuple[Path, str]:
    """Resolve smg's closure with uv (hashes for every file) -> (where it goes, its text)."""
    gw, path = stack.gateway, lock_path(stack)
    t = gateway_target(gw) if gw else None
    if gw is None or t is None or path is None:
        raise InputError(f"{stack.source}: {'no gateway: section' if gw is None else _base_msg(gw)}; "
                         "nothing to lock")
    return path, resolve.seal(header(t, stack) + resolve.resolve(t, offline=offline))


def _base_msg(gw: Gateway) -> str:
    known = ", ".join(sorted(DISTROS))
    return f"gateway.base_image: cannot tell the python and glibc of '{gw.base_image}' (known: {known})"


def hostname(address: str) -> str:
    """The host part of [USER@]HOST[:PORT]."""
    return address.rsplit("@", 1)[-1].split(":", 1)[0]


def _loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_gateway(stack: Stack) -> list[Finding]:
    """Located findings: the lock, the workers' /metrics, ports, and whether the gateway can reach them."""
    gw = stack.gateway
    if gw is None:
        return []
    loc = positions(stack)

    def finding(path: tuple[str, ...], message: str, rule: str, severity: str = "error") -> Finding:
        pos = loc.keys.get(path) if path in (("gateway",), ("server", "flags")) else None
        pos = pos or loc.pos(path)
        return Finding(pos.file, pos.line, pos.col, severity, message, rule)

    out: list[Finding] = []
    t = gateway_target(gw)
    if t is None:
        out.append(finding(("gateway", "base_image"), _base_msg(gw) + "; use a Debian or Ubuntu base",
                           "gateway-base"))
    else:
        text = lock_text(stack)
        rel = (LOCK_DIR / lock_name(t)).as_posix()
        if text is None:
            out.append(finding(("gateway",), f"gateway: no lock {rel}; run `{lock_command(stack)}`", "gateway-lock"))
        elif resolve.parse(text).inputs_hash != t.inputs_hash():
            out.append(finding(("gateway",), f"gateway: {rel} was resolved for other inputs; "
                                             f"run `{lock_command(stack)}`", "gateway-lock"))
        elif why := resolve.parse(text).edited():
            out.append(finding(("gateway",), f"gateway: {rel} {why}; run `{lock_command(stack)}`", "gateway-lock"))
    if t is not None and not gw.exclude_newer:
        pos = loc.keys.get(("gateway",)) or loc.pos(("gateway",))
        out.append(Finding(pos.file, pos.line, pos.col, "warning",
                           "gateway.exclude_newer is not set: a relock of smg's closure resolves against today's "
                           "index and may differ; set it to an instant before its lock was made", "gateway-lock-date"))
    if stack.server.flags.get("--enable-metrics") is not True:
        out.append(finding(("server", "flags"), "server.flags: a gateway drains a server by its in-flight count "
                                                "from /metrics; add --enable-metrics: true", "gateway-metrics"))
    gw_host = gateway_host(stack)
    workers = [h.target for h in stack.host.hosts] or ([stack.host.address] if stack.host.address else [])
    ports = {"runtime.port": stack.runtime.port, "runtime.staging_port": stack.runtime.staging_port}
    if gw_host is None or any(hostname(w) == gw_host for w in workers):
        for what, port in ports.items():
            if gw.port == port or gw.metrics_port == port:
                key = "port" if gw.port == port else "metrics_port"
                out.append(finding(("gateway", key), f"gateway.{key}: {port} is the servers' {what} on the same "
                                                     "host; pick another port", "gateway-port"))
    if gw.port == gw.metrics_port:
        out.append(finding(("gateway", "metrics_port"), "gateway.metrics_port: the same port as gateway.port; "
                                                        "pick another", "gateway-port"))
    if not gw.api_keys and ipaddress.ip_address(gw.listen).is_unspecified:
        # the worker API needs stackbuild's key whatever listen says; the serving path only with api_keys
        at = ("gateway", "listen") if ("gateway", "listen") in loc.keys else ("gateway",)
        out.append(finding(at, f"gateway.listen: {gw.listen} serves completions to whoever reaches port {gw.port}, "
                               "with no key; set gateway.api_keys (their values in the gateway host's secrets "
                               "file) or listen on a private address", "gateway-open", "warning"))
    listen = stack.server.flags.get("--host")
    if gw_host is not None and (listen is None or _loopback(str(listen))):
        far = [w for w in workers if hostname(w) != gw_host and not (_loopback(hostname(w)) and _loopback(gw_host))]
        if far:
            out.append(finding(("gateway", "host"), f"gateway.host: the servers listen on loopback only, so a gateway "
                                                    f"on {gw_host} cannot reach {', '.join(far)}; set server.flags "
                                                    "--host: 0.0.0.0 or run the gateway on that host",
                               "gateway-reach"))
    return out


def gateway_host(stack: Stack) -> str | None:
    """The hostname the gateway runs on: gateway.host (a fleet host's name or an address), else host.address."""
    gw = stack.gateway
    named = {h.name: h.target for h in stack.host.hosts}
    where = (named.get(gw.host, gw.host) if gw and gw.host else None) or stack.host.address
    return hostname(where) if where else None
