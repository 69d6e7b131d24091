"""The one module that owns SSH: address parsing, the Fabric connection factory, `Remote`.

Remote commands are argv lists joined with `shlex.join`, so a value from a spec
is one literal word in the remote shell whatever it contains. Scripts that need
shell syntax are constant text run as `sh -c SCRIPT sh ARG...`: the values
travel as positional parameters, never spliced into the script.

`connect()` is strict about host keys (known_hosts loaded, an unknown key is
rejected with a message saying how to trust it), bounds connect and command
time and turns on keepalive so a dead peer fails in seconds. Only opening the
connection is retried; a command that failed is never re-run behind the
caller's back (the deploy flow decides what is safe to repeat).
"""

from __future__ import annotations

import base64
import hashlib
import io
import re
import select
import shlex
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tenacity import retry, retry_if_exception_type, stop_after_attempt, stop_before_delay, wait_fixed

from stackbuild.errors import InfraError, InputError
from stackbuild.spec.kinds import SSH_TARGET

_HOST_RE = SSH_TARGET  # the spec's kind for an address, so a spec value and --host parse alike


@dataclass(frozen=True)
class HostAddress:
    host: str  # a hostname, an IP or an ~/.ssh/config alias
    user: str | None = None
    port: int | None = None

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port else ""
        return f"{user}{host}{port}"

    @property
    def is_loopback(self) -> bool:
        return self.host == "localhost" or self.host.startswith("127.") or self.host == "::1"


def parse_host(text: str) -> HostAddress:
    """`[USER@]HOST[:PORT]` (IPv6 as `[::1]:22`) -> HostAddress; bad input is an InputError."""
    m = _HOST_RE.match(text.strip())
    if not m:
        raise InputError(f"--host {text!r}: expected [USER@]HOST[:PORT] (e.g. root@gpu1:22 or an ~/.ssh/config alias)")
    port = int(m["port"]) if m["port"] else None
    if port is not None and not 1 <= port <= 65535:
        raise InputError(f"--host {text!r}: port {port} is out of range 1-65535")
    return HostAddress(host=m["v6"] or m["host"], user=m["user"], port=port)


def quote_argv(argv: Sequence[str]) -> str:
    """One remote command line where each element stays one literal word."""
    if not argv:
        raise ValueError("empty remote command")
    return shlex.join(str(a) for a in argv)


def sh_argv(script: str, *args: str) -> list[str]:
    """argv running a constant shell script with values passed as $1, $2, ..."""
    return ["sh", "-c", script, "sh", *args]


@dataclass(frozen=True)
class RemoteResult:
    command: str
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class Remote(Protocol):
    """What deploy code gets: a host to run argv on and to put files on."""

    address: str
    dry_run: bool

    def run(
        self,
        argv: Sequence[str],
        *,
        check: bool = True,
        timeout: float | None = None,
        what: str = "",
        changes: bool = True,
    ) -> RemoteResult: ...

    def put_text(self, text: str, path: str, *, mode: int = 0o644, secret: bool = False) -> None: ...

    def close(self) -> None: ...


class ConnectionLost(InfraError):
    """The SSH transport died under a command (peer gone, session killed)."""


# Reading a file on the host: an absent one reads as empty text (exit 0) ...
READ_IF_EXISTS_SCRIPT = '[ ! -e "$1" ] || cat "$1"'
# ... or fails (exit 1), so absent and empty stay apart.
READ_FILE_SCRIPT = '[ -e "$1" ] && cat "$1"'


def put_text_script() -> str:
    # The uploaded temp file is renamed over the target only after chmod, so a
    # reader sees the old file or the complete new one, never a partial one.
    return 'chmod "$3" "$1" && mv -f "$1" "$2"'


@dataclass
class SshOptions:
    connect_timeout_s: float = 10.0
    command_timeout_s: float = 120.0
    keepalive_s: int = 5
    connect_attempts: int = 3
    accept_new_host_key: bool = False
    known_hosts: Path | None = None  # default: ~/.ssh/known_hosts
    key_filename: str | None = None  # default: ~/.ssh/config IdentityFile, agent, ~/.ssh/id_*
    ssh_config: Path | None = None  # default: ~/.ssh/config


class FabricRemote:
    """A live connection. Build with `connect()`."""

    dry_run = False

    def __init__(self, conn: Any, address: HostAddress, opts: SshOptions) -> None:
        self._conn = conn
        self.address = str(address)
        self._opts = opts

    def run(
        self,
        argv: Sequence[str],
        *,
        check: bool = True,
        timeout: float | None = None,
        what: str = "",
        changes: bool = True,
    ) -> RemoteResult:
        from invoke.exceptions import CommandTimedOut  # loaded with fabric by connect(): see there

        cmd = quote_argv(argv)
        limit = timeout if timeout is not None else self._opts.command_timeout_s
        if not self._transport_alive():
            # Fabric would silently reopen; a lost connection must surface so the
            # flow (not the transport) decides what is safe to repeat.
            raise ConnectionLost(
                f"SSH connection to {self.address} lost before {what or 'a remote command'}; "
                "re-run the same command: every step converges",
                command=cmd,
            )
        try:
            res = self._conn.run(cmd, hide=True, warn=True, in_stream=False, timeout=limit, pty=False)
        except CommandTimedOut as err:
            raise InfraError(
                f"{what or 'remote command'} on {self.address}: timed out after {limit:.0f}s",
                command=cmd,
                output=_tail(err.result.stdout + err.result.stderr),
            ) from err
        except (OSError, EOFError, _paramiko_errors()) as err:
            raise ConnectionLost(
                f"SSH connection to {self.address} lost during {what or 'a remote command'}: "
                f"{str(err) or type(err).__name__}; re-run the same command: every step converges",
                command=cmd,
            ) from err
        out = RemoteResult(cmd, int(res.exited), res.stdout, res.stderr)
        if not self._transport_alive() and out.returncode < 0:
            raise ConnectionLost(
                f"SSH connection to {self.address} lost during {what or 'a remote command'}; "
                "re-run the same command: every step converges",
                command=cmd,
            )
        if check and not out.ok:
            raise InfraError(
                f"{what or 'remote command'} failed on {self.address}",
                command=cmd,
                returncode=out.returncode,
                output=out.stdout + out.stderr,
            )
        return out

    def put_text(self, text: str, path: str, *, mode: int = 0o644, secret: bool = False) -> None:
        tmp = f"{path}.stackbuild-tmp"
        # A secret is born 0600: the temp file must never be world-readable, even briefly.
        self.run(["install", "-m", "0600", "/dev/null", tmp], what=f"create {tmp}")
        try:
            self._conn.put(io.BytesIO(text.encode()), remote=tmp)
        except (OSError, EOFError, _paramiko_errors()) as err:
            raise ConnectionLost(
                f"SSH connection to {self.address} lost while uploading {path}: {err}; re-run the same command",
            ) from err
        self.run(sh_argv(put_text_script(), tmp, path, f"{mode:04o}"), what=f"install {path}")

    def _transport_alive(self) -> bool:
        t = self._conn.transport
        return bool(t is not None and t.is_active())

    def forward(self, remote_port: int) -> Tunnel:
        """A local port forwarded to the host's 127.0.0.1:remote_port (use as a context)."""
        return Tunnel(self._conn.transport, remote_port)

    def close(self) -> None:
        # fabric closes an SFTP session (opened by put_text) before the connection, and on a dead
        # transport paramiko raises EOFError there: click would turn it into "aborted" and skip
        # the flow's recovery. A connection being closed is gone either way.
        try:
            self._conn.close()
        except (OSError, EOFError, _paramiko_errors()):
            pass


class Tunnel:
    """A local listener whose connections become direct-tcpip channels to the host.

    Fabric's forward_local raises at exit if any channel failed to open, which
    is exactly what readiness probing does while the server is still loading;
    here a failed channel just closes that one client connection.
    """

    def __init__(self, transport: Any, remote_port: int) -> None:
        self._transport = transport
        self._remote_port = remote_port
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self._sock.settimeout(0.2)
        self.local_port = int(self._sock.getsockname()[1])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> int:
        self._thread.start()
        return self.local_port

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            chan = self._transport.open_channel(
                "direct-tcpip", ("127.0.0.1", self._remote_port), client.getpeername(), timeout=5
            )
        except Exception:  # the port is not open yet, or the transport died
            client.close()
            return
        try:
            while not self._stop.is_set():
                ready, _, _ = select.select([client, chan], [], [], 0.5)
                if client in ready:
                    data = client.recv(65536)
                    if not data:
                        break
                    chan.sendall(data)
                if chan in ready:
                    data = chan.recv(65536)
                    if not data:
                        break
                    client.sendall(data)
        except OSError:
            pass
        finally:
            chan.close()
            client.close()


def _paramiko_errors() -> type[Exception]:
    import paramiko  # loaded by connect() already; kept off module import (see there)

    return paramiko.SSHException  # type: ignore[no-any-return]


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _free_local_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def known_hosts_name(host: str, port: int) -> str:
    """How OpenSSH (and paramiko) file a host in known_hosts."""
    return host if port == 22 else f"[{host}]:{port}"


def trust_hint(host: str, port: int, known_hosts: str = "~/.ssh/known_hosts") -> str:
    port_opt = f"-p {port} " if port != 22 else ""
    return (
        f"check the key with the host's owner, then add it: "
        f"ssh-keyscan {port_opt}{host} >> {known_hosts} (or re-run with --accept-new-host-key)"
    )


def connect(address: HostAddress, opts: SshOptions | None = None) -> FabricRemote:
    """Open a strict, bounded SSH connection (retried only while it is being opened)."""
    # fabric and paramiko (~170 ms) load here, when a connection is opened, not when the CLI starts
    from fabric import Config, Connection

    opts = opts or SshOptions()
    config = Config(
        overrides={"load_ssh_configs": True},
        runtime_ssh_path=str(opts.ssh_config) if opts.ssh_config is not None else None,
    )
    kwargs = connect_kwargs(opts)
    known = opts.known_hosts or Path.home() / ".ssh" / "known_hosts"

    def attempt() -> Any:
        conn = Connection(host=address.host, user=address.user, port=address.port, config=config,
                          connect_timeout=int(max(1, opts.connect_timeout_s)), connect_kwargs=dict(kwargs))
        client = conn.client
        load_host_keys(client, known)
        client.set_missing_host_key_policy(_HostKeyPolicy(known, opts.accept_new_host_key))
        conn.open()
        conn.transport.set_keepalive(opts.keepalive_s)
        return conn

    try:
        conn = retrying(attempt, opts)()
    except Exception as err:
        if (refusal := connect_error(err, str(address), known, opts)) is None:
            raise
        raise refusal from None
    return FabricRemote(conn, address, opts)


def connect_kwargs(opts: SshOptions) -> dict[str, Any]:
    """paramiko's connect() arguments: every phase bounded by the connect timeout; an explicit key."""
    kw: dict[str, Any] = {"banner_timeout": opts.connect_timeout_s, "auth_timeout": opts.connect_timeout_s,
                          "channel_timeout": opts.connect_timeout_s}
    if opts.key_filename:
        kw["key_filename"] = opts.key_filename
    return kw


def load_host_keys(client: Any, known: Path) -> None:
    """The system's host keys, then `known` when it exists; one that is not a known_hosts file is refused."""
    import paramiko

    client.load_system_host_keys()
    if known.exists():
        try:
            client.load_system_host_keys(str(known))
        except (OSError, UnicodeDecodeError, paramiko.SSHException) as err:
            raise InputError(f"--known-hosts {known}: not a readable known_hosts file ({type(err).__name__}); "
                             "pass an OpenSSH known_hosts text file") from None


def transient_errors() -> tuple[type[BaseException], ...]:
    """What opening a connection retries: timeouts, refused or reset connections, nothing listening."""
    import paramiko

    return socket.timeout, ConnectionError, EOFError, paramiko.ssh_exception.NoValidConnectionsError


def retrying(attempt: Callable[[], Any], opts: SshOptions) -> Callable[[], Any]:
    """`attempt` retried on a transient error, 1 s apart, within connect_attempts and their timeouts."""
    return retry(
        retry=retry_if_exception_type(transient_errors()),
        stop=stop_after_attempt(opts.connect_attempts)
        | stop_before_delay(opts.connect_timeout_s * opts.connect_attempts),
        wait=wait_fixed(1),
        reraise=True,
    )(attempt)


def connect_error(err: BaseException, target: str, known: Path, opts: SshOptions) -> InfraError | None:
    """What a failed connect says (exit 4), by its cause; None for an error that is not a connect's."""
    import paramiko

    if isinstance(err, _UnknownHostKey):
        return InfraError(f"SSH to {target}: host key {err.fingerprint} of {err.name} is not in {known}; "
                          + trust_hint(err.host, err.port, str(known)))
    if isinstance(err, paramiko.BadHostKeyException):
        return InfraError(f"SSH to {target}: the host key CHANGED ({err.key.get_name()} "
                          f"{_fingerprint(err.key)}); this may be an attack. If the host was reinstalled, "
                          f"remove the old line with ssh-keygen -R and trust the new key deliberately")
    if isinstance(err, paramiko.AuthenticationException):
        return InfraError(f"SSH to {target}: authentication failed ({err}); check the user, the key "
                          "(IdentityFile in ~/.ssh/config) or the agent")
    if isinstance(err, (*transient_errors(), OSError, paramiko.SSHException)):
        return InfraError(f"SSH to {target}: cannot connect within {opts.connect_timeout_s:.0f}s "
                          f"({opts.connect_attempts} attempts): {str(err) or type(err).__name__}; "
                          "check that the host is up and sshd listens on that port")
    return None


def _fingerprint(key: Any) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class _UnknownHostKey(Exception):
    def __init__(self, name: str, host: str, port: int, fingerprint: str) -> None:
        super().__init__(name)
        self.name, self.host, self.port, self.fingerprint = name, host, port, fingerprint


class _HostKeyPolicy:
    """Reject unknown keys, or trust on first use and append the key to known_hosts."""

    def __init__(self, known_hosts: Path, accept_new: bool) -> None:
        self.known_hosts = known_hosts
        self.accept_new = accept_new

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        host, port = _split_known_name(hostname)
        if not self.accept_new:
            raise _UnknownHostKey(hostname, host, port, f"{key.get_name()} {_fingerprint(key)}")
        self.known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with self.known_hosts.open("a") as fh:
            fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)


def _split_known_name(name: str) -> tuple[str, int]:
    m = re.match(r"^\[(.+)\]:(\d+)$", name)
    return (m[1], int(m[2])) if m else (name, 22)
