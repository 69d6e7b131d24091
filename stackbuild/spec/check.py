"""`validate`: every check on a stack, collected into one list of findings.

Rules (stackbuild.spec.rules), the pinned SGLang release's flags and env vars
(stackbuild.spec.sglang) and the patches (stackbuild.spec.patches), each pointing into the YAML.
"""

from __future__ import annotations

from stackbuild.errors import Finding
from stackbuild.paths import cache_dir
from stackbuild.spec import patches as patchmod
from stackbuild.spec import sglang
from stackbuild.spec.expect_log_check import check_expect_log
from stackbuild.spec.load import positions
from stackbuild.spec.lock.check import check_lock
from stackbuild.spec.lock.smg import check_gateway
from stackbuild.spec.rules import check_rules
from stackbuild.spec.stack import Stack
from stackbuild.spec.yamlpos import Pos

# Set by the renderer or the runtime, never by hand in server.flags.
RESERVED_FLAGS = {
    "--port": "runtime.port",
    "--model-path": "server.model_path",
    "--model": "server.model_path",
    "--served-model-name": "server.served_model_name",
    # the unit's identity, systemd's InvocationID (render/stack.py IDENTITY_ARG): how a deploy knows
    # its candidate's process from whatever else answers on the port
    "--weight-version": "the unit's start (its systemd InvocationID)",
}


def _finding(pos: Pos, severity: str, message: str, rule: str) -> Finding:
    return Finding(pos.file, pos.line, pos.col, severity, message, rule)


# What `stackbuild sim` accepts, i.e. what a sim stack's server.flags may use. A table here, not
# read off the sim's click command, so checking a spec does not import the CLI; a test holds the
# two together.
SIM_FLAGS = frozenset({
    "--context-length", "--enable-metrics", "--fault", "--host", "--load-s", "--max-running-requests",
    "--model-path", "--port", "--profile", "--seed", "--served-model-name", "--speed", "--warmup-s",
    "--weight-version",
    "--tp-size", "--flashinfer-allreduce-fusion-backend", "--host-multicast",
})


def check_flags(stack: Stack, *, offline: bool) -> list[Finding]:
    loc = positions(stack)
    out: list[Finding] = []
    for flag, where in RESERVED_FLAGS.items():
        if flag in stack.server.flags:
            pos = loc.keys.get(("server", "flags", flag)) or loc.pos(("server", "flags"))
            out.append(
                _finding(
                    pos,
                    "error",
                    f"server.flags: '{flag}' is set by stackbuild from {where}; "
                    + ("set that instead" if where.startswith(("runtime.", "server.")) else "remove it"),
                    "reserved-flag",
                )
            )
    if stack.server.engine == "sim":
        known = SIM_FLAGS
        for flag in stack.server.flags:
            if flag not in known and flag not in RESERVED_FLAGS:
                pos = loc.keys.get(("server", "flags", flag)) or loc.pos(("server", "flags"))
                opts = ", ".join(sorted(known))
                out.append(
                    _finding(
                        pos, "error", f"server.flags: '{flag}' is not a simulator option (it has {opts})", "sim-flag"
                    )
                )
        return out
    version = stack.sglang_version
    if version is None:
        out.append(
            _finding(
                loc.pos(("components",)),
                "error",
                "components.sglang: an sglang server needs a pinned sglang release; add components.sglang.version",
                "missing-key",
            )
        )
        return out
    table = sglang.load_table(version, offline=offline, root=stack.root)
    for flag, value in stack.server.flags.items():
        if flag in RESERVED_FLAGS:
            continue
        issue = sglang.check_flag(table, flag, value)
        if issue:
            pos = loc.keys.get(("server", "flags", flag)) or loc.pos(("server", "flags"))
            out.append(_finding(pos, issue.severity, f"server.flags: {issue.message}", issue.rule))
    for name, value in stack.server.env.items():
        issue = sglang.check_env(table, name) or sglang.check_env_value(table, name, value)
        if issue:
            pos = loc.keys.get(("server", "env", name)) or loc.pos(("server", "env"))
            out.append(_finding(pos, issue.severity, f"server.env: {issue.message}", issue.rule))
    return out


def check_patches(stack: Stack, *, offline: bool) -> list[Finding]:
    """Each patch dry-run against the release's own sources.

    Offline, with the release's wheel not in the cache, the patches are not checked: one warning
    says so and how to fetch it (exit 0: not a verdict either way; the repository commits no
    sglang sources, and `validate` online or the image build checks them)."""
    if not stack.patches or stack.sglang_version is None:
        return []
    loc = positions(stack)
    version = stack.sglang_version
    if offline and sglang.wheel_path(version) is None:
        pos = loc.keys.get(("patches",)) or loc.pos(("patches",))
        msg = (
            f"patches: not checked offline: sglang {version}'s source is not in the cache "
            f"({cache_dir() / 'sglang'}); run `stackbuild validate {stack.name}` once online to fetch it"
        )
        return [_finding(pos, "warning", msg, "patch-unchecked")]
    wheel = sglang.ensure_wheel(version, offline=offline)
    out = []
    for i, p in enumerate(stack.patches):
        for issue in patchmod.check_patch(p.path, p.text, wheel, version):
            spec_pos = loc.pos(("patches", i))
            out.append(
                _finding(
                    spec_pos,
                    issue.severity,
                    f"patches: {p.name}:{issue.line}: {issue.message}",
                    "patch-applied" if issue.severity == "warning" else "patch",
                )
            )
    return out


def check_stack(stack: Stack, *, offline: bool = False) -> list[Finding]:
    findings = check_rules(stack) + check_flags(stack, offline=offline) + check_patches(stack, offline=offline)
    findings += check_lock(stack) + check_gateway(stack) + check_expect_log(stack, offline=offline)
    return sorted(findings, key=lambda f: (f.path, f.line, f.col))
