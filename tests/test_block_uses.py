"""What both read-aheads stand on (``fastload._storage.blockuses``): the blocks an order
reads with their first and last positions, and the watermark of steps delivered in any
order, each against a plain reference."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from fastload._storage.blockuses import BlockUses, Delivered


@given(
    sizes=st.lists(st.integers(0, 5), min_size=1, max_size=8),
    seed=st.integers(0, 2**32 - 1),
    start=st.integers(0, 6),
    cut=st.integers(0, 40),
)
def test_block_uses_are_each_blocks_first_and_last_position_by_first_use(sizes, seed, start, cut):
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    order = np.random.default_rng(seed).permutation(int(bounds[-1]))[:cut]
    uses = BlockUses(bounds, order, start)
    seen = {}
    for position, row in enumerate(order, start):
        block = int(np.searchsorted(bounds, row, side="right") - 1)
        first, _ = seen.get(block, (position, position))
        seen[block] = (first, position)
    expected = sorted(seen, key=lambda b: (seen[b][0], b))
    assert uses.blocks.tolist() == expected
    assert uses.first.tolist() == [seen[b][0] for b in expected]
    assert uses.last.tolist() == [seen[b][1] for b in expected]
    assert len(uses) == len(expected)
    first, last = uses.steps(3)
    assert first.tolist() == [seen[b][0] // 3 for b in expected]
    assert last.tolist() == [seen[b][1] // 3 for b in expected]


@given(
    first=st.integers(0, 5),
    steps=st.lists(st.integers(0, 20), max_size=30),
)
def test_delivered_is_the_first_step_not_handed_out(first, steps):
    delivered, handed = Delivered(first), set()
    for step in steps:
        before = delivered.low
        moved = delivered.add(step)
        handed.add(step)
        low = first
        while low in handed:
            low += 1
        assert delivered.low == low
        assert moved == (low != before)
