"""A deploy never loses the host's own secrets, on the scripted FakeHost: merge, candidate copy, restore."""

from __future__ import annotations

import pytest
from helpers_deploy import (
    BACKUP,
    CAND_ENV,
    CAND_UNIT,
    ENV,
    MAIN,
    OPERATOR_ENV,
    FakeGate,
    run,
    with_incumbent,
)

from stackbuild.testing.fake_host import crashes

NEW = OPERATOR_ENV.replace("HF_TOKEN=operator-value", 'HF_TOKEN="new-value"')


def test_a_deploy_without_values_leaves_the_operators_file_as_it_was() -> None:
    host = with_incumbent(env=OPERATOR_ENV)
    rep = run(host, secrets={"HF_TOKEN": ""})  # a shell without the variable
    assert rep.exit_code == 0
    assert rep.steps[7].detail == f"{ENV}: unchanged (no values given)"
    assert (host.files[ENV], host.modes[ENV]) == (OPERATOR_ENV, 0o600)
    assert not {BACKUP, BACKUP + ".absent", CAND_ENV} & host.files.keys()
    assert host.running[MAIN].env == {"HF_TOKEN": "operator-value"}  # OTHER is not passed to the container


def test_a_promoted_deploy_updates_only_the_names_given() -> None:
    host = with_incumbent(env=OPERATOR_ENV)
    rep = run(host, secrets={"HF_TOKEN": "new-value"})
    assert rep.exit_code == 0 and rep.steps[7].detail == f"{ENV}: set HF_TOKEN"
    assert (host.files[ENV], host.modes[ENV]) == (NEW, 0o600)
    assert not {BACKUP, CAND_ENV} & host.files.keys()  # committed: no copy of the old file left
    assert host.running[MAIN].env == {"HF_TOKEN": "new-value"}


def test_a_name_neither_given_nor_on_the_host_is_reported() -> None:
    host = with_incumbent()
    rep = run(host)
    assert rep.steps[7].detail == (f"{ENV}: unchanged (no values given); neither given nor on the host, "
                                   "the server gets none: HF_TOKEN")
    assert ENV not in host.files and host.running[MAIN].env == {}


def test_side_by_side_without_values_gives_the_candidate_a_copy_of_the_operators_file() -> None:
    host = with_incumbent(env=OPERATOR_ENV)
    gate = FakeGate(host)
    rep = run(host, "side-by-side", gate=gate)
    assert rep.exit_code == 0
    assert gate.calls[0].running[CAND_UNIT][3] == {"HF_TOKEN": "operator-value"}
    assert (host.files[ENV], host.modes[ENV]) == (OPERATOR_ENV, 0o600)
    assert CAND_ENV not in host.files and host.running[MAIN].env == {"HF_TOKEN": "operator-value"}


@pytest.mark.parametrize("strategy", ["swap", "side-by-side"])
def test_a_rejected_candidate_leaves_the_incumbent_its_own_file(strategy: str) -> None:
    host = with_incumbent(env=OPERATOR_ENV, candidate=crashes("Error: No such option: --bad"))
    rep = run(host, strategy, secrets={"HF_TOKEN": "new-value"})
    assert (rep.outcome, rep.exit_code, rep.crash_signature) == ("rolled-back", 1, "bad-server-flag")
    assert (host.files[ENV], host.modes[ENV]) == (OPERATOR_ENV, 0o600)
    assert not {BACKUP, CAND_ENV} & host.files.keys()
    assert host.running[MAIN].env == {"HF_TOKEN": "operator-value"}


def test_a_secret_value_lands_only_in_the_env_files() -> None:
    host = with_incumbent(env=OPERATOR_ENV)
    rep = run(host, "side-by-side", secrets={"HF_TOKEN": "s3cr3t-value"})
    assert rep.exit_code == 0
    holding = sorted(p for p, text in host.files.items() if "s3cr3t" in text)
    assert holding == [ENV]  # the unit files, the state file and the stored result do not have it
    assert not any("s3cr3t" in a for c in host.commands for a in c)  # not on any command line
    assert "s3cr3t" not in rep.render() + rep.to_json() + rep.logs
