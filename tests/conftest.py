"""Shared fixtures: a hang guard for every test."""
import faulthandler
import sys

import pytest

HANG_GUARD_S = 60


@pytest.fixture(autouse=True)
def hang_guard():
    """Dump every thread's stack and exit if a test hangs (a deadlock in native code cannot
    be interrupted by a Python signal handler)."""
    faulthandler.dump_traceback_later(HANG_GUARD_S, exit=True, file=sys.__stderr__)
    yield
    faulthandler.cancel_dump_traceback_later()
