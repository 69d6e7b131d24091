"""A promotion that passed is kept when the channel tag will not move (issue 10, item 6).

The host pulls the candidate through a loopback proxy in front of the real registry
that refuses every manifest PUT (503), so the deploy passes its gate, commits on the
real host, and then cannot move the channel: it must keep the candidate serving, say
the channel is stale and how to move it, and exit 4 — no rollback.
"""

from __future__ import annotations

import pytest
from test_deploy_support import (
    Project,
    deploy_host,  # noqa: F401  (fixture)
    project_fixture,
    sim_image,  # noqa: F401  (fixture)
)
from test_push_retry import FlakyRegistry, flaky  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


project = project_fixture("channel")


def test_registry_down_at_channel_move_keeps_the_promotion(project: Project,
                                                           flaky: FlakyRegistry) -> None:  # noqa: F811
    p = project
    flaky.fail_times, flaky.fail_status = 10**6, 503
    image = f"127.0.0.1:{flaky.port}/stackbuild@{p.image.digest}"
    r = p.deploy(None, image=image)
    out = r.stdout + r.stderr
    assert r.returncode == 4, out
    assert "outcome: promoted (exit 4)" in out
    assert f"the channel '{p.service}' is stale" in out
    assert f"stackbuild promote {image} --channel {p.service}" in out
    assert len(flaky.manifest_puts) == 3  # retried, then reported
    st = p.state()
    assert st["current"]["image"] == image and st.get("pending") is None
    assert p.active() == "active" and p.serving()
