"""Rendering the gateway: its image (Dockerfile + the hash lock) and its systemd unit, pure.

The unit runs `smg launch` in the gateway image with host networking, like the
server's unit runs the server image; each `gateway:` field becomes the one `smg
launch` option it names (smg 1.13.0 `router_args.py`), built here as an argv.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from stackbuild.paths import templates_dir
from stackbuild.render.stack import DOCKER, ENV_DIR, HASH_LEN, exec_line, make_env
from stackbuild.spec.gateway import Gateway
from stackbuild.spec.lock.smg import gateway_host, hostname, lock_command, lock_text
from stackbuild.spec.stack import Stack


@dataclass(frozen=True)
class RenderedGateway:
    files: dict[str, str]  # relative path -> text (gateway/Dockerfile, gateway/requirements.lock, the unit)
    content_hash: str  # of the image's inputs: the Dockerfile, the lock and the launcher

    @property
    def hash12(self) -> str:
        return self.content_hash[:HASH_LEN]


def smg_argv(gw: Gateway, workers: list[str]) -> list[str]:
    """`smg launch` with every setting the spec holds; `workers` are the servers it starts with."""
    h = gw.health
    argv = ["smg", "launch", "--host", gw.listen, "--port", str(gw.port)]
    if workers:
        argv += ["--worker-urls", *workers]
    return [
        *argv,
        "--policy", gw.policy,
        "--health-check-interval-secs", str(h.interval_s),
        "--health-check-timeout-secs", str(h.timeout_s),
        "--health-failure-threshold", str(h.failure_threshold),
        "--health-success-threshold", str(h.success_threshold),
        "--health-check-endpoint", h.endpoint,
        "--retry-max-retries", str(gw.retries),
        # a worker that does not answer at start (the servers boot beside it) is tried again every
        # second, not smg's 30 s (router_args.py worker_startup_check_interval): docs/host-lifecycle.md
        "--worker-startup-check-interval", str(STARTUP_CHECK_S),
        "--shutdown-grace-period-secs", str(gw.shutdown_grace_s),
        # the metrics name every worker's address: kept off the network the clients use
        "--prometheus-host", "127.0.0.1",
        "--prometheus-port", str(gw.metrics_port),
        # a pure HTTP load balancer: no tokenizer fetched from the model hub on the gateway host
        "--disable-tokenizer-autoload",
        "--log-level", "info",
    ]  # fmt: skip


STARTUP_CHECK_S = 1
# smg's launcher in the gateway image (templates/smg_launch.py): it adds the keys to smg's arguments
# inside its own process, from the variables `docker run --env-file` put in its environment
LAUNCHER = "smg_launch.py"
LAUNCHER_IN_IMAGE = f"/opt/stackbuild/{LAUNCHER}"
KEY_VAR = "SMG_CONTROL_PLANE_KEY"  # the one line of the key file: KEY_VAR=<64 hex digits>


def key_file(gw: Gateway | str) -> str:
    """The gateway's control-plane key on its host (its spec or its service name): made there by stackbuild,
    0600, read only by stackbuild (over SSH) and by the docker client that starts smg (--env-file)."""
    return f"{ENV_DIR}/{gw if isinstance(gw, str) else gw.service}.control-plane.key"


def secrets_file(gw: Gateway) -> str:
    """The gateway's secrets on its host (0600, the operator's): the values of `gateway.api_keys`."""
    return f"{ENV_DIR}/{gw.service}.env"


def launcher_argv(gw: Gateway, workers: list[str], *, python: str = "python3",
                  launcher: str = LAUNCHER_IN_IMAGE) -> list[str]:
    """smg started by its launcher: the names of the variables that hold the keys, never a key."""
    names = [a for n in gw.api_keys for a in ("--data-plane-key", n)]
    return [python, launcher, "--control-plane-key-env", KEY_VAR, *names, "--", *smg_argv(gw, workers)[1:]]


def launcher_text() -> str:
    return (templates_dir() / LAUNCHER).read_text(encoding="utf-8")


def docker_argv(gw: Gateway, *, image: str, workers: list[str]) -> list[str]:
    name = gw.service
    # the docker client reads these files on the host: the keys reach smg's environment, never an argument
    head = [DOCKER, "run", "--rm", "--name", name, "--network", "host", "--env-file", key_file(gw)]
    if gw.api_keys:
        head += ["--env-file", secrets_file(gw)]
    # the label last, the image after it: as in the server's unit (what reads a unit finds the image there)
    return [*head, "--label", f"dev.stackbuild.unit={name}", image, *launcher_argv(gw, workers)]


# The unit starts smg with the servers its pool file names: systemd reads the file (EnvironmentFile)
# and splits an unquoted $WORKER_URLS at whitespace into zero or more arguments (systemd.service(5),
# "Command lines"), and `--worker-urls` takes any number (smg router_args.py: nargs="*"). stackbuild
# rewrites that one file as servers leave and join (host/gateway.py), so a gateway restarted at any
# moment starts with the pool as it should be, and its unit file never changes for it.
POOL_VAR = "WORKER_URLS"
POOL_HEADER = "# written by stackbuild: the servers the gateway starts with (it rewrites this as they leave and join)"


def pool_file(gw: Gateway | str) -> str:
    """The gateway's pool file (its spec or its service name)."""
    return f"{ENV_DIR}/{gw if isinstance(gw, str) else gw.service}.workers"


def pool_text(workers: list[str]) -> str:
    """The pool file: one variable, the URLs separated by spaces (each a worker_url: no space, no quote)."""
    return f'{POOL_HEADER}\n{POOL_VAR}="{" ".join(workers)}"\n'


def pool_urls(text: str | None) -> list[str]:
    """The URLs a pool file names (none for a file that is absent or says nothing)."""
    prefix = f'{POOL_VAR}="'
    line = next((ln for ln in (text or "").splitlines() if ln.startswith(prefix) and ln.endswith('"')), "")
    return line[len(prefix):-1].split()


def worker_url(address: str, port: int, gateway_host: str | None) -> str:
    """A server as the gateway reaches it: over loopback when they share a host."""
    host = hostname(address)
    return f"http://{'127.0.0.1' if host == gateway_host else host}:{port}"


def declared_workers(stack: Stack) -> list[str]:
    """The serving URLs the spec itself names: each host of host.hosts on its port, else host.address."""
    gw_host = gateway_host(stack)
    if stack.host.hosts:
        return [worker_url(h.target, h.port or stack.runtime.port, gw_host) for h in stack.host.hosts]
    if stack.host.address:
        return [worker_url(stack.host.address, stack.runtime.port, gw_host)]
    return []


def render_gateway_unit(stack: Stack, *, image: str) -> str:
    gw = stack.gateway
    if gw is None:
        raise ValueError(f"{stack.label} has no gateway: section")
    var = f"${POOL_VAR}"  # left for systemd to expand: the one word not quoted literally
    argv = docker_argv(gw, image=image, workers=[var])
    return make_env().get_template("gateway.service.j2").render(
        stack=stack,
        gw=gw,
        pool_file=pool_file(gw),
        key_file=key_file(gw),
        startup_check_s=STARTUP_CHECK_S,
        # the server units of this stack (host/state.py HostPaths.main_unit, candidate_unit)
        after=[f"{stack.host.service}.service", f"{stack.host.service}-candidate.service"],
        exec_start=" ".join(a if a == var else exec_line([a]) for a in argv),
        exec_pre=exec_line([DOCKER, "rm", "--force", gw.service]),
        exec_stop=exec_line([DOCKER, "stop", "--time", str(gw.shutdown_grace_s + 10), gw.service]),
    )


def gateway_image_ref(stack: Stack, content_hash: str, repo: str | None = None) -> str:
    """REPO:gateway-smgVERSION-HASH12: one image per gateway Dockerfile and lock, shared by stacks."""
    gw = stack.gateway
    if gw is None:
        raise ValueError(f"{stack.label} has no gateway: section")
    return f"{repo or stack.host.registry or 'stackbuild'}:gateway-smg{gw.version}-{content_hash[:HASH_LEN]}"


def render_gateway(stack: Stack, workers: list[str] | None = None) -> RenderedGateway:
    """The gateway's files; `workers` default to the ones the spec declares."""
    gw = stack.gateway
    if gw is None:
        return RenderedGateway({}, "")
    lock = lock_text(stack) or f"# no lock: run `{lock_command(stack)}`\n"
    dockerfile = make_env().get_template("Dockerfile.gateway.j2").render(gw=gw)
    launcher = launcher_text()
    h = hashlib.sha256(dockerfile.encode())
    h.update(hashlib.sha256(lock.encode()).hexdigest().encode())
    h.update(hashlib.sha256(launcher.encode()).hexdigest().encode())
    content_hash = h.hexdigest()
    image = gateway_image_ref(stack, content_hash)
    unit = render_gateway_unit(stack, image=image)
    pool = pool_text(declared_workers(stack) if workers is None else workers)
    return RenderedGateway(
        {"gateway/Dockerfile": dockerfile, "gateway/requirements.lock": lock, f"gateway/{LAUNCHER}": launcher,
         f"units/{gw.service}.service": unit,
         f"units/{gw.service}.workers": pool},
        content_hash,
    )
