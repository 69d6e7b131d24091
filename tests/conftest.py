"""Shared fixtures for integration tests: the real dockerd, registry, base image and
systemd+sshd test hosts that scripts/infra/up.sh brings up.

Outside CI a missing piece skips the test with what to run; with CI=true it is a
failure, because CI promises the real infrastructure.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from helpers_xdist import LastTestScheduling, apart, module_says

from stackbuild.errors import InfraError
from stackbuild.host import local

REGISTRY = "127.0.0.1:5000"
BASE_IMAGE = os.environ.get("STACKBUILD_BASE_IMAGE", "local/debian:bookworm")
TESTHOST_IMAGE = os.environ.get("STACKBUILD_TESTHOST_IMAGE", "local/stackbuild-testhost:bookworm")
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def _missing(what: str) -> None:
    msg = f"{what}; run `bash scripts/infra/up.sh` (as root) first"
    if IN_CI:
        pytest.fail(msg, pytrace=False)
    pytest.skip(msg)


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    try:
        import docker

        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as err:
        _missing(f"Docker daemon not reachable ({type(err).__name__}: {err})")
    yield client
    client.close()


@pytest.fixture(scope="session")
def registry() -> str:
    try:
        with urllib.request.urlopen(f"http://{REGISTRY}/v2/", timeout=5) as resp:
            if resp.status != 200:
                _missing(f"registry http://{REGISTRY}/v2/ answered {resp.status}")
    except OSError as err:
        _missing(f"registry http://{REGISTRY}/v2/ not answering ({err})")
    return REGISTRY


def _require_image(client: Any, ref: str) -> str:
    import docker.errors

    try:
        client.images.get(ref)
    except docker.errors.ImageNotFound:
        _missing(f"image {ref} is absent")
    return ref


@pytest.fixture(scope="session")
def base_image(docker_client: Any) -> str:
    return _require_image(docker_client, BASE_IMAGE)


# --------------------------------------------------------------------------- test hosts


@dataclass
class TestHost:
    """One running systemd+sshd container reachable as root@127.0.0.1:port.

    `address` is what `stackbuild deploy --host` takes; `ssh_config` holds an entry
    named `alias` (ssh -F ssh_config alias); `known_hosts` has the host keys read
    out of the container itself, so strict host-key checking works.
    """

    __test__ = False  # not a test class, despite the name

    client: Any
    name: str
    port: int
    key_path: Path
    known_hosts: Path
    ssh_config: Path
    host: str = "127.0.0.1"
    user: str = "root"
    workdir: Path = field(default_factory=Path)

    @property
    def alias(self) -> str:
        return self.name

    @property
    def address(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    @property
    def container(self) -> Any:
        return self.client.containers.get(self.name)

    def ssh_argv(self, command: str) -> list[str]:
        return ["ssh", "-F", str(self.ssh_config), self.alias, command]

    def ssh(self, command: str, *, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a shell command on the host over real SSH."""
        return subprocess.run(
            self.ssh_argv(command),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
            stdin=subprocess.DEVNULL,
        )

    def exec(self, command: str, *, check: bool = True) -> str:
        """Run a shell command inside the container, bypassing SSH (for assertions)."""
        res = self.container.exec_run(["sh", "-c", command], demux=False)
        out = res.output.decode(errors="replace") if res.output else ""
        if check and res.exit_code != 0:
            raise AssertionError(f"{self.name}: `{command}` exited {res.exit_code}: {out}")
        return out

    def wait_ready(self, timeout: float = 60) -> None:
        """systemd running and this container's own sshd answering (stackbuild.host.local.wait_up)."""
        local.wait_up(self.name, self.port, timeout)

    # Fault injection for deploy tests.
    def stop(self, timeout: int = 10) -> None:
        self.container.stop(timeout=timeout)

    def kill(self) -> None:
        self.container.kill()

    def pause(self) -> None:
        """Freeze every process: the peer stops answering without closing connections."""
        self.container.pause()

    def unpause(self) -> None:
        self.container.unpause()

    def start(self, timeout: float = 60) -> None:
        """Start a stopped or killed host again (same port, key and host keys) and wait for it."""
        self.container.start()
        self.wait_ready(timeout)

    def remove(self) -> None:
        import docker.errors

        try:
            c = self.container
        except docker.errors.NotFound:
            return
        # Units on the host run sibling containers on this machine's daemon: stop them first.
        if c.status == "running":
            c.exec_run(
                [
                    "sh",
                    "-c",
                    "for u in $(ls /etc/systemd/system/*.service 2>/dev/null); do "
                    "n=$(basename $u); [ $n = testhost-setup.service ] || timeout 20 systemctl stop $n; done",
                ],
            )
        c.remove(force=True)


def _start_testhost(client: Any, workdir: Path, tries: int = 3) -> TestHost:
    """A host through stackbuild.host.local, the starter `stackbuild demo` uses, on a fresh port."""
    last: Exception | None = None
    for _ in range(tries):
        name = f"sb-testhost-{uuid.uuid4().hex[:8]}"
        try:
            lh = local.start(workdir / name, name=name, image=TESTHOST_IMAGE)
        except InfraError as err:  # most likely lost the port race (start removed it): try another port
            last = err
            continue
        host = TestHost(client=client, name=name, port=lh.port, key_path=lh.key, known_hosts=lh.known_hosts,
                        ssh_config=workdir / name / "ssh_config", workdir=workdir / name)
        host.ssh_config.write_text(
            f"Host {host.alias}\n"
            f"  HostName {host.host}\n  Port {host.port}\n  User {host.user}\n"
            f"  IdentityFile {host.key_path}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {host.known_hosts}\n  StrictHostKeyChecking yes\n"
            "  BatchMode yes\n  ConnectTimeout 10\n  LogLevel ERROR\n"
        )
        return host
    raise RuntimeError(f"test host did not come up after {tries} tries: {last}")


@pytest.fixture(scope="session")
def testhost_factory(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], TestHost]]:
    """Call it to get a fresh host; every host made is removed at the end of the session."""
    _require_image(docker_client, TESTHOST_IMAGE)
    workdir = tmp_path_factory.mktemp("testhosts")
    made: list[TestHost] = []

    def make() -> TestHost:
        h = _start_testhost(docker_client, workdir)
        made.append(h)
        return h

    yield make
    for h in made:
        h.remove()


@pytest.fixture
def testhost(testhost_factory: Callable[[], TestHost]) -> Iterator[TestHost]:
    """A fresh host for one test (about 2 s to start), removed after it."""
    h = testhost_factory()
    yield h
    h.remove()


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook turns the marks into group names
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist `--dist loadgroup`: a module's tests stay on one worker, in order
    (their module fixtures hold a host or a project), unless the module sets
    `PER_TEST = True` (tests that share nothing spread over the workers one by one)."""
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and not module_says(item, "PER_TEST"):
            item.add_marker(pytest.mark.xdist_group(module.__name__))
    items[:] = apart(items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` with a worker handed its next scope only on its last test (helpers_xdist)."""
    return LastTestScheduling(config, log) if config.getvalue("dist") == "loadgroup" else None


@pytest.fixture(scope="session", autouse=True)
def session_cache(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Path]:
    """One cache root for the whole run, under pytest's temp dir: no test reads or writes the user's
    cache, and every subprocess a test starts (the CLI, builds, uv, the simulator) inherits it.

    Under pytest-xdist each worker's basetemp is `<controller basetemp>/popen-gwN`, so the workers
    share `<controller basetemp>/stackbuild-cache`: a wheel one worker fetched is there for the
    others (every write into the cache is a temp name renamed into place).
    """
    base = tmp_path_factory.getbasetemp()
    if hasattr(request.config, "workerinput"):
        base = base.parent
    root = base / "stackbuild-cache"
    root.mkdir(exist_ok=True)
    mp = pytest.MonkeyPatch()
    mp.setenv("STACKBUILD_CACHE_DIR", str(root))
    mp.setenv("UV_CACHE_DIR", str(root / "uv"))  # uv's cache too: a resolution is not decided by the user's
    yield root
    mp.undo()


def worker_ports(worker: str, count: int, low: int, high: int) -> str:
    """STACKBUILD_PORTS for pytest-xdist worker `worker` (gw0, gw1, ...) of `count`: its own slice of
    [low, high), so that no two workers, nor the commands they run, ever pick the same port."""
    index = int(worker.removeprefix("gw"))
    width = (high - low) // count
    return f"{low + index * width}-{low + (index + 1) * width}"


@pytest.fixture(scope="session", autouse=True)
def ports_of_this_worker() -> Iterator[None]:
    """Under xdist, this worker's slice of the ports free_port picks from, for it and every command it
    starts. A port is often picked long before it is bound (a module's fleet ports, a demo's gateway,
    bound and freed over minutes): a pick by another worker in between finds it free. Once a demo's
    gateway never answered, and its metrics port was then held by another process (2026-12-07, eight
    workers: 'port 29430 (gateway.metrics_port) is in use by another process')."""
    from stackbuild.effects.net import PORTS_ENV, port_range

    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        yield
        return
    mp = pytest.MonkeyPatch()
    mp.setenv(PORTS_ENV, worker_ports(worker, int(os.environ["PYTEST_XDIST_WORKER_COUNT"]),
                                      *port_range({})))
    yield
    mp.undo()


@pytest.fixture(autouse=True)
def unit_tests_reach_no_daemon(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test not marked integration has no Docker daemon: a code path that would build or pull for
    real fails at once (the same on a machine with a daemon as without one) instead of quietly
    building an image in a unit test."""
    if request.node.get_closest_marker("integration") is None:
        monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/stackbuild-unit-test/docker.sock")


def pytest_sessionfinish(session: pytest.Session) -> None:
    """An xdist worker hands the figures its tests measured to the controller (no shared file)."""
    from test_deploy_support import FIGURES

    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["stackbuild_figures"] = json.dumps(FIGURES)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """The controller collects each worker's figures as the worker finishes."""
    from test_deploy_support import FIGURES

    FIGURES.extend(json.loads(getattr(node, "workeroutput", {}).get("stackbuild_figures", "[]")))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The downtime figures the deploy tests measured this session (a report, not a test)."""
    from test_deploy_support import FIGURES

    if FIGURES:
        terminalreporter.write_sep("-", "incumbent downtime measured by the deploy tests")
        for fig in FIGURES:
            terminalreporter.write_line(", ".join(f"{k}={v}" for k, v in fig.items()))
