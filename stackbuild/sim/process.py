"""`stackbuild sim` as a child process on a free loopback port: what the gate tests, the
simulator's own tests, bench/ and scripts/ start, so none of them imports a test file."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import tempfile
import time
from collections.abc import Iterator

from stackbuild.effects.net import free_port
from stackbuild.effects.proc import Child
from stackbuild.effects.readiness import HttpProbe, Pace, wait_ready


class SimProc:
    """`stackbuild sim` in a child process on a free loopback port; always stopped."""

    def __init__(self, *args: str, warmup_s: float = 0.2, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # closed in stop(): the log outlives this method
        self.log = tempfile.NamedTemporaryFile(prefix="sim-", suffix=".log", delete=False)  # noqa: SIM115
        argv = [sys.executable, "-m", "stackbuild", "sim", "--port", str(self.port),
                "--warmup-s", str(warmup_s), *args]
        self.proc = Child(argv, log=self.log)

    def wait_port(self, timeout: float = 15.0) -> SimProc:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sim exited {self.proc.poll()}: {self.output()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port),
                                                                        0.2):
                return self
            time.sleep(0.05)
        raise RuntimeError(f"sim did not listen within {timeout}s: {self.output()}")

    def wait_up(self, timeout: float = 15.0) -> SimProc:
        ready = wait_ready(HttpProbe(self.url, gone=self._exited), start_deadline_s=timeout, pace=Pace(interval_s=0.05))
        if not ready.ok:
            raise RuntimeError(f"sim not ready ({ready.stage}: {ready.detail}): {self.output()}")
        return self

    def _exited(self) -> str | None:
        code = self.proc.poll()
        return None if code is None else f"sim exited {code}"

    def output(self) -> str:
        with open(self.log.name, encoding="utf-8", errors="replace") as f:
            return f.read()[-2000:]

    def stop(self) -> int:
        code = self.proc.stop(grace_s=10)
        self.log.close()
        os.unlink(self.log.name)
        return code


@contextlib.contextmanager
def sim(*args: str, up: bool = True, warmup_s: float = 0.2, port: int | None = None) -> Iterator[SimProc]:
    s = SimProc(*args, warmup_s=warmup_s, port=port)
    try:
        s.wait_port()
        if up:
            s.wait_up()
        yield s
    finally:
        s.stop()

