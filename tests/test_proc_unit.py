"""effects/proc: the one owner of local subprocesses (probes, streamed builds, long-running children)."""

from __future__ import annotations

import io
import sys
import tempfile
import time

import pytest

from stackbuild.effects import proc
from stackbuild.errors import InfraError

PY = sys.executable


def test_quiet_gives_stdout_of_a_success_and_none_otherwise() -> None:
    assert proc.quiet([PY, "-c", "print('v1.2')"]) == "v1.2\n"
    assert proc.quiet([PY, "-c", "import sys; print('x'); sys.exit(3)"]) is None
    assert proc.quiet(["/nonexistent/stackbuild-no-such-tool"]) is None
    assert proc.quiet([PY, "-c", "import time; time.sleep(5)"], timeout=0.2) is None


def test_stream_logs_every_line_keeps_the_tail_and_reports_the_exit_code() -> None:
    log = io.StringIO()
    seen: list[str] = []
    code = "import sys\nfor i in range(50): print(i)\nprint('err', file=sys.stderr)\nsys.exit(7)"
    done = proc.stream([PY, "-u", "-c", code], env={"PATH": "/usr/bin:/bin"}, log=log, timeout=30,
                       on_line=seen.append, what="build", tail_lines=3)
    assert done.returncode == 7
    assert done.tail == ("48\n", "49\n", "err\n")
    assert seen == [*(str(i) for i in range(50)), "err"]
    assert log.getvalue() == "".join(f"{i}\n" for i in range(50)) + "err\n"


def test_stream_past_its_timeout_kills_the_child_and_names_what_timed_out() -> None:
    code = "import time\nprint('started', flush=True)\ntime.sleep(30)"
    with pytest.raises(InfraError) as err:
        proc.stream([PY, "-c", code], env={}, log=io.StringIO(), timeout=1, what="build")
    assert str(err.value).splitlines()[0] == "build timed out after 1s"
    assert err.value.output == "started\n"


def test_stream_of_a_missing_program_is_one_infra_error() -> None:
    with pytest.raises(InfraError, match="cannot run /nonexistent/x"):
        proc.stream(["/nonexistent/x"], env={}, log=io.StringIO(), timeout=5, what="build")


def test_child_runs_until_stopped_and_stop_reaps_it() -> None:
    with tempfile.TemporaryFile() as log:
        child = proc.Child([PY, "-c", "import time; print('up', flush=True); time.sleep(60)"], log=log)
        deadline = time.monotonic() + 10
        while log.tell() == 0 and time.monotonic() < deadline:
            log.seek(0, 2)
            time.sleep(0.02)
        assert child.poll() is None
        assert child.stop(grace_s=5) == -15  # SIGTERM ended it
        assert child.poll() == -15


def test_child_that_ignores_sigterm_is_killed_after_its_grace() -> None:
    code = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(60)"
    with tempfile.TemporaryFile() as log:
        child = proc.Child([PY, "-c", code], log=log)
        deadline = time.monotonic() + 10
        while log.tell() == 0 and time.monotonic() < deadline:
            log.seek(0, 2)
            time.sleep(0.02)
        assert child.stop(grace_s=0.3) == -9


def test_child_exit_code_is_read_by_wait() -> None:
    with tempfile.TemporaryFile() as log:
        assert proc.Child([PY, "-c", "raise SystemExit(4)"], log=log).wait(10) == 4
