"""ssh.connect's pieces, each on its own: paramiko's arguments, the host keys it loads, the host key
policy, what it retries, and the sentence each way of failing to connect gives (exit 4); and closing a
connection that died.

Real paramiko objects (a client that never connects, keys made here) and a loopback port nothing
listens on: no SSH server, no network. Closing is shown on a stand-in for fabric's Connection that
raises what paramiko raises from a dead transport.
"""

from __future__ import annotations

import socket
from pathlib import Path

import paramiko
import pytest

from stackbuild.errors import InfraError, InputError
from stackbuild.host import ssh
from stackbuild.host.ssh import (
    HostAddress,
    SshOptions,
    connect_error,
    connect_kwargs,
    load_host_keys,
    parse_host,
    retrying,
)


@pytest.fixture(scope="module")
def key() -> paramiko.RSAKey:
    return paramiko.RSAKey.generate(1024)


def test_every_phase_of_opening_is_bounded_by_the_connect_timeout() -> None:
    assert connect_kwargs(SshOptions(connect_timeout_s=7.0)) == {
        "banner_timeout": 7.0, "auth_timeout": 7.0, "channel_timeout": 7.0}
    assert connect_kwargs(SshOptions(key_filename="/k/id")) == {
        "banner_timeout": 10.0, "auth_timeout": 10.0, "channel_timeout": 10.0, "key_filename": "/k/id"}


def test_the_known_hosts_file_is_loaded_when_it_exists(tmp_path: Path, key: paramiko.RSAKey) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(f"[gpu1]:2222 ssh-rsa {key.get_base64()}\n")
    client = paramiko.SSHClient()
    load_host_keys(client, known)
    # paramiko keeps system host keys apart from the ones it would save; both are checked on connect
    assert client._system_host_keys.lookup("[gpu1]:2222") == {"ssh-rsa": key}
    load_host_keys(paramiko.SSHClient(), tmp_path / "absent")  # none yet: nothing to load, no error


def test_a_known_hosts_file_that_is_not_one_is_refused(tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(InputError) as err:
        load_host_keys(paramiko.SSHClient(), known)
    assert str(err.value) == (f"--known-hosts {known}: not a readable known_hosts file (UnicodeDecodeError); "
                              "pass an OpenSSH known_hosts text file")


def test_an_unknown_host_key_is_refused_or_trusted_on_first_use(tmp_path: Path, key: paramiko.RSAKey) -> None:
    known = tmp_path / "ssh" / "known_hosts"
    with pytest.raises(ssh._UnknownHostKey) as unknown:
        ssh._HostKeyPolicy(known, accept_new=False).missing_host_key(paramiko.SSHClient(), "[gpu1]:2222", key)
    assert (unknown.value.name, unknown.value.host, unknown.value.port) == ("[gpu1]:2222", "gpu1", 2222)
    assert unknown.value.fingerprint == f"ssh-rsa {ssh._fingerprint(key)}" and not known.exists()
    client = paramiko.SSHClient()
    ssh._HostKeyPolicy(known, accept_new=True).missing_host_key(client, "gpu1", key)
    assert known.read_text() == f"gpu1 ssh-rsa {key.get_base64()}\n"
    assert client.get_host_keys().lookup("gpu1") == {"ssh-rsa": key}


def test_only_a_transient_error_is_retried_and_only_connect_attempts_times() -> None:
    calls: list[int] = []

    def refused() -> None:
        calls.append(1)
        raise ConnectionRefusedError("refused")

    slept: list[float] = []
    fn = retrying(refused, SshOptions(connect_attempts=2))
    fn.retry.sleep = slept.append  # type: ignore[attr-defined]  # tenacity's hook: the wait, not spent
    with pytest.raises(ConnectionRefusedError):
        fn()
    assert (len(calls), slept) == (2, [1.0])  # one wait of 1 s between the two attempts
    calls.clear()

    def bad_auth() -> None:
        calls.append(1)
        raise paramiko.AuthenticationException("no")

    with pytest.raises(paramiko.AuthenticationException):
        retrying(bad_auth, SshOptions(connect_attempts=3))()
    assert len(calls) == 1


def test_each_way_of_failing_to_connect_says_what_to_do(tmp_path: Path, key: paramiko.RSAKey) -> None:
    known, opts = tmp_path / "known_hosts", SshOptions(connect_timeout_s=5.0, connect_attempts=2)

    def said(err: BaseException) -> str | None:
        got = connect_error(err, "root@gpu1:2222", known, opts)
        assert got is None or isinstance(got, InfraError)
        return None if got is None else str(got)

    fp = f"ssh-rsa {ssh._fingerprint(key)}"
    assert said(ssh._UnknownHostKey("[gpu1]:2222", "gpu1", 2222, fp)) == (
        f"SSH to root@gpu1:2222: host key {fp} of [gpu1]:2222 is not in {known}; check the key with the host's "
        f"owner, then add it: ssh-keyscan -p 2222 gpu1 >> {known} (or re-run with --accept-new-host-key)")
    assert said(paramiko.BadHostKeyException("gpu1", key, key)) == (
        f"SSH to root@gpu1:2222: the host key CHANGED ({fp}); this may be an attack. If the host was reinstalled, "
        "remove the old line with ssh-keygen -R and trust the new key deliberately")
    assert said(paramiko.AuthenticationException("Authentication failed.")) == (
        "SSH to root@gpu1:2222: authentication failed (Authentication failed.); check the user, the key "
        "(IdentityFile in ~/.ssh/config) or the agent")
    for err, why in [(TimeoutError("timed out"), "timed out"),
                     (OSError(113, "No route to host"), "[Errno 113] No route to host"),
                     (paramiko.SSHException("Error reading SSH protocol banner"), "Error reading SSH protocol banner"),
                     (EOFError(), "EOFError")]:  # an error without a message is named by its type
        assert said(err) == (f"SSH to root@gpu1:2222: cannot connect within 5s (2 attempts): {why}; "
                             "check that the host is up and sshd listens on that port")
    assert said(InputError("--known-hosts x: not a readable known_hosts file")) is None  # raised as it is
    assert said(RuntimeError("a bug")) is None


def test_connect_to_a_port_nothing_listens_on_fails_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when connect runs: nothing listens there
    opts = SshOptions(connect_timeout_s=2.0, connect_attempts=1, known_hosts=tmp_path / "known_hosts",
                      ssh_config=tmp_path / "ssh_config")
    (tmp_path / "ssh_config").write_text("")
    with pytest.raises(InfraError) as err:
        ssh.connect(HostAddress("127.0.0.1", "root", port), opts)
    text = str(err.value)
    assert text.startswith(f"SSH to root@127.0.0.1:{port}: cannot connect within 2s (1 attempts): ")
    assert text.endswith("; check that the host is up and sshd listens on that port") and "\n" not in text


class _DeadConnection:
    """fabric's Connection as the deploy leaves it when the SSH session died: its SFTP session (every
    put_text opens one) is closed first, and paramiko raises from there (seen as EOFError in a CI run:
    the kill happened before paramiko's transport thread noticed)."""

    transport = None

    def __init__(self, err: BaseException) -> None:
        self.err = err
        self.closes = 0

    def close(self) -> None:
        self.closes += 1
        raise self.err


@pytest.mark.parametrize("err", [EOFError(), OSError("Socket is closed"), paramiko.SSHException("dead")])
def test_closing_a_dead_connection_never_raises(err: BaseException) -> None:
    """Raised from close, EOFError became click's Abort ("stackbuild: aborted", exit 4) and the deploy
    skipped its recovery over a new connection, leaving the host's pending marker and a stopped incumbent."""
    conn = _DeadConnection(err)
    ssh.FabricRemote(conn, parse_host("root@127.0.0.1:2222"), SshOptions()).close()
    assert conn.closes == 1


def test_closing_raises_what_is_not_a_dead_connection() -> None:
    conn = _DeadConnection(ValueError("a bug of ours"))
    with pytest.raises(ValueError, match="a bug of ours"):
        ssh.FabricRemote(conn, parse_host("root@127.0.0.1:2222"), SshOptions()).close()
