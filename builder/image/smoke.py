"""Smoke test of a freshly built image, with no GPU: versions, patches, flags, /health.

The checks that decide are pure functions over what the image printed; the
runner only collects that output through the engine module.
"""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.error
import urllib.request
from typing import Any

from builder import __version__
from builder.errors import InfraError
from builder.image import engine
from builder.render import server_argv
from builder.spec import Stack

# component -> (distribution name, import name)
DISTS = {
    "torch": ("torch", "torch"),
    "sgl_kernel": ("sglang-kernel", "sgl_kernel"),
    "flashinfer": ("flashinfer-python", "flashinfer"),
    "sglang": ("sglang", "sglang"),
}
PATCH_DIR = "/opt/stackbuild/patches"


def expected_versions(stack: Stack) -> dict[str, str]:
    """distribution -> version the image must contain (pure)."""
    if stack.server.engine == "sim":
        return {"stackbuild": __version__}
    return {DISTS[name][0]: c.version for name, c in stack.components.items()}


def imports(stack: Stack) -> list[str]:
    if stack.server.engine == "sim":
        return ["builder", "builder.sim"]
    return [DISTS[name][1] for name, _ in stack.components.items()]


def versions_script(dists: list[str], modules: list[str]) -> str:
    return (
        "import importlib, importlib.metadata as m, json\n"
        f"for mod in {modules!r}:\n    importlib.import_module(mod)\n"
        f"print('VERSIONS=' + json.dumps({{d: m.version(d) for d in {dists!r}}}))\n"
    )


def _base(v: str) -> str:
    return v.split("+", 1)[0]  # torch 2.14.1+cu130 is torch 2.14.1


def version_mismatches(expected: dict[str, str], found: dict[str, str]) -> list[str]:
    out = []
    for dist, want in sorted(expected.items()):
        got = found.get(dist)
        if got is None or _base(got) != _base(want):
            out.append(f"{dist} is {got or 'missing'} in the image, the lock says {want}")
    return out


def parse_versions(output: str) -> dict[str, str]:
    for line in output.splitlines():
        if line.startswith("VERSIONS="):
            found: dict[str, str] = json.loads(line.removeprefix("VERSIONS="))
            return found
    return {}


def spec_flags(stack: Stack) -> list[str]:
    """Every option the server's command line uses (the spec's flags and what we add)."""
    return sorted({a for a in server_argv(stack, port=1) if a.startswith("--")})


def flags_missing(help_text: str, flags: list[str]) -> list[str]:
    """Flags not spelled out in full in --help (argparse prefix matches do not count)."""
    return [f for f in flags if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", help_text)]


def patch_check_command(patch_names: list[str]) -> list[str]:
    """A patch is installed iff it reverse-applies cleanly to the installed sources."""
    site = "$(python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')"
    checks = [
        f'patch -R --dry-run --batch -p1 -d "$site" -i {PATCH_DIR}/{n} >/dev/null || echo "NOT-APPLIED {n}"'
        for n in patch_names
    ]
    return ["bash", "-c", f"site={site}; " + "; ".join(checks)]


def smoke_test(c: Any, image: str, stack: Stack) -> list[str]:
    """Run every check; raise InfraError naming each mismatch. Returns what was checked."""
    problems: list[str] = []
    done: list[str] = []
    want = expected_versions(stack)
    rc, out = engine.run_once(c, image, ["python3", "-c", versions_script(sorted(want), imports(stack))])
    if rc != 0:
        problems.append(f"importing {', '.join(imports(stack))} failed: {out.strip().splitlines()[-1:]}")
    else:
        problems += version_mismatches(want, parse_versions(out))
        done.append("versions " + ", ".join(f"{k}={v}" for k, v in sorted(want.items())))
    if stack.patches:
        names = [p.name for p in stack.patches]
        rc, out = engine.run_once(c, image, patch_check_command(names))
        bad = [ln.split(" ", 1)[1] for ln in out.splitlines() if ln.startswith("NOT-APPLIED ")]
        problems += [f"patch {n} is not applied in the installed sources" for n in bad]
        if rc != 0 and not bad:
            problems.append(f"patch check failed to run: {out.strip()[-300:]}")
        done.append(f"{len(names)} patch(es) applied")
    head = server_argv(stack, port=1)
    head = head[: head.index("--model-path")]
    rc, out = engine.run_once(c, image, [*head, "--help"])
    missing = flags_missing(out, spec_flags(stack))
    if rc != 0:
        problems.append(f"`{' '.join(head)} --help` exited {rc}: {out.strip()[-300:]}")
    elif missing:
        problems.append(f"the server's --help does not accept {', '.join(missing)}")
    else:
        done.append(f"{len(spec_flags(stack))} server flags accepted")
    if stack.server.engine == "sim" and not problems:
        _health(c, image, stack)
        done.append("server answered /health")
    if problems:
        raise InfraError(f"smoke test of {image} failed: " + "; ".join(problems))
    return done


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _health(c: Any, image: str, stack: Stack) -> None:
    port = _free_port()
    timeout = min(stack.runtime.ready_timeout_s, 120)
    with engine.running(c, image, server_argv(stack, port=port)) as ctr:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            ctr.reload()
            if ctr.status == "exited":
                logs = ctr.logs().decode(errors="replace").strip()[-300:]
                raise InfraError(f"smoke test of {image} failed: the server exited before /health: {logs}")
            time.sleep(0.3)
        raise InfraError(f"smoke test of {image} failed: /health not 200 within {timeout}s on port {port}")
