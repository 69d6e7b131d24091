"""The order the workers take the test modules in (tests/conftest.py): longest first."""

from __future__ import annotations

from pathlib import Path

from conftest import LONGEST_FIRST, run_order

TESTS = Path(__file__).resolve().parent


def test_every_module_named_longest_first_exists() -> None:
    """A renamed module would fall silently to the back of the run: each name is a test module."""
    assert [m for m in LONGEST_FIRST if not (TESTS / f"{m}.py").is_file()] == []


def test_the_named_modules_go_first_in_their_order_and_the_rest_after_them() -> None:
    assert [run_order(m) for m in ("test_deploy_demo", "test_fleet_integration", "test_deploy_host", "")] == \
        [0, 1, len(LONGEST_FIRST), len(LONGEST_FIRST)]
