"""Rendering: a pure function from a Stack to the text of every file it needs.

Dockerfile (multi-stage, one stage per component, most stable first, patches
last), systemd unit(s) for the server container, and stack.lock.json. Target
arch, distro and CUDA come from the Stack; nothing here reads globals or the
outside world except the template files themselves.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jinja2

from stackbuild.paths import templates_dir
from stackbuild.render import lockctx
from stackbuild.spec.components import aot_arches
from stackbuild.spec.conditions import uses_fp4
from stackbuild.spec.kinds import control_chars
from stackbuild.spec.lock.locked import digest as lock_digest
from stackbuild.spec.stack import Stack

HASH_LEN = 12
ENV_DIR = "/etc/stackbuild"
DOCKER = "/usr/bin/docker"


@cache
def make_env(directory: Path | None = None) -> jinja2.Environment:
    """The one Jinja environment: StrictUndefined, so a missing value is an error, not ''."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(directory or templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["dq"] = dockerfile_quote
    env.filters["sq"] = shell_word
    env.filters["comment"] = one_line
    env.filters["unit_text"] = unit_text
    return env


def one_line(value: object) -> str:
    """Free text for a comment: control characters shown as escapes, so it cannot end the line."""
    return "".join(c if not control_chars(c) else ascii(c)[1:-1] for c in str(value))


def unit_text(value: object) -> str:
    """A unit-file value read back literally: one line, `%` specifiers doubled, no trailing backslash."""
    s = one_line(value).replace("%", "%%")
    return s + " " if s.endswith("\\") else s


def shell_word(value: object) -> str:
    """One word in a Dockerfile RUN (shell form): quoted for bash; a newline would end the instruction."""
    s = str(value)
    if control_chars(s):
        raise ValueError(f"{s!r}: a control character cannot go into a RUN line (validation lets none through)")
    return shlex.quote(s)


def dockerfile_quote(value: object) -> str:
    """A double-quoted Dockerfile word: no variable expansion, quotes escaped."""
    s = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("\n", "\\n")
    return f'"{s}"'


@dataclass(frozen=True)
class Rendered:
    files: dict[str, str]  # relative path -> text
    content_hash: str
    lock: dict[str, Any]

    @property
    def hash12(self) -> str:
        return self.content_hash[:HASH_LEN]


# --- small pure pieces ---------------------------------------------------------


def flag_args(flags: dict[str, Any]) -> list[str]:
    """Spec flags -> argv: true = bare switch, false/null = absent, list = several values."""
    out: list[str] = []
    for k, v in flags.items():
        if v is None or v is False:
            continue
        if v is True:
            out.append(k)
        elif isinstance(v, list):
            out += [k, *(str(x) for x in v)]
        else:
            out += [k, str(v)]
    return out


def server_argv(stack: Stack, *, port: int) -> list[str]:
    s = stack.server
    head = ["python3", "-m", "sglang.launch_server"] if s.engine == "sglang" else ["stackbuild", "sim"]
    argv = [*head, "--model-path", s.model_path]
    if s.served_model_name:
        argv += ["--served-model-name", s.served_model_name]
    if "--host" not in s.flags:
        argv += ["--host", "127.0.0.1"]
    return [*argv, "--port", str(port), *flag_args(dict(s.flags))]


def launch_args(stack: Stack) -> list[str]:
    """The server's arguments as its unit passes them (from --model-path on): what sglang's parser is given
    by the smoke test and by `lock --verify`."""
    argv = server_argv(stack, port=stack.runtime.port)
    return argv[argv.index("--model-path") :]


def docker_run_argv(stack: Stack, *, image: str, port: int, name: str) -> list[str]:
    rt = stack.runtime
    argv = [DOCKER, "run", "--rm", "--name", name, "--network", "host"]
    if rt.gpus == "all":
        argv += ["--gpus", "all"]
    elif isinstance(rt.gpus, int):
        argv += ["--gpus", f"count={rt.gpus}"]
    argv += ["--ipc", rt.ipc, "--shm-size", rt.shm_size]
    for k, v in rt.ulimits.items():
        argv += ["--ulimit", f"{k}={v}"]
    for vol in rt.volumes:
        argv += ["--volume", vol]
    for secret in rt.secrets:
        argv += ["--env", secret]  # name only: the value comes from the EnvironmentFile
    for k, v in stack.server.env.items():
        argv += ["--env", f"{k}={v}"]
    argv += ["--label", f"dev.stackbuild.unit={name}", image]
    return argv + server_argv(stack, port=port)


_SAFE_ARG = re.compile(r"^[A-Za-z0-9_@+=:,./-]+$")


def systemd_quote(arg: str) -> str:
    """One argv element as systemd's ExecStart parser reads it back, literally.

    `$` would expand variables and `%` specifiers, so both are doubled; anything
    beyond plain characters is double-quoted with C escapes.
    """
    if _SAFE_ARG.match(arg):
        return arg
    esc = arg.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
    return '"' + esc.replace("$", "$$").replace("%", "%%") + '"'


def exec_line(argv: list[str]) -> str:
    return " ".join(systemd_quote(a) for a in argv)


def image_ref(stack: Stack, content_hash: str, repo: str | None = None) -> str:
    """REPO:STACK[-VARIANT]-HASH12; REPO is HOST:PORT/NAME in a registry."""
    repo = repo or stack.host.registry or "stackbuild"
    return f"{repo}:{stack.label}-{content_hash[:HASH_LEN]}"


# --- whole files ---------------------------------------------------------------------


# Which process answers on a port (issue #29): systemd gives every start of a unit a new InvocationID
# and expands ${INVOCATION_ID} in ExecStart (seen on the test hosts' systemd 252: `systemctl show -p
# InvocationID` names the id the process got); sglang 0.5.23 takes it as --weight-version, a label it
# returns from /get_model_info, /server_info and in every answer's meta_info (http_server.py
# get_model_info; server_args.weight_version). A deploy reads both and measures, pools and promotes a
# server only when they agree. Written raw after the quoted argv: `$` there would be doubled.
IDENTITY_FLAG = "--weight-version"
IDENTITY_PREFIX = "sb-"
IDENTITY_ARG = f"{IDENTITY_FLAG} {IDENTITY_PREFIX}${{INVOCATION_ID}}"


def identity_of(invocation_id: str) -> str:
    """The weight_version a server started by the unit invocation `invocation_id` reports."""
    return f"{IDENTITY_PREFIX}{invocation_id}"


def render_unit(stack: Stack, *, image: str, port: int, name: str, env_file: str | None = None) -> str:
    """`env_file`: the secrets file it reads; a side-by-side candidate gets its own copy. The server's
    last argument is its identity (IDENTITY_ARG)."""
    return (
        make_env()
        .get_template("server.service.j2")
        .render(
            stack=stack,
            name=name,
            env_file=env_file or f"{ENV_DIR}/{stack.host.service}.env",
            exec_start=f"{exec_line(docker_run_argv(stack, image=image, port=port, name=name))} {IDENTITY_ARG}",
            exec_pre=exec_line([DOCKER, "rm", "--force", name]),
            exec_stop=exec_line([DOCKER, "stop", "--time", "30", name]),
        )
    )


def _lock(stack: Stack, content_hash: str) -> dict[str, Any]:
    comps = {}
    for name, c in stack.components.items():
        entry: dict[str, Any] = {"version": c.version, "kind": c.kind}
        if c.source:
            entry.update(repo=c.source.repo, ref=c.source.ref, env=dict(sorted(c.source.env.items())))
        elif c.index:
            entry["index"] = c.index
        if aot := aot_arches(c):
            entry["aot"] = list(aot)
        comps[name] = entry
    return {
        "stack": stack.name,
        "variant": stack.variant,
        "content_hash": content_hash,
        "base_image": stack.base_image,
        "cuda": stack.cuda,
        "arches": list(stack.arches),
        "python": stack.python,
        "engine": stack.server.engine,
        "components": comps,
        "patches": [{"file": f"patches/{p.name}", "sha256": p.sha256} for p in stack.patches],
    }


def torch_arch(arch: str) -> str | None:
    """sm_XY[Z][a|f] as TORCH_CUDA_ARCH_LIST spells it: sm_90 -> 9.0, sm_90a -> 9.0a, sm_120 -> 12.0 (pure).

    torch 2.14.1's cpp_extension.py `_get_cuda_arch_flags` accepts MAJOR.MINOR with an optional `a`
    (its supported_arches: ..., '9.0', '9.0a', '10.0', '10.0a', ..., '12.0', '12.0a', '12.1', '12.1a')
    and raises on anything else; a family `f` target becomes the plain arch, whose SASS the family runs.
    """
    m = re.fullmatch(r"sm_(\d{1,2})(\d)([af]?)", arch)
    if m is None:
        return None
    return f"{m.group(1)}.{m.group(2)}" + ("a" if m.group(3) == "a" else "")


def _arch_list(stack: Stack, plus_ptx: bool) -> str:
    """TORCH_CUDA_ARCH_LIST: each arch as torch spells it; a Blackwell arch with its `a` suffix when the
    stack runs FP4 (sm_120 -> 12.0a), else the extensions built against it carry no FP4 instructions."""
    fp4 = uses_fp4(stack)
    nums = [n + ("a" if fp4 and a in ("sm_100", "sm_103", "sm_120", "sm_121") and not n.endswith("a") else "")
            for a in stack.arches if (n := torch_arch(a)) is not None]
    return ";".join(nums) + ("+PTX" if plus_ptx and nums else "")


def render_stack(stack: Stack, inputs: Mapping[str, str] | None = None) -> Rendered:
    """Every file of the stack, and the one content hash that names its image.

    `inputs` are digests of build-context files rendering does not produce (the
    sim image's wheelhouse: see `image.context.context_inputs`); the build passes
    the same ones, so the tag in the unit is the tag the build makes.
    """
    env = make_env()
    ctx = {
        "stack": stack,
        "torch_arch_list": _arch_list(stack, plus_ptx=bool(stack.cuda_mm and stack.cuda_mm >= (13, 0))),
        "components": dict(stack.components.items()),
        "patches": [f"patches/{p.name}" for p in stack.patches],
        "build_secrets": list(stack.build.secrets),
        **lockctx.base_context(stack, None),  # a resolved stack's lock may pin its base (below)
    }
    resolved = stack.server.engine == "sglang"
    if resolved:
        ctx.update(lockctx.context(stack))
    body = env.get_template(f"Dockerfile.{stack.server.engine}.j2").render(**ctx)
    # The hash covers the Dockerfile body, the patches and the lock (it lands in a label).
    h = hashlib.sha256(body.encode())
    for p in stack.patches:
        h.update(p.sha256.encode())
    h.update(json.dumps(_lock(stack, ""), sort_keys=True).encode())
    if resolved:  # the resolved closure: a new resolution is a new image
        h.update(lock_digest(stack).encode())
        # and the scripts the image runs while it is built (verifier, AOT driver): a new script is a new image
        for rel, text in sorted(lockctx.files(stack).items()):
            if rel != "requirements.lock":
                h.update(f"\n{rel} {hashlib.sha256(text.encode()).hexdigest()}".encode())
    for rel, digest in sorted((inputs or {}).items()):
        h.update(f"\n{rel} {digest}".encode())
    content_hash = h.hexdigest()
    lock = _lock(stack, content_hash)
    lock_json = json.dumps(lock, indent=2, sort_keys=True) + "\n"
    labels = env.get_template("labels.j2").render(
        stack=stack,
        content_hash=content_hash,
        lock_compact=json.dumps(lock, sort_keys=True, separators=(",", ":")),
        version=(stack.sglang_version or "sim"),
        base_digest=ctx["base_digest"],
    )
    files = {
        "Dockerfile": body + labels,
        "stack.lock.json": lock_json,
        f"units/{stack.host.service}.service": render_unit(
            stack, image=image_ref(stack, content_hash), port=stack.runtime.port, name=stack.host.service
        ),
    }
    for p in stack.patches:
        files[f"patches/{p.name}"] = p.text
    if resolved:
        files.update(lockctx.files(stack))
    return Rendered(files=files, content_hash=content_hash, lock=lock)
