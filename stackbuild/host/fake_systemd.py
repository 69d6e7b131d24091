"""systemd, docker and the servers of the scripted in-memory host (see fake.py).

A unit started here is read back from the unit file the flow installed: its ExecStart
(`docker run ... IMAGE ... --port N`) says which image runs, under which container name,
on which port, and its EnvironmentFile which secrets it gets. What the server then does
is the image's `Behaviour`, in the host's clock: when it listens, whether /health answers
200, whether generations fail, when it crashes and what it prints. `http_probe(url)`
answers from that state, as the server on that port would.
"""

from __future__ import annotations

import json
import posixpath
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from stackbuild.host.fake_base import FakeRemote, UnknownCommand
from stackbuild.host.ssh import RemoteResult
from stackbuild.host.unit_probe import POLL_SCRIPT
from stackbuild.host.units import INSTALL_SCRIPT, LOGS_SCRIPT, REMOVE_SCRIPT, SWITCH_SCRIPT, image_id_argv


@dataclass(frozen=True)
class Behaviour:
    """How a server from one image behaves once its unit starts (seconds on the host's clock)."""

    listens_after_s: float | None = 2.0  # None: never listens (loads forever)
    crash_after_s: float | None = None  # the process exits this long after its start...
    crash_log: tuple[str, ...] = ()  # ...printing these lines
    healthy: bool = True  # False: /health answers 503 forever
    failing_generations: int = 0  # the first N generations answer HTTP 500
    generation_error: str = "CUDA error: an illegal memory access was encountered"
    output: tuple[str, ...] = ("server: loading weights",)
    kernel_error: str | None = None  # the deploy's kernel import check fails with this (GPU stacks)


SERVES = Behaviour()
NEVER_LISTENS = Behaviour(listens_after_s=None)
UNHEALTHY = Behaviour(healthy=False)
FAILS_FIRST_GENERATION = Behaviour(failing_generations=1)


def crashes(*log: str, after_s: float = 0.0) -> Behaviour:
    return Behaviour(crash_after_s=after_s, crash_log=log)


@dataclass
class Proc:
    """A server process a unit runs (its container)."""

    image: str
    container: str
    port: int
    env: dict[str, str]
    started_at: float
    behaviour: Behaviour
    generations: int = 0
    logs: list[tuple[float, str]] = field(default_factory=list)

    def listening(self, now: float) -> bool:
        after = self.behaviour.listens_after_s
        return after is not None and now >= self.started_at + after


@dataclass
class SysUnit:
    """systemd's view of a unit, as `systemctl show` reports it."""

    active: str = "inactive"
    sub: str = "dead"
    result: str = "success"
    exit_status: str = "0"
    restarts: int = 0


def exec_start(text: str) -> list[str]:
    line = next((ln for ln in text.splitlines() if ln.startswith("ExecStart=")), None)
    if line is None:
        raise UnknownCommand(f"unit has no ExecStart:\n{text}")
    return shlex.split(line.removeprefix("ExecStart="))


def unit_setting(text: str, key: str) -> str | None:
    return next((ln.split("=", 1)[1] for ln in text.splitlines() if ln.startswith(f"{key}=")), None)


def env_values(text: str) -> dict[str, str]:
    """An EnvironmentFile as systemd reads it (units.env_file_text's quoting undone)."""
    out = {}
    for line in text.splitlines():
        name, eq, value = line.partition("=")
        if eq and not line.lstrip().startswith("#"):
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1].replace('\\"', '"').replace("\\$", "$").replace("\\`", "`").replace("\\\\", "\\")
            out[name.strip()] = value
    return out


@dataclass
class FakeSystemd(FakeRemote):
    unit_dir: str = "/etc/systemd/system"
    units: dict[str, SysUnit] = field(default_factory=dict)
    loaded: dict[str, str] = field(default_factory=dict)  # unit -> text systemd read at its last daemon-reload
    daemon_reloads: int = 0
    images: set[str] = field(default_factory=set)  # on the host
    registry: set[str] = field(default_factory=set)  # pullable
    servers: dict[str, Behaviour] = field(default_factory=dict)  # image -> how its server behaves
    running: dict[str, Proc] = field(default_factory=dict)  # unit -> its server process
    journal: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
    strangers: set[int] = field(default_factory=set)  # ports other processes listen on

    def __post_init__(self) -> None:
        self._mkdirs(self.unit_dir)

    # -- what tests read ---------------------------------------------------------------------
    def state_of(self, unit: str) -> str:
        return self.units.get(unit, SysUnit()).active

    def listening(self) -> set[int]:
        return {p.port for p in self.running.values() if p.listening(self.now)} | self.strangers

    def serving(self, port: int) -> str | None:
        """The image whose server listens on `port`, if one does."""
        return next((p.image for p in self.running.values() if p.port == port and p.listening(self.now)), None)

    def socket_table(self) -> str:
        """/proc/net/tcp as the kernel writes it: listeners (state 0A) and one established connection."""
        rows = ["  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode"]
        for i, port in enumerate(sorted(self.listening())):
            rows.append(f"{i:4}: 0100007F:{port:04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0"
                        f"        0 {1000 + i} 1 0000000000000000 100 0 0 10 0")
        rows.append(f"{len(rows) - 1:4}: 0100007F:0016 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0"
                    "        0 999 1 0000000000000000 20 4 30 10 -1")
        return "\n".join(rows) + "\n"

    def http_probe(self, url: str) -> FakeHttp:
        return FakeHttp(self, url)

    @contextmanager
    def endpoint(self, port: int) -> Iterator[str]:
        yield f"http://127.0.0.1:{port}"

    # -- time --------------------------------------------------------------------------------
    def _tick(self) -> None:
        for unit, proc in list(self.running.items()):
            after = proc.behaviour.crash_after_s
            if after is not None and self.now >= proc.started_at + after:
                self._exited(unit, list(proc.behaviour.crash_log), status=1)

    def _log(self, unit: str, *lines: str) -> None:
        self.journal.setdefault(unit, []).extend((self.now, ln) for ln in lines)

    # -- systemd -----------------------------------------------------------------------------
    def _daemon_reload(self) -> None:
        self.daemon_reloads += 1
        d = self.unit_dir + "/"
        self.loaded = {p[len(d):]: t for p, t in self.files.items() if p.startswith(d) and "/" not in p[len(d):]}

    def _exited(self, unit: str, lines: list[str], status: int) -> None:
        """The main process died: systemd schedules a restart (Restart=on-failure) or marks it failed."""
        self.running.pop(unit, None)
        self._log(unit, *lines, f"{unit}: Main process exited, code=exited, status={status}/FAILURE",
                  f"{unit}: Failed with result 'exit-code'.")
        restarts = unit_setting(self.loaded.get(unit, ""), "Restart") in ("on-failure", "always")
        # systemd's later restarts are not modelled: the flow acts on the first exit it sees
        self.units[unit] = SysUnit("activating" if restarts else "failed", "auto-restart" if restarts else "failed",
                                   "exit-code", str(status))

    def _start(self, unit: str, cmd: str) -> RemoteResult:
        if unit not in self.loaded:
            return RemoteResult(cmd, 5, "", f"Failed to start {unit}: Unit {unit} not found.")
        if unit in self.running:
            return self._ok(cmd)  # already running: start is a no-op
        text = self.loaded[unit]
        argv = exec_start(text)
        if argv[0] == "/bin/sh" and len(argv) > 1:
            return self._oneshot(unit, argv[1], argv[2:], cmd)
        if argv[:3] != ["/usr/bin/docker", "run", "--rm"]:
            raise UnknownCommand(f"FakeHost cannot run {unit}: ExecStart {argv}")
        name = argv[argv.index("--name") + 1]
        image = argv[argv.index(f"dev.stackbuild.unit={name}") + 1]
        port = int(argv[argv.index("--port") + 1])
        self.units[unit] = SysUnit("active", "running")
        if not any(p.container == name for p in self.running.values()):
            self._log(unit, f"Error: No such container: {name}")  # ExecStartPre=-docker rm --force
        self._log(unit, f"Started {unit_setting(text, 'Description')}.")
        if image not in self.images and image in self.registry:
            self.images.add(image)  # docker run pulls what the host lacks
        if image not in self.images:
            self._exited(unit, [f"docker: Error response from daemon: manifest for {image} not found"], 125)
            return self._ok(cmd)
        if image not in self.servers:
            raise UnknownCommand(f"no Behaviour scripted for image {image} (FakeHost.servers)")
        env_path = (unit_setting(text, "EnvironmentFile") or "").lstrip("-")
        given = env_values(self.files.get(env_path, ""))
        wanted = [argv[i + 1] for i, a in enumerate(argv) if a == "--env" and "=" not in argv[i + 1]]
        proc = Proc(image, name, port, {n: given[n] for n in wanted if n in given}, self.now, self.servers[image])
        if port in self.listening() or any(p.port == port for p in self.running.values()):
            self._exited(unit, ["OSError: [Errno 98] Address already in use"], 1)
            return self._ok(cmd)
        self.running[unit] = proc
        proc.logs += [(self.now, ln) for ln in proc.behaviour.output]
        self._log(unit, *proc.behaviour.output)
        return self._ok(cmd)

    def _oneshot(self, unit: str, script: str, args: list[str], cmd: str) -> RemoteResult:
        if self.files.get(script) != SWITCH_SCRIPT + "\n":
            raise UnknownCommand(f"FakeHost cannot run {unit}: {script} is not the switch script")
        rc = self._switch(*args)
        self.units[unit] = SysUnit("inactive" if rc == 0 else "failed", "dead" if rc == 0 else "failed",
                                   "success" if rc == 0 else "exit-code", str(rc))
        if rc:
            why = f"Job for {unit} failed because the control process exited with error code."
            return RemoteResult(cmd, 1, "", why)
        return self._ok(cmd)

    def _switch(self, cand: str, cand_path: str, main: str, staged: str, main_path: str) -> int:
        """SWITCH_SCRIPT, step by step (its `;` and `&&` kept)."""
        self._stop(cand)
        self._reset_failed(cand)
        self._rm(cand_path)
        self._stop(main)
        if not self._install(staged, main_path):
            return 1
        self._reset_failed(main)
        return self._start(main, "").returncode

    def _stop(self, unit: str) -> int:
        if unit not in self.loaded and unit not in self.units:
            return 5
        if self.running.pop(unit, None) is not None:
            self._log(unit, f"Stopped {unit_setting(self.loaded.get(unit, ''), 'Description')}.")
        st = self.units.setdefault(unit, SysUnit())
        st.active, st.sub = ("inactive", "dead") if st.result == "success" else ("failed", "failed")
        return 0

    def _reset_failed(self, unit: str) -> None:
        st = self.units.get(unit)
        if st is not None and st.active == "failed":
            self.units[unit] = SysUnit()

    def _install(self, staged: str, dst: str) -> bool:
        if staged not in self.files or posixpath.dirname(dst) not in self.dirs:
            return False
        self.files[dst] = self.files[staged]
        self.modes[dst] = 0o644
        self._daemon_reload()
        return True

    def _systemctl(self, verb: str, unit: str, cmd: str) -> RemoteResult:
        if verb == "is-active":
            state = self.state_of(unit)
            return RemoteResult(cmd, 0 if state == "active" else 3, state + "\n", "")
        if verb == "reset-failed":
            if unit not in self.loaded and unit not in self.units:
                return RemoteResult(cmd, 1, "", f"Failed to reset failed state of unit {unit}: Unit {unit} not loaded.")
            self._reset_failed(unit)
            return self._ok(cmd)
        if verb == "stop":
            rc = self._stop(unit)
            return RemoteResult(cmd, rc, "", f"Failed to stop {unit}: Unit {unit} not loaded." if rc else "")
        if verb == "start":
            return self._start(unit, cmd)
        raise UnknownCommand(f"FakeHost does not model: {cmd}")

    # -- interpretation ----------------------------------------------------------------------
    def _interpret(self, args: list[str], cmd: str) -> RemoteResult:
        if args == ["systemctl", "daemon-reload"]:
            self._daemon_reload()
            return self._ok(cmd)
        if args[0] == "systemctl" and len(args) == 3:
            return self._systemctl(args[1], args[2], cmd)
        if args[:2] == ["systemd-analyze", "verify"] and len(args) == 3:
            text = self.files.get(args[2])
            if text is None:
                return RemoteResult(cmd, 1, "", f"Failed to prepare filename {args[2]}: No such file or directory")
            if "[Service]" not in text or unit_setting(text, "ExecStart") is None:
                return RemoteResult(cmd, 1, "", f"{args[2]}: Service has no ExecStart=, ExecStop=, or SuccessAction=.")
            return self._ok(cmd)
        if args == ["date", "+%s"]:
            return self._ok(cmd, f"{int(self.now)}\n")
        if len(args) == 6 and args == image_id_argv(args[5]):
            if args[5] in self.images:
                return self._ok(cmd, "sha256:" + args[5].rsplit(":", 1)[-1][:64] + "\n")
            return RemoteResult(cmd, 1, "", f"Error: No such image: {args[5]}")
        if args[:3] == ["docker", "pull", "--quiet"] and len(args) == 4:
            if args[3] not in self.registry:
                return RemoteResult(cmd, 1, "", f"Error response from daemon: manifest for {args[3]} not found")
            self.images.add(args[3])
            return self._ok(cmd, args[3] + "\n")
        if args[:4] == ["docker", "inspect", "--format", "{{.Config.Image}}"] and len(args) == 5:
            image = next((p.image for p in self.running.values() if p.container == args[4]), None)
            if image is None:
                return RemoteResult(cmd, 1, "", f"Error: No such object: {args[4]}")
            return self._ok(cmd, image + "\n")
        return super()._interpret(args, cmd)

    def _script(self, script: str, p: list[str], cmd: str) -> RemoteResult:
        if script == INSTALL_SCRIPT:
            staged, dst = p
            if not self._install(staged, dst):
                return RemoteResult(cmd, 1, "", f"install: cannot stat '{staged}'")
            return self._ok(cmd)
        if script == REMOVE_SCRIPT:
            unit, path = p
            self._stop(unit)
            self._reset_failed(unit)
            if path in self.files:
                self._rm(path)
                self._daemon_reload()
            return self._ok(cmd)
        if script == POLL_SCRIPT:
            (unit,) = p
            st = self.units.get(unit, SysUnit())
            show = (f"ActiveState={st.active}\nSubState={st.sub}\nNRestarts={st.restarts}\n"
                    f"Result={st.result}\nExecMainStatus={st.exit_status}\n")
            return self._ok(cmd, f"{show}---\n{self.socket_table()}")
        if script == LOGS_SCRIPT:
            unit, container, since = p
            out = [f"== journalctl -u {unit}", *[ln for t, ln in self.journal.get(unit, []) if t >= int(since)][-400:]]
            proc = next((q for q in self.running.values() if q.container == container), None)
            if proc is not None:  # docker inspect finds it only while it runs (--rm)
                out += [f"== docker logs {container}", *[ln for t, ln in proc.logs if t >= int(since)][-400:]]
            return self._ok(cmd, "\n".join(out) + "\n")
        return super()._script(script, p, cmd)


@dataclass
class FakeHttp:
    """The server's HTTP layers at a URL on the fake host: whatever listens on that port answers."""

    host: FakeSystemd
    url: str

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1].split("/", 1)[0])

    def _proc(self) -> Proc | None:
        return next((p for p in self.host.running.values() if p.port == self.port and p.listening(self.host.now)),
                    None)

    def crashed(self) -> str | None:
        return None  # the unit's state says it (UnitProbe); HTTP alone cannot tell

    def port_open(self) -> tuple[bool, str]:
        ok = self.port in self.host.listening()
        return ok, "" if ok else f"nothing listens at {self.url}"

    def health(self) -> tuple[bool, str]:
        proc = self._proc()
        code = None if proc is None else 200 if proc.behaviour.healthy else 503
        return code == 200, f"/health answered {code if code is not None else 'nothing'}"

    def generate(self) -> tuple[bool, str]:
        proc = self._proc()
        if proc is None:
            return False, f"POST {self.url}/v1/completions: no answer (ConnectionRefusedError: refused)"
        proc.generations += 1
        if proc.generations <= proc.behaviour.failing_generations:
            err = proc.behaviour.generation_error
            proc.logs.append((self.host.now, err))
            unit = next(u for u, p in self.host.running.items() if p is proc)
            self.host._log(unit, err)
            body = json.dumps({"object": "error", "message": err, "type": "InternalServerError", "code": 500})
            return False, f"POST {self.url}/v1/completions: HTTP 500: {body.encode()[:200]!r}"
        return True, "generated ' Hello there'"
