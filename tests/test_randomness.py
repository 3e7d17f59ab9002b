"""One derivation of every random stream (fastload._base.randomness): each purpose its own
stream, each stream a pure function of (seed, purpose, key), the orders users saved kept."""

import itertools

import numpy as np
import pytest

from fastload import DataLoader, FileStream, shuffleobs, splitobs
from fastload._base.randomness import Purpose, derived_seed, generator
from fastload._loading.rounds import ShuffleBuffer
from fastload.order import quasi_random_order
from fastload.streams import rank_records
from fastload.transforms import Compose, Lambda

# The key each purpose takes, as Purpose lists it.
KEYS = {
    Purpose.EPOCH_ORDER: (3,),
    Purpose.QUASI_ORDER: (3,),
    Purpose.SAMPLER: (3,),
    Purpose.FILE_ORDER: (3,),
    Purpose.SHUFFLE_BUFFER: (3,),
    Purpose.STREAM_ROUND: (3,),
    Purpose.VIEW_ORDER: (),
    Purpose.RESAMPLING: (),
    Purpose.TRANSFORM: (3, 0, 0),
    Purpose.MIX: (3, 0),
}


def draws(seed, purpose, *key):
    return generator(seed, purpose, *key).integers(0, 1 << 62, 16).tolist()


def test_every_purpose_is_listed_with_its_key():
    assert set(KEYS) == set(Purpose)


@pytest.mark.parametrize("seed", [0, 1, 7, 2**40])
def test_every_purpose_gives_a_different_stream_for_the_same_seed(seed):
    streams = {purpose: draws(seed, purpose, *key) for purpose, key in KEYS.items()}
    for a, b in itertools.combinations(Purpose, 2):
        assert streams[a] != streams[b], (a, b)


@pytest.mark.parametrize("purpose", list(Purpose))
def test_the_same_seed_purpose_and_key_give_the_same_stream(purpose):
    key = KEYS[purpose]
    assert draws(5, purpose, *key) == draws(5, purpose, *key)
    assert draws(5, purpose, *key) != draws(6, purpose, *key)
    if key:
        other = (key[0] + 1, *key[1:])
        assert draws(5, purpose, *key) != draws(5, purpose, *other)


def test_the_loaders_shuffled_order_keeps_its_recipe():
    # PCG64([seed, epoch]): orders saved in a state_dict or published stay the same.
    n, seed = 50, 11
    loader = DataLoader(np.arange(n), n, shuffle=True, seed=seed)
    for epoch in range(2):
        (batch,) = list(loader)
        expected = np.random.Generator(np.random.PCG64([seed, epoch])).permutation(n)
        assert batch.tolist() == expected.tolist()


def test_a_views_shuffle_keeps_its_recipe_and_splits_follow_it():
    # Philox(seed): a seed names a train/test split, which stays the same.
    n, seed = 40, 3
    expected = np.random.Generator(np.random.Philox(seed)).permutation(n)
    assert shuffleobs(np.arange(n), seed=seed)[:].tolist() == expected.tolist()
    train, test = splitobs(np.arange(n), at=0.75, shuffle=True, seed=seed)
    assert train[:].tolist() + test[:].tolist() == expected.tolist()


def test_the_quasi_order_is_not_the_epoch_permutation():
    # Chunks of one item, one chunk a window: the quasi order used to draw the very
    # permutation of the loader's shuffled order, from the same stream.
    n, seed, epoch = 64, 2, 1
    quasi = quasi_random_order(n, np.ones(n, np.int64), seed, epoch, window=1)
    shuffled = generator(seed, Purpose.EPOCH_ORDER, epoch).permutation(n)
    assert sorted(quasi.tolist()) == list(range(n))
    assert quasi.tolist() != shuffled.tolist()
    assert quasi.tolist() == quasi_random_order(n, np.ones(n, np.int64), seed, epoch, 1).tolist()


def test_a_lambdas_rng_is_not_the_epoch_permutations_stream():
    # The item at index 0, op 0 used to get the epoch permutation's generator.
    seen = []

    def draw(image, rng):
        seen.append(rng.integers(1 << 62))
        return image

    image = np.zeros((4, 4, 3), np.uint8)
    Compose([Lambda(draw)])(image, index=0, seed=9, epoch=4)
    assert seen[0] != generator(9, Purpose.EPOCH_ORDER, 4).integers(1 << 62)
    assert seen[0] == generator(9, Purpose.TRANSFORM, 4, 0, 0).integers(1 << 62)


def test_the_shuffle_buffer_draws_the_same_twice():
    records = list(range(100))
    buffer = ShuffleBuffer(10, seed=4, epoch=0)
    out = buffer.push(records) + buffer.drain()
    again = ShuffleBuffer(10, seed=4, epoch=0)
    assert again.push(records) + again.drain() == out
    assert sorted(out) == records and out != records


def test_the_file_order_is_not_the_epoch_permutation(tmp_path):
    # The files of FileStream used to be shuffled by the epoch permutation's stream.
    paths = []
    for k in range(12):
        (tmp_path / f"{k}.txt").write_text(str(k))
        paths.append(str(tmp_path / f"{k}.txt"))
    shards = FileStream(paths, lambda f: [int(f.read())])
    files = list(rank_records(shards, 0, 1, seed=4, epoch=2, shuffle_files=True))
    assert files == generator(4, Purpose.FILE_ORDER, 2).permutation(12).tolist()
    assert files != generator(4, Purpose.EPOCH_ORDER, 2).permutation(12).tolist()
    assert files == list(rank_records(shards, 0, 1, seed=4, epoch=2, shuffle_files=True))


def test_a_derived_seed_is_a_pure_function_of_its_key():
    seeds = [derived_seed(7, Purpose.STREAM_ROUND, window) for window in range(50)]
    assert seeds == [derived_seed(7, Purpose.STREAM_ROUND, window) for window in range(50)]
    assert len(set(seeds)) == 50
    assert all(0 <= s < 2**63 for s in seeds)
    assert derived_seed(8, Purpose.STREAM_ROUND, 0) != seeds[0]


def test_a_seed_or_key_out_of_range_is_refused():
    with pytest.raises(ValueError):
        generator(-1, Purpose.SAMPLER, 0)
    with pytest.raises(ValueError):
        generator(1, Purpose.SAMPLER, -1)
    with pytest.raises(ValueError):
        generator(-1, Purpose.EPOCH_ORDER, 0)
    with pytest.raises(ValueError, match="needs a seed"):
        generator(None, Purpose.EPOCH_ORDER, 0)
    with pytest.raises(ValueError, match=r"2\*\*64"):
        generator(1 << 64, Purpose.SAMPLER, 0)
    with pytest.raises(ValueError, match=r"2\*\*64"):
        derived_seed(0, Purpose.STREAM_ROUND, 1 << 64)


def test_loading_sets_what_current_reads_on_its_thread_and_puts_the_outer_key_back():
    import threading

    from fastload.context import current, loading

    assert current() == (0, 0)
    with loading(3, 1):
        assert current() == (3, 1)
        with loading(4, 2):
            assert current() == (4, 2)
        assert current() == (3, 1)
        seen = []
        other = threading.Thread(target=lambda: seen.append(current()))
        other.start()
        other.join()
        assert seen == [(0, 0)]
        with pytest.raises(KeyError), loading(5, 5):
            raise KeyError("an item failed")
        assert current() == (3, 1)
    assert current() == (0, 0)

    @loading(7, 0)
    def draw(inner=None):
        if inner is None:
            return current()
        with loading(*inner):
            return current(), draw()

    assert draw() == (7, 0) and current() == (0, 0)
    assert draw((8, 1)) == ((8, 1), (7, 0)) and current() == (0, 0)
    # One decorating loading, on two threads at once under keys of their own: each
    # thread gets its own key back when the function returns.
    barrier = threading.Barrier(2)
    inside = loading(9, 9)(lambda: (barrier.wait(5), current())[1])
    seen = {}

    def on_a_thread(key):
        with loading(*key):
            seen[key] = (inside(), current())

    threads = [threading.Thread(target=on_a_thread, args=(key,)) for key in [(1, 1), (2, 2)]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == {(1, 1): ((9, 9), (1, 1)), (2, 2): ((9, 9), (2, 2))}
