"""fastload/_base/children.py: the process toolkit every transport forks its workers
with. Real forked processes throughout: pipes, stop, deaths, errors carried back."""

import os
import pickle
import signal
import time
from dataclasses import FrozenInstanceError, dataclass

import pytest

from fastload._base.children import (
    ChildError,
    Stop,
    Tagged,
    WorkerDied,
    WorkerError,
    death_message,
    describe_error,
    end_processes,
    fork_workers,
    rebuilt,
    remote_error,
    serve,
)

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="forked workers")


def _echo(conn, offset):
    """Replies to a number with (its worker's offset + the number, the worker's pid)."""
    serve(conn, lambda n: (offset + n, os.getpid()))


def _received(pipes, count, limit=10.0):
    replies, deadline = [], time.monotonic() + limit
    while len(replies) < count and time.monotonic() < deadline:
        replies += pipes.receive(0.5)
    return replies


def test_each_worker_answers_through_its_own_pipe_and_replies_are_counted():
    pipes = fork_workers(3, _echo, "test-echo", lambda k: (100 * k,), "the test")
    try:
        for k in range(3):
            pipes.request(k, k + 1)
        assert pipes.outstanding == [1, 1, 1]
        replies = sorted(_received(pipes, 3))
        assert [(k, value) for k, (value, _) in replies] == [(0, 1), (1, 102), (2, 203)]
        assert [pid for _, (_, pid) in replies] == [p.pid for p in pipes.procs]
        assert pipes.outstanding == [0, 0, 0]
    finally:
        pipes.close(graceful=True)
    assert [p.exitcode for p in pipes.procs] == [0, 0, 0]  # ended by Stop, not killed


def test_a_message_answered_with_none_gets_no_reply():
    pipes = fork_workers(
        1, lambda conn: serve(conn, lambda m: None), "test-quiet", lambda k: (), ""
    )
    try:
        pipes.send(0, "anything")
        assert pipes.receive(0.3) == []
    finally:
        pipes.close(graceful=True)
    assert pipes.procs[0].exitcode == 0


@pytest.mark.parametrize(
    ("end", "how"),
    [
        (lambda: os._exit(3), "exited with code 3"),
        (lambda: os.kill(os.getpid(), signal.SIGKILL), "was killed by SIGKILL"),
    ],
)
def test_a_worker_that_dies_raises_worker_died_naming_it_and_how(end, how):
    pipes = fork_workers(
        2, lambda conn: serve(conn, lambda m: end()), "test-die", lambda k: (), "it"
    )
    try:
        pipes.request(1, "die")
        with pytest.raises(WorkerDied) as raised:
            _received(pipes, 1)
        victim = pipes.procs[1]
        assert raised.value.pid == victim.pid
        assert raised.value.exitcode == victim.exitcode
        assert str(raised.value).startswith(f"fastload worker process {victim.pid} {how}; it ")
        assert isinstance(raised.value, RuntimeError)
    finally:
        pipes.close(graceful=False)
    assert not any(p.is_alive() for p in pipes.procs)


def test_a_worker_ignores_ctrl_c_and_serves_on():
    pipes = fork_workers(1, _echo, "test-sigint", lambda k: (0,), "the test")
    try:
        os.kill(pipes.procs[0].pid, signal.SIGINT)
        pipes.request(0, 7)
        assert [value for _, (value, _) in _received(pipes, 1)] == [7]
    finally:
        pipes.close(graceful=True)


def test_ctrl_c_as_a_worker_starts_never_kills_it():
    # SIGINT sent the moment the fork returns, before the child's start-up ran: blocked
    # from the fork on, it is dropped once the child ignores it.
    for _ in range(20):
        pipes = fork_workers(2, _echo, "test-sigint-early", lambda k: (k,), "the test")
        try:
            for proc in pipes.procs:
                os.kill(proc.pid, signal.SIGINT)
            for worker in range(2):
                pipes.request(worker, 1)
            assert sorted(value for _, (value, _) in _received(pipes, 2)) == [1, 2]
        finally:
            pipes.close(graceful=True)


def test_a_worker_ends_when_its_parents_end_of_the_pipe_closes():
    pipes = fork_workers(1, _echo, "test-eof", lambda k: (0,), "the test")
    pipes.conns[0].close()
    pipes.procs[0].join(10.0)
    assert pipes.procs[0].exitcode == 0


def test_closing_in_another_process_than_the_parent_leaves_the_workers_alone():
    pipes = fork_workers(1, _echo, "test-parent", lambda k: (0,), "the test")
    try:
        pipes.close(graceful=False, parent=os.getpid() + 1)
        assert pipes.procs[0].is_alive()
    finally:
        pipes.close(graceful=True)


def test_end_processes_kills_what_does_not_end_in_time():
    pipes = fork_workers(2, lambda conn: time.sleep(60), "test-stuck", lambda k: (), "the test")
    began = time.monotonic()
    end_processes(pipes.procs, 0.2)
    assert time.monotonic() - began < 10.0
    assert [p.exitcode for p in pipes.procs] == [-signal.SIGKILL] * 2


class _Failed(ValueError):
    pass


def _raise_chained():
    try:
        raise KeyError("inner")
    except KeyError as inner:
        raise _Failed("outer") from inner


def test_an_exception_raised_in_a_child_is_raised_again_with_its_causes_and_traceback():
    def answer(message):
        try:
            _raise_chained()
        except _Failed as exc:
            return describe_error(exc)

    pipes = fork_workers(
        1, lambda conn: serve(conn, answer), "test-error", lambda k: (), "the test"
    )
    try:
        pipes.request(0, "go")
        [(_, (message, text, chain))] = _received(pipes, 1)
    finally:
        pipes.close(graceful=True)
    assert message == "_Failed: outer"
    error = remote_error(text, chain)
    assert type(error) is _Failed and str(error) == "outer"
    assert type(error.__cause__) is KeyError
    remote = error.__cause__.__cause__
    assert isinstance(remote, WorkerError) and "_raise_chained" in str(remote)


def test_an_exception_that_does_not_unpickle_arrives_as_its_traceback_text():
    class Local(Exception):  # a local class: not picklable
        pass

    message, text, chain = describe_error(Local("nowhere to be found"))
    assert message == "Local: nowhere to be found" and chain == [None]
    error = remote_error(text, chain)
    assert type(error) is WorkerError and "nowhere to be found" in str(error)


def test_deaths_in_pytorchs_words():
    @dataclass
    class Ended:
        pid: int
        exitcode: int

    assert death_message(Ended(12, -9), pytorch=True) == (
        "DataLoader worker (pid 12) is killed by signal: SIGKILL"
    )
    assert death_message(Ended(12, 1), pytorch=True) == (
        "DataLoader worker (pid 12) exited unexpectedly with exit code 1"
    )
    assert death_message(Ended(12, -9)) == "fastload worker process 12 was killed by SIGKILL"


def test_a_child_error_is_raised_with_its_type_and_the_childs_traceback():
    try:
        _raise_chained()
    except _Failed as exc:
        error = pickle.loads(pickle.dumps(ChildError(exc, "in a test worker")))
    with pytest.raises(_Failed) as raised:
        error.reraise()
    assert str(raised.value).startswith("Caught _Failed in a test worker.\nOriginal Traceback")


def test_rebuilt_keeps_a_key_errors_text_readable_and_falls_back_to_runtime_error():
    assert str(rebuilt(KeyError, "line 1\nline 2")) == "line 1\nline 2"

    class TwoArguments(Exception):
        def __init__(self, a, b):
            super().__init__(a, b)

    assert type(rebuilt(TwoArguments, "text")) is RuntimeError


@dataclass(frozen=True, slots=True)
class _Job(Tagged):
    number: int


def test_tagged_messages_are_frozen_and_keep_their_generation_across_a_pipe():
    job = _Job(3, 7)
    assert (job.gen, job.number) == (3, 7)
    with pytest.raises(FrozenInstanceError):
        job.gen = 4
    assert pickle.loads(pickle.dumps(job)) == job
    assert pickle.loads(pickle.dumps(Stop())) == Stop()
