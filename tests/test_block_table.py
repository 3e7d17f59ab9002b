"""The block table of a dataset at a URL (``fastload._storage.blocktable``): its life
cycle driven from two processes at once (this one and a forked child working on the same
table), each operation checked against a model of the rules; and readers in one process
racing a process that lets blocks go, which must never let go a block under a read."""

from __future__ import annotations

import itertools
import multiprocessing
import random

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fastload._storage.blocktable import BlockTable

N = 2
ACTORS = st.sampled_from(["parent", "child"])
BLOCKS = st.integers(0, N - 1)


class _Actor:
    """Runs table operations in this process, keeping the fetches it claimed open across
    calls (a claim held while the other process acts)."""

    def __init__(self, table: BlockTable, dropped: np.ndarray) -> None:
        self.table, self.dropped, self.open = table, dropped, {}

    def close(self) -> None:
        """End the fetches still claimed, as failed."""
        for k in list(self.open):
            self.run("fail", k)

    def run(self, op: str, k: int):
        table = self.table
        if op == "begin":
            fetch = table.fetching(k)
            mine = fetch.__enter__()
            if mine:
                self.open[k] = fetch
            else:
                fetch.__exit__(None, None, None)
            return mine
        if op == "land":
            return self.open.pop(k).__exit__(None, None, None)
        if op == "fail":
            error = RuntimeError("the fetch failed")
            return self.open.pop(k).__exit__(RuntimeError, error, None)
        if op == "let_go":

            def drop():
                assert table.present[k] == 0  # marked absent before its bytes go
                self.dropped[k] += 1

            return table.let_go(k, drop, wait=False)
        if op == "admit":
            return table.admit(k)
        if op in ("need", "unneed", "pin"):
            return getattr(table, op)(np.array([k]))
        return table.hold(np.array([k]), 1 if op == "hold" else -1)


def _serve(table: BlockTable, dropped: np.ndarray, conn) -> None:
    """The child process: runs the parent's requests on the shared table, answers each."""
    actor = _Actor(table, dropped)
    while True:
        request = conn.recv()
        if request is None:
            actor.close()
            return
        try:
            conn.send(("ok", actor.run(*request)))
        except BaseException as error:  # sent back: the parent's test fails with it
            conn.send(("error", repr(error)))


class BlockLifeCycle(RuleBasedStateMachine):
    """The table's rules, as a model: a block is fetched by one claimant at a time and
    lands present; it is let go only when present, not pinned, held, needed nor claimed;
    a gate admits only a present block."""

    def __init__(self) -> None:
        super().__init__()
        self.table = BlockTable([False] * N)
        self.dropped = np.frombuffer(multiprocessing.RawArray("q", N), np.int64)
        self.parent = _Actor(self.table, self.dropped)
        self.conn, theirs = multiprocessing.get_context("fork").Pipe()
        self.child = multiprocessing.get_context("fork").Process(
            target=_serve, args=(self.table, self.dropped, theirs), daemon=True
        )
        self.child.start()
        self.present = [False] * N
        self.pinned = [False] * N
        self.holds = [0] * N
        self.needs = [0] * N
        self.claimed: list[str | None] = [None] * N
        self.lets_go = [0] * N

    def teardown(self) -> None:
        self.parent.close()
        self.conn.send(None)
        self.child.join(10)
        assert self.child.exitcode == 0

    def do(self, actor: str, op: str, k: int):
        if actor == "parent":
            return self.parent.run(op, k)
        self.conn.send((op, k))
        status, value = self.conn.recv()
        assert status == "ok", value
        return value

    @precondition(lambda self: None in self.claimed)
    @rule(actor=ACTORS, k=BLOCKS)
    def begin_a_fetch(self, actor, k):
        if self.claimed[k] is not None:
            return  # another's claim: the call would wait for its fetch
        mine = self.do(actor, "begin", k)
        assert mine == (not self.present[k])
        if mine:
            self.claimed[k] = actor

    @rule(data=st.data(), lands=st.booleans())
    def end_a_fetch(self, data, lands):
        claimed = [k for k in range(N) if self.claimed[k] is not None]
        if not claimed:
            return
        k = data.draw(st.sampled_from(claimed))
        self.do(self.claimed[k], "land" if lands else "fail", k)
        self.claimed[k] = None
        self.present[k] = lands

    @rule(actor=ACTORS, k=BLOCKS)
    def let_go(self, actor, k):
        done = self.do(actor, "let_go", k)
        if self.claimed[k] is not None:
            assert done is None
            return
        free = not (self.pinned[k] or self.holds[k] or self.needs[k])
        assert done == (self.present[k] and free)
        if done:
            self.present[k] = False
            self.lets_go[k] += 1

    @rule(actor=ACTORS, k=BLOCKS)
    def admit(self, actor, k):
        assert self.do(actor, "admit", k) == self.present[k]
        self.needs[k] += self.present[k]

    @rule(actor=ACTORS, k=BLOCKS)
    def need(self, actor, k):
        self.do(actor, "need", k)
        self.needs[k] += 1

    @rule(actor=ACTORS, k=BLOCKS)
    def unneed(self, actor, k):
        if self.needs[k]:
            self.do(actor, "unneed", k)
            self.needs[k] -= 1

    @rule(actor=ACTORS, k=BLOCKS, more=st.booleans())
    def hold(self, actor, k, more):
        if more or self.holds[k]:
            self.do(actor, "hold" if more else "unhold", k)
            self.holds[k] += 1 if more else -1

    @rule(actor=ACTORS, k=BLOCKS)
    def pin(self, actor, k):
        self.do(actor, "pin", k)
        self.pinned[k] = True

    @invariant()
    def the_shared_marks_are_the_models(self):
        table = self.table
        assert table.present.tolist() == [int(p) for p in self.present]
        assert table.pinned.tolist() == [int(p) for p in self.pinned]
        assert table.holds.tolist() == self.holds
        assert table.needs.tolist() == self.needs
        assert self.dropped.tolist() == self.lets_go  # each let-go dropped the bytes once


TestBlockLifeCycle = BlockLifeCycle.TestCase
TestBlockLifeCycle.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)


def _read_while_held(table: BlockTable, data: np.ndarray, rounds: int, seed: int) -> int:
    """A reader: holds a block, fetches it when it is not there (its bytes set to 1), then
    reads it while it holds it. Returns the reads that found its bytes gone."""
    rng, wrong = random.Random(seed), 0
    for _ in range(rounds):
        k = rng.randrange(len(data))
        kind = rng.choice(["hold", "admit"])
        if kind == "hold":
            table.hold(np.array([k]), 1)
        while kind == "admit" and not table.admit(k):  # as a gate: only once it is there
            with table.fetching(k) as mine:
                if mine:
                    data[k] = 1
        with table.fetching(k) as mine:
            if mine:
                data[k] = 1
        wrong += sum(int(data[k] != 1) for _ in range(20))
        if kind == "hold":
            table.hold(np.array([k]), -1)
        else:
            table.unneed(np.array([k]))
    return wrong


def _reader_process(table, data, rounds, seed, result) -> None:
    result.value = _read_while_held(table, data, rounds, seed)


@pytest.mark.parametrize("blocks", [2, 8])
def test_a_block_is_never_let_go_under_a_read_of_another_process(blocks):
    """The child reads (holding or admitting its blocks) while this process lets go of
    every block it can, as fast as it can: not one read finds its block's bytes gone."""
    table = BlockTable([False] * blocks)
    data = np.frombuffer(multiprocessing.RawArray("b", blocks), np.int8)
    fork = multiprocessing.get_context("fork")
    wrong = fork.RawValue("q", -1)
    reader = fork.Process(target=_reader_process, args=(table, data, 3000, 1, wrong))
    reader.start()
    let_go = 0
    while reader.is_alive():
        k = random.randrange(blocks)

        def drop(k=k):
            data[k] = 0

        let_go += bool(table.let_go(k, drop, wait=False))
        reader.join(0.0005)
    reader.join(30)
    assert reader.exitcode == 0
    assert wrong.value == 0
    assert let_go > 0  # blocks were let go meanwhile: the race was run
    assert not table.holds.any() and not table.needs.any()


@pytest.mark.parametrize("marker", ["parent", "child"])
def test_let_go_follows_the_rule_for_every_mark_set_by_either_process(marker):
    """Every combination of marks on one block, set by one process, the block let go by
    the other: let go exactly when present and not pinned, held, needed nor claimed."""
    machine = BlockLifeCycle()
    other = "child" if marker == "parent" else "parent"
    try:
        for k, (there, pin, hold, need, claim) in enumerate(itertools.product([0, 1], repeat=5)):
            machine.table = table = BlockTable([False] * 1)
            machine.parent = _Actor(table, machine.dropped)
            machine.child.kill()
            machine.child.join()
            machine.conn, theirs = multiprocessing.get_context("fork").Pipe()
            machine.child = multiprocessing.get_context("fork").Process(
                target=_serve, args=(table, machine.dropped, theirs), daemon=True
            )
            machine.child.start()
            if there:
                assert machine.do(marker, "begin", 0) is True
                machine.do(marker, "land", 0)
            for op, on in (("pin", pin), ("hold", hold), ("need", need)):
                if on:
                    machine.do(marker, op, 0)
            if claim and there:
                continue  # a present block is not claimed: nothing to fetch
            if claim:
                assert machine.do(marker, "begin", 0) is True
            done = machine.do(other, "let_go", 0)
            expected = None if claim else bool(there and not (pin or hold or need))
            assert done == expected, (k, there, pin, hold, need, claim)
            assert table.present[0] == (there and not done)
            if claim:
                machine.do(marker, "fail", 0)
    finally:
        machine.teardown()
