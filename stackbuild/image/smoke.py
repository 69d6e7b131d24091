"""Smoke test of a freshly built image, with no GPU: versions, patches, flags, /health.

For an sglang image on a GPU-less build machine: every version against the lock
and torch.version.cuda (the image's own verify_image.py), `pip check`, the
patches, and sglang's own argument parser accepting the rendered flags (parsed,
not launched). Importing the kernels needs libcuda.so.1, which only the NVIDIA
container runtime provides, so that check runs only where a GPU runtime is
(`gpu=True`). The checks that decide are pure functions over what the image
printed; the runner only collects that output through the engine module.
"""

from __future__ import annotations

import inspect
import json
import re
from typing import Any

from stackbuild import __version__
from stackbuild.effects.net import free_port
from stackbuild.effects.readiness import HttpProbe, Pace, wait_ready
from stackbuild.errors import InfraError
from stackbuild.image import engine
from stackbuild.render.lockctx import AotBuild, aot_builds
from stackbuild.render.stack import launch_args, server_argv
from stackbuild.spec.components import BY_NAME
from stackbuild.spec.lock import fatbin, verify
from stackbuild.spec.lock.audit import arch_name, arch_number, code_covers
from stackbuild.spec.lock.locked import lock_text, torch_cuda
from stackbuild.spec.lock.verify import PARSER_SCRIPT as PARSER_SCRIPT
from stackbuild.spec.stack import Stack

PATCH_DIR = "/opt/stackbuild/patches"


def expected_versions(stack: Stack) -> dict[str, str]:
    """distribution -> version the image must contain (pure)."""
    if stack.server.engine == "sim":
        return {"stackbuild": __version__}
    return {BY_NAME[name].dist: c.version for name, c in stack.components.items()}


def imports(stack: Stack, *, gpu: bool = False) -> list[str]:
    """Modules to import: the simulator's own, or the kernels only where a GPU runtime is."""
    if stack.server.engine == "sim":
        return ["stackbuild", "stackbuild.sim"]
    return [BY_NAME[name].module for name, _ in stack.components.items()] if gpu else []


def host_kernel_check_argv(stack: Stack, image: str) -> list[str] | None:
    """What a deploy runs on the GPU host before it touches the incumbent (pure).

    The kernels (sgl_kernel's common_ops needs libcuda.so.1, which only the NVIDIA
    container runtime mounts) import only where a GPU runtime is, so the build
    machine cannot check them; the host can, with no network and no server started.
    None for a stack without GPUs.
    """
    if stack.server.engine != "sglang" or stack.runtime.gpus == "none":
        return None
    gpus = "all" if stack.runtime.gpus == "all" else f"count={stack.runtime.gpus}"
    return ["docker", "run", "--rm", "--network", "none", "--gpus", gpus, "--entrypoint", "python3", image,
            "-c", versions_script([], imports(stack, gpu=True))]


def parser_argv(stack: Stack) -> list[str]:
    """python -c PARSER_SCRIPT followed by exactly the server's rendered arguments (pure)."""
    return verify.parser_argv("python3", launch_args(stack))


def verify_argv(torch_cuda: str) -> list[str]:
    return ["python3", "/opt/stackbuild/verify_image.py", "/opt/stackbuild/requirements.lock", torch_cuda]


def verify_problems(rc: int, output: str) -> list[str]:
    """MISMATCH lines of verify_image.py, or why it did not run (pure)."""
    bad = [ln.removeprefix("MISMATCH ") for ln in output.splitlines() if ln.startswith("MISMATCH ")]
    if rc != 0 and not bad:
        bad = [f"verify_image.py exited {rc}: {output.strip()[-300:]}"]
    return bad


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


# Run in the image after stackbuild.spec.lock.fatbin's own source: every AOT module and the GPU code it carries.
AOT_SCAN = (
    "\nimport json, pathlib, sys\n"
    "for so in sorted(pathlib.Path(sys.argv[1]).glob('*/*.so')):\n"
    "    with open(so, 'rb') as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:\n"
    "        code = parse_fatbin(m)\n"
    "    print('AOTMOD ' + json.dumps([so.parent.name, sorted(code.sass), sorted(code.ptx)]))\n"
)


def aot_scan_argv(aot_dir: str) -> list[str]:
    """python -c (fatbin reader + scan) AOT_DIR: the reader is ours, stdlib only, so no pyelftools in the image."""
    return ["python3", "-c", inspect.getsource(fatbin) + AOT_SCAN, aot_dir]


def aot_problems(output: str, targets: list[int], aot_dir: str, label: str) -> tuple[list[str], str]:
    """(problems, summary) from the scan of `label`'s AOT modules: none, or some with no kernel a target GPU
    can run (pure)."""
    mods = [json.loads(ln.removeprefix("AOTMOD ")) for ln in output.splitlines() if ln.startswith("AOTMOD ")]
    if not mods:
        return [f"no {label} AOT modules in {aot_dir}: the first start would JIT-compile them"], ""
    problems = []
    for t in targets:
        bad = [name for name, sass, ptx in mods if not code_covers(sass, ptx, t)]
        if bad:
            shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
            problems.append(f"{len(bad)} of {len(mods)} {label} AOT modules carry no {arch_name(t)} kernel: {shown}")
    gpu = sum(1 for _, sass, ptx in mods if sass or ptx)
    have = sorted({a for _, sass, _ in mods for a in sass})
    sass = ", ".join(map(arch_name, have)) or "none"
    summary = f"{len(mods)} {label} AOT modules ({gpu} with GPU code; SASS {sass})"
    return problems, summary


def patch_check_command(patch_names: list[str]) -> list[str]:
    """A patch is installed iff it reverse-applies cleanly to the installed sources."""
    site = "$(python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')"
    checks = [
        f'patch -R --dry-run --batch -p1 -d "$site" -i {PATCH_DIR}/{n} >/dev/null || echo "NOT-APPLIED {n}"'
        for n in patch_names
    ]
    return ["bash", "-c", f"site={site}; " + "; ".join(checks)]


def smoke_test(c: Any, image: str, stack: Stack, *, gpu: bool = False) -> list[str]:
    """Run every check; raise InfraError naming each mismatch. Returns what was checked."""
    problems: list[str] = []
    done: list[str] = []
    want = expected_versions(stack)
    mods = imports(stack, gpu=gpu)
    rc, out = engine.run_once(c, image, ["python3", "-c", versions_script(sorted(want), mods)])
    if rc != 0:
        problems.append(f"importing {', '.join(mods) or 'metadata'} failed: {out.strip().splitlines()[-1:]}")
    else:
        problems += version_mismatches(want, parse_versions(out))
        done.append("versions " + ", ".join(f"{k}={v}" for k, v in sorted(want.items())))
        done += [f"imported {', '.join(mods)}"] if mods and stack.server.engine == "sglang" else []
    if stack.server.engine == "sglang":
        problems += _sglang_checks(c, image, stack, done)
    if stack.patches:
        names = [p.name for p in stack.patches]
        rc, out = engine.run_once(c, image, patch_check_command(names))
        bad = [ln.split(" ", 1)[1] for ln in out.splitlines() if ln.startswith("NOT-APPLIED ")]
        problems += [f"patch {n} is not applied in the installed sources" for n in bad]
        if rc != 0 and not bad:
            problems.append(f"patch check failed to run: {out.strip()[-300:]}")
        done.append(f"{len(names)} patch(es) applied")
    if stack.server.engine == "sim":  # an sglang image had its flags parsed by sglang's parser above
        _help_check(c, image, stack, problems, done)
    if stack.server.engine == "sim" and not problems:
        _serves(c, image, stack)
        done.append("server answered /health and generated")
    if problems:
        raise InfraError(f"smoke test of {image} failed: " + "; ".join(problems))
    return done


def _sglang_checks(c: Any, image: str, stack: Stack, done: list[str]) -> list[str]:
    problems: list[str] = []
    rc, out = engine.run_once(c, image, verify_argv(torch_cuda(stack, lock_text(stack))))
    bad = verify_problems(rc, out)
    problems += bad
    done += [] if bad else ["every locked version installed, torch.version.cuda as locked"]
    rc, out = engine.run_once(c, image, ["python3", "-m", "pip", "check"])
    problems += [f"pip check: {out.strip()[-300:]}"] if rc != 0 else []
    done += [] if rc != 0 else ["pip check"]
    rc, out = engine.run_once(c, image, parser_argv(stack))
    if rc != 0 or "SERVER-ARGS-OK" not in out:
        problems.append(f"sglang's parser refused the rendered flags: {out.strip()[-300:]}")
    else:
        done.append(f"sglang's parser accepts {len(spec_flags(stack))} server flags")
    for build in aot_builds(stack).values():
        problems += _aot_check(c, image, stack, build, done)
    return problems


def _aot_check(c: Any, image: str, stack: Stack, build: AotBuild, done: list[str]) -> list[str]:
    rc, out = engine.run_once(c, image, aot_scan_argv(build.dir))
    if rc != 0:
        return [f"reading the {build.label} AOT modules failed: {out.strip()[-300:]}"]
    targets = [n for a in stack.arches if (n := arch_number(a)) is not None]
    problems, summary = aot_problems(out, targets, build.dir, build.label)
    done += [] if problems else [summary]
    return problems


def _help_check(c: Any, image: str, stack: Stack, problems: list[str], done: list[str]) -> None:
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


def _serves(c: Any, image: str, stack: Stack) -> None:
    port = free_port()
    timeout = min(stack.runtime.ready_timeout_s, 120)
    with engine.running(c, image, server_argv(stack, port=port)) as ctr:

        def exited() -> str | None:
            ctr.reload()
            if ctr.status != "exited":
                return None
            logs: bytes = ctr.logs()
            return "the server exited: " + logs.decode(errors="replace").strip()[-300:]

        ready = wait_ready(HttpProbe(f"http://127.0.0.1:{port}", gone=exited), start_deadline_s=timeout,
                           pace=Pace(interval_s=0.3))
    if not ready.ok:
        raise InfraError(f"smoke test of {image} failed: {ready.stage} failing on port {port} ({ready.detail})")
