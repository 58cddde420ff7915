"""Fixtures of the execution tests."""

from __future__ import annotations

import pytest

from support.pool_checks import make_leak_check


@pytest.fixture
def leak_check():
    """Returns a function asserting that no thread, child process or shared memory name was left behind."""
    return make_leak_check()
