"""The gateway image's launcher (templates/smg_launch.py) refuses to start smg without a usable key: one line,
exit 2, and never the key's value in what it says. (With one, tests/test_gateway_smg.py runs it for real.)"""

from __future__ import annotations

import os
import subprocess
import sys

from stackbuild.paths import templates_dir

LAUNCHER = str(templates_dir() / "smg_launch.py")


def launch(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("K", "TEAM_A")}
    return subprocess.run([sys.executable, LAUNCHER, *args], capture_output=True, text=True, timeout=60,
                          env={**clean, **env})


def test_no_key_no_start() -> None:
    res = launch("--control-plane-key-env", "K", "--", "launch", "--port", "1")
    assert (res.returncode, res.stdout, res.stderr) == (
        2, "", "smg_launch: no usable control-plane key in K: remove the gateway's key file on its host and "
               "redeploy\n")
    bad = launch("--control-plane-key-env", "K", "--", "launch", K="has:colon-and-secret")
    assert bad.returncode == 2 and "colon-and-secret" not in bad.stderr


def test_a_data_plane_key_missing_from_the_secrets_file_stops_the_start() -> None:
    res = launch("--control-plane-key-env", "K", "--data-plane-key", "TEAM_A", "--", "launch", K="a" * 64)
    assert (res.returncode, res.stderr) == (
        2, "smg_launch: the data-plane key TEAM_A (gateway.api_keys) is not set in the gateway's secrets file\n")


def test_usage() -> None:
    for args in ([], ["--control-plane-key-env"], ["--control-plane-key-env", "K"], ["--bogus", "x", "--"]):
        res = launch(*args)
        assert res.returncode == 2 and res.stderr.startswith("smg_launch: "), args
        assert "usage: smg_launch.py --control-plane-key-env NAME" in res.stderr
