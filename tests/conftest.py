"""Shared fixtures and settings: a hang guard for every test, hypothesis profiles and the
`slow` marker.

HYPOTHESIS_PROFILE picks how hard the property tests search: `dev` (the default, a quick
local run), `ci` (what .ci/run uses) or `thorough` (before a release, or after touching a
kernel). `-m "not stress and not slow"` leaves out the tests that take seconds each.
"""

import faulthandler
import os
import sys

import pytest
from hypothesis import HealthCheck, settings

# A sanitized build runs several times slower (make sanitize raises it).
HANG_GUARD_S = float(os.environ.get("FASTLOAD_HANG_GUARD_S", "60"))

# No deadlines: timings on a shared machine say nothing about correctness.
settings.register_profile("dev", max_examples=50, deadline=None)
# `ci` draws the same examples on every run (derandomize), so that a CI run is reproducible
# and a red one is the change's doing; `dev` and `thorough` search anew each time.
settings.register_profile(
    "ci",
    max_examples=150,
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "thorough",
    max_examples=2000,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "slow: takes seconds (a training run, worker processes started many "
        "times); deselect with -m 'not stress and not slow'",
    )


@pytest.fixture(autouse=True)
def hang_guard():
    """Dump every thread's stack and exit if a test hangs (a deadlock in native code cannot
    be interrupted by a Python signal handler)."""
    faulthandler.dump_traceback_later(HANG_GUARD_S, exit=True, file=sys.__stderr__)
    yield
    faulthandler.cancel_dump_traceback_later()
