"""What the benches that deploy to a local systemd+sshd host share: the sim image, and one deploy.

Not a bench itself (a leading '_': scripts/figures.py passes it over). Needs the local
infrastructure (bash scripts/infra/up.sh).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from stackbuild.host import local
from stackbuild.image.build import build_stack
from stackbuild.image.ref import pin
from stackbuild.spec.load import load_stack

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = "127.0.0.1:5000/stackbuild"


def sim_image() -> str:
    """The sim stack's image, built (or found by its content hash) and pushed; pinned by digest."""
    built = build_stack(load_stack("sim", root=ROOT), registry=REGISTRY, push=True, root=ROOT)
    assert built.digest, "the build pushed no digest"
    return pin(built.image, built.digest)


def deploy(root: Path, stack: str, host: local.LocalHost, image: str, *extra: str,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`stackbuild deploy STACK` of the project at ROOT to HOST, the CLI in a subprocess, ledger in ROOT."""
    return subprocess.run(
        [sys.executable, "-m", "stackbuild", "--root", str(root), "deploy", stack, *extra,
         "--host", host.target, "--known-hosts", str(host.known_hosts), "--identity", str(host.key),
         "--image", image, "--ledger", str(root / "ledger.db")],
        capture_output=True, text=True, cwd=root, env=env, timeout=1200)
