"""Shared fixtures and settings: a hang guard for every test, crash reports of forked
children kept with their test's output, hypothesis profiles and the `slow` marker.

HYPOTHESIS_PROFILE picks how hard the property tests search: `dev` (the default, a quick
local run), `ci` (what .ci/run uses) or `thorough` (before a release, or after touching a
kernel). `-m "not stress and not slow"` leaves out the tests that take seconds each.
"""

import faulthandler
import os
import signal
import sys
import threading

import pytest
from helpers import load_factor
from hypothesis import HealthCheck, settings

# The hang guard, in seconds on an idle machine; each test gets this times the load per
# CPU when it starts (helpers.load_factor), so that a loaded machine fails no test that is
# merely slow. A sanitized build runs several times slower (make sanitize raises it).
HANG_GUARD_S = float(os.environ.get("FASTLOAD_HANG_GUARD_S", "120"))

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


HANG_GUARD = pytest.StashKey["HangGuard"]()


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "slow: takes seconds (a training run, worker processes started many "
        "times); deselect with -m 'not stress and not slow'",
    )
    # Output capture is off here: file descriptor 2 is still the terminal.
    config.stash[HANG_GUARD] = HangGuard(terminal=os.dup(2))


def _crash_reports_to_stderr():
    """In a forked child, faulthandler writes to file descriptor 2 rather than to the
    terminal pytest gave it: during a test, that is the test's captured stderr, so that a
    child crashed on purpose (a worker that segfaults) prints nothing in a passing run,
    and a failing test shows what its children printed."""
    if faulthandler.is_enabled():
        faulthandler.enable(file=2)


os.register_at_fork(after_in_child=_crash_reports_to_stderr)


class HangGuard:
    """Fails a test that runs longer than its limit, and lets the run go on: a timer
    thread writes every thread's stack to the test's stderr, then signals the main thread
    (SIGUSR1), whose handler raises ``pytest.fail`` where the test is. A main thread that
    cannot run the handler (stuck in native code that never returns to Python) gets as
    long again; then faulthandler writes the stacks to the terminal and ends the process
    (exit code 1, no summary)."""

    def __init__(self, terminal):
        self.terminal = terminal
        self.lock = threading.Lock()
        self.timer = None
        self.limit = 0.0
        signal.signal(signal.SIGUSR1, self._expired)

    def arm(self, name):
        self.limit = HANG_GUARD_S * load_factor()
        with self.lock:
            self.timer = threading.Timer(
                self.limit, self._fire, (name, threading.main_thread().ident)
            )
            self.timer.daemon = True
            self.timer.start()
        faulthandler.dump_traceback_later(2 * self.limit, exit=True, file=self.terminal)

    def disarm(self):
        faulthandler.cancel_dump_traceback_later()
        with self.lock:
            timer, self.timer = self.timer, None
        if timer is not None:
            timer.cancel()

    def _fire(self, name, main):
        with self.lock:
            if self.timer is not threading.current_thread():
                return  # disarmed meanwhile
            print(
                f"hang guard: {name} still running after {self.limit:.0f} s; every thread's stack:",
                file=sys.__stderr__,
                flush=True,
            )
            faulthandler.dump_traceback(file=sys.__stderr__)
            signal.pthread_kill(main, signal.SIGUSR1)

    def _expired(self, signum, frame):
        if self.timer is not None:  # else the test ended as the signal came
            self.timer = None
            pytest.fail(
                f"hang guard: still running after {self.limit:.0f} s (the stacks of "
                f"every thread are in the captured stderr)"
            )


@pytest.fixture(autouse=True)
def hang_guard(request):
    """Fails the test if it runs longer than HANG_GUARD_S times the load factor when it
    starts (see HangGuard)."""
    guard = request.config.stash[HANG_GUARD]
    guard.arm(request.node.nodeid)
    yield
    guard.disarm()
