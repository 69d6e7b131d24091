"""systemd and docker of the scripted in-memory host (see fake.py).

A unit started here is read back from the unit file systemd found first on its search path
(/run/systemd/system.control, then /etc/systemd/system, then /run/systemd/system) at the
last daemon-reload: its ExecStart (`docker run ... IMAGE ... --port N`) says which image
runs, under which container name, on which port, and its EnvironmentFile which secrets it
gets. What the server then does is the image's `Behaviour` (fake_server.py), in the host's
clock. `enable` links the unit file found first, as systemctl does; `reboot()` empties /run,
kills every server and starts the enabled units, as a power cycle does.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from stackbuild.host.ssh import RemoteResult
from stackbuild.host.unit_probe import POLL_SCRIPT, STATE_PROPERTIES
from stackbuild.host.units import (
    COMMIT_SCRIPT,
    EXISTING_SCRIPT,
    INSTALL_SCRIPT,
    LOGS_SCRIPT,
    REMOVE_SCRIPT,
    SWITCH_SCRIPT,
    container_image_argv,
    image_id_argv,
)
from stackbuild.testing.fake_base import FakeRemote, UnknownCommand
from stackbuild.testing.fake_server import Behaviour, FakeHttp, Proc

# systemctl show's properties, from the fake's state
SHOW: dict[str, Callable[[FakeSystemd, str], str]] = {
    "ActiveState": lambda h, u: h.units.get(u, SysUnit()).active,
    "SubState": lambda h, u: h.units.get(u, SysUnit()).sub,
    "NRestarts": lambda h, u: str(h.units.get(u, SysUnit()).restarts),
    "Result": lambda h, u: h.units.get(u, SysUnit()).result,
    "ExecMainStatus": lambda h, u: h.units.get(u, SysUnit()).exit_status,
    "InvocationID": lambda h, u: h.units.get(u, SysUnit()).invocation,
    "UnitFileState": lambda h, u: h.unit_file_state(u),
    "FragmentPath": lambda h, u: h.fragments.get(u, ""),
}


@dataclass
class SysUnit:
    """systemd's view of a unit, as `systemctl show` reports it."""

    active: str = "inactive"
    sub: str = "dead"
    result: str = "success"
    exit_status: str = "0"
    restarts: int = 0
    invocation: str = ""  # this start's id: systemd expands ${INVOCATION_ID} in ExecStart to it


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
    runtime_dir: str = "/run/systemd/system"
    control_dir: str = "/run/systemd/system.control"
    units: dict[str, SysUnit] = field(default_factory=dict)
    loaded: dict[str, str] = field(default_factory=dict)  # unit -> text systemd read at its last daemon-reload
    fragments: dict[str, str] = field(default_factory=dict)  # unit -> the file it was read from
    enabled: dict[str, str] = field(default_factory=dict)  # unit -> the file its multi-user.target link names
    daemon_reloads: int = 0
    boots: int = 0
    images: set[str] = field(default_factory=set)  # on the host
    registry: set[str] = field(default_factory=set)  # pullable
    servers: dict[str, Behaviour] = field(default_factory=dict)  # image -> how its server behaves
    running: dict[str, Proc] = field(default_factory=dict)  # unit -> its server process
    journal: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
    strangers: set[int] = field(default_factory=set)  # ports other processes listen on
    invocations: int = 0  # unit starts so far: each gets its own InvocationID

    def __post_init__(self) -> None:
        self._mkdirs(self.unit_dir)
        self._mkdirs(self.runtime_dir)  # systemd makes it at boot (sd_booted() looks for it)

    # -- what tests read ---------------------------------------------------------------------
    def state_of(self, unit: str) -> str:
        return self.units.get(unit, SysUnit()).active

    def unit_file(self, unit: str) -> str | None:
        """The file `unit` is read from, first on systemd's search path."""
        return next((p for d in (self.control_dir, self.unit_dir, self.runtime_dir)
                     if (p := f"{d}/{unit}") in self.files), None)

    def unit_file_state(self, unit: str) -> str:
        """`systemctl is-enabled`: enabled (linked), disabled ([Install] but no link), static, or ""."""
        if unit in self.enabled:
            return "enabled"
        path = self.unit_file(unit)
        if path is None:
            return ""
        return "disabled" if unit_setting(self.files[path], "WantedBy") else "static"

    def reboot(self, down_s: float = 30.0) -> None:
        """A power cycle: every server dies, /run is empty again, enabled units start in boot order."""
        for unit in list(self.running):
            self.log(unit, "-- Boot --")
        self.running.clear()
        self.units.clear()
        for d in [d for d in self.dirs if d.startswith("/run/")]:
            self._rmtree(d)
        self.now += down_s
        self.boots += 1
        self.__post_init__()
        self._daemon_reload()
        for unit, target in sorted(self.enabled.items()):
            if target in self.files:  # a link to a file that is gone starts nothing
                self._start(unit, "")

    def listening(self) -> set[int]:
        return {p.port for p in self.running.values() if p.listening(self.now)} | self.strangers

    def serving(self, port: int) -> str | None:
        """The image whose server listens on `port`, if one does."""
        # a snapshot first: a fleet's gateway asks from another host's thread while this host's own
        # thread starts and stops units (iterating the live dict could see it change size)
        return next((p.image for p in tuple(self.running.values()) if p.port == port and p.listening(self.now)), None)

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

    def log(self, unit: str, *lines: str) -> None:
        self.journal.setdefault(unit, []).extend((self.now, ln) for ln in lines)

    # -- systemd -----------------------------------------------------------------------------
    def _daemon_reload(self) -> None:
        self.daemon_reloads += 1
        names = {posixpath.basename(p) for p in self.files
                 if posixpath.dirname(p) in (self.control_dir, self.unit_dir, self.runtime_dir)}
        self.fragments = {u: p for u in names if (p := self.unit_file(u)) is not None and u.endswith(".service")}
        self.loaded = {u: self.files[p] for u, p in self.fragments.items()}

    def _exited(self, unit: str, lines: list[str], status: int) -> None:
        """The main process died: systemd schedules a restart (Restart=on-failure) or marks it failed."""
        self.running.pop(unit, None)
        self.log(unit, *lines, f"{unit}: Main process exited, code=exited, status={status}/FAILURE",
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
        self.invocations += 1
        invocation = f"{self.boots:08x}{self.invocations:024x}"
        argv = [a.replace("${INVOCATION_ID}", invocation) for a in exec_start(text)]
        if argv[0] == "/bin/sh" and len(argv) > 1:
            return self._oneshot(unit, argv[1], argv[2:], cmd)
        if argv[:3] != ["/usr/bin/docker", "run", "--rm"]:
            raise UnknownCommand(f"FakeHost cannot run {unit}: ExecStart {argv}")
        name = argv[argv.index("--name") + 1]
        image = argv[argv.index(f"dev.stackbuild.unit={name}") + 1]
        port = int(argv[argv.index("--port") + 1])
        self.units[unit] = SysUnit("active", "running", invocation=invocation)
        if not any(p.container == name for p in self.running.values()):
            self.log(unit, f"Error: No such container: {name}")  # ExecStartPre=-docker rm --force
        self.log(unit, f"Started {unit_setting(text, 'Description')}.")
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
        behaviour = self.servers[image]
        if port in self.listening() or any(p.port == port for p in self.running.values()):
            # it loads, then dies where it binds the port, as a server does: until then, whatever
            # holds the port answers for it
            behaviour = Behaviour(listens_after_s=None, crash_after_s=behaviour.listens_after_s or 0.0,
                                  crash_log=("OSError: [Errno 98] Address already in use",), output=behaviour.output)
        ident = argv[argv.index("--weight-version") + 1] if "--weight-version" in argv else "default"
        proc = Proc(image, name, port, {n: given[n] for n in wanted if n in given}, self.now, behaviour,
                    weight_version=ident)
        self.running[unit] = proc
        proc.logs += [(self.now, ln) for ln in proc.behaviour.output]
        self.log(unit, *proc.behaviour.output)
        return self._ok(cmd)

    def _commit(self, cmd: str, staged: str, main_path: str, override: str, unit: str, staged_state: str,
                state: str, retire: str, *drop: str) -> RemoteResult:
        """COMMIT_SCRIPT, step by step: install, drop the override, reload, enable, disable the other
        unit, the state, the rest."""
        if not self._install(staged, main_path, reload=False):
            return RemoteResult(cmd, 1, "", f"install: cannot stat '{staged}'")
        self._rm(override)
        self._daemon_reload()
        enabled = self._enable(unit, cmd)
        if not enabled.ok:
            return enabled
        self._disable(retire, cmd)  # its failure ignored, as the script does
        if staged_state not in self.files:
            return RemoteResult(cmd, 1, "", f"mv: cannot stat '{staged_state}': No such file or directory")
        self._move(staged_state, state)
        self._rm(*drop)
        self._daemon_reload()
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

    def _switch(self, cand: str, cand_path: str, main: str, staged: str, override: str) -> int:
        """SWITCH_SCRIPT, step by step (its `;` and `&&` kept)."""
        self._stop(cand)
        self._reset_failed(cand)
        self._rm(cand_path)
        self._stop(main)
        if not self._install(staged, override):
            return 1
        self._reset_failed(main)
        return self._start(main, "").returncode

    def _stop(self, unit: str) -> int:
        if unit not in self.loaded and unit not in self.units:
            return 5
        if self.running.pop(unit, None) is not None:
            self.log(unit, f"Stopped {unit_setting(self.loaded.get(unit, ''), 'Description')}.")
        st = self.units.setdefault(unit, SysUnit())
        st.active, st.sub = ("inactive", "dead") if st.result == "success" else ("failed", "failed")
        return 0

    def _reset_failed(self, unit: str) -> None:
        st = self.units.get(unit)
        if st is not None and st.active == "failed":
            self.units[unit] = SysUnit()

    def _install(self, staged: str, dst: str, *, reload: bool = True) -> bool:
        """install -m 0644 to a temp name, mv over dst (INSTALL_SCRIPT makes the directory first)."""
        if staged not in self.files:
            return False
        self._mkdirs(posixpath.dirname(dst))
        self.files[dst] = self.files[staged]
        self.modes[dst] = 0o644
        if reload:
            self._daemon_reload()
        return True

    def _enable(self, unit: str, cmd: str) -> RemoteResult:
        path = self.unit_file(unit)  # systemctl links the file it finds first, /run's included
        if path is None:
            return RemoteResult(cmd, 1, "", f"Failed to enable unit: Unit file {unit} does not exist.")
        if unit_setting(self.files[path], "WantedBy"):
            self.enabled.setdefault(unit, path)  # an existing link is kept
        return self._ok(cmd)

    def _disable(self, unit: str, cmd: str) -> RemoteResult:
        if unit not in self.enabled and self.unit_file(unit) is None:
            return RemoteResult(cmd, 1, "", f"Failed to disable unit: Unit file {unit} does not exist.")
        self.enabled.pop(unit, None)
        return self._ok(cmd)

    def _systemctl(self, verb: str, unit: str, cmd: str) -> RemoteResult:
        if verb == "is-active":
            state = self.state_of(unit)
            return RemoteResult(cmd, 0 if state == "active" else 3, state + "\n", "")
        if verb == "is-enabled":
            state = self.unit_file_state(unit)
            if not state:
                return RemoteResult(cmd, 1, "", f"Failed to get unit file state for {unit}: No such file or directory")
            return RemoteResult(cmd, 0 if state == "enabled" else 1, state + "\n", "")
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
        if args[:3] == ["systemctl", "enable", "--quiet"] and len(args) == 4:
            return self._enable(args[3], cmd)
        if args[:2] == ["systemctl", "show"] and len(args) > 3 and args[3::2] == ["-p"] * (len(args) // 2 - 1):
            props = args[4::2]
            if not set(props) <= SHOW.keys():
                raise UnknownCommand(f"FakeHost does not model these properties: {cmd}")
            return self._ok(cmd, "".join(f"{p}={SHOW[p](self, args[2])}\n" for p in props))
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
        if len(args) == 5 and args == container_image_argv(args[4]):
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
            unit, *paths = p
            self._stop(unit)
            self._reset_failed(unit)
            self._disable(unit, cmd)
            if gone := [path for path in paths if path in self.files]:
                self._rm(*gone)
                self._daemon_reload()
            return self._ok(cmd)
        if script == COMMIT_SCRIPT:
            return self._commit(cmd, *p)
        if script == EXISTING_SCRIPT:
            return self._ok(cmd, "".join(f"{path}\n" for path in p if path in self.files or path in self.dirs))
        if script == POLL_SCRIPT:
            (unit,) = p
            show = "".join(f"{prop}={SHOW[prop](self, unit)}\n" for prop in STATE_PROPERTIES)
            return self._ok(cmd, f"{show}---\n{self.socket_table()}")
        if script == LOGS_SCRIPT:
            unit, container, since = p
            out = [f"== journalctl -u {unit}", *[ln for t, ln in self.journal.get(unit, []) if t >= int(since)][-400:]]
            proc = next((q for q in self.running.values() if q.container == container), None)
            if proc is not None:  # docker inspect finds it only while it runs (--rm)
                out += [f"== docker logs {container}", *[ln for t, ln in proc.logs if t >= int(since)][-400:]]
            return self._ok(cmd, "\n".join(out) + "\n")
        return super()._script(script, p, cmd)
