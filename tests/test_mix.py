"""fastload.mix: datasets mixed by proportion, repeat or count, each epoch's counts exact,
drawn without replacement where they fit, deterministic per (seed, epoch); loaded through
the loader's elastic order (world sizes simulated with ``shard=(rank, world_size)``), the
state resumed on another world size, packed JPEG datasets decoded natively, and refused
settings and layouts."""

import shutil

import numpy as np
import pytest
import simplejpeg
from helpers import deadline
from hypothesis import given, settings
from hypothesis import strategies as st
from servers import RangeServer

import fastload
from fastload import DataLoader, LoadError, getobs, mapobs, mix
from fastload._loading import engine as engine_module
from fastload._loading.plan import ItemPlan, make_plan
from fastload.storage import JPEG
from fastload.transforms import CenterCrop, Compose, DecodeImage

A, B, C = np.arange(0, 10), np.arange(100, 130), np.arange(1000, 1005)
STARTS = np.array([0, 100, 1000])  # the values of A, B and C start there


def _source(values):
    return np.searchsorted(STARTS, values, side="right") - 1


def _epochs(data, epochs=3, seed=3):
    """The values each of ``epochs`` loads of ``data``, in order."""
    loader = DataLoader(data, 7, seed=seed)
    return [np.concatenate(list(loader)) for _ in range(epochs)]


@pytest.mark.parametrize(
    "settings, counts",
    [
        ({"proportion": [0.7, 0.2, 0.1], "epoch_size": 40}, [28, 8, 4]),
        ({"proportion": [1, 1, 1], "epoch_size": 10}, [4, 3, 3]),  # largest remainder
        ({"proportion": {"a": 2, "b": 1, "c": 0}}, [30, 15, 0]),  # epoch: 45 observations
        ({"repeat": [2, 0.5, None]}, [20, 15, 5]),
        ({"repeat": [0.25, 1, 3]}, [3, 30, 15]),  # 2.5 rounds half up
        ({"choose": [4, None, 12]}, [4, 30, 12]),
        ({"repeat": [None, 0.1, None], "choose": [25, None, None]}, [25, 3, 5]),
    ],
)
def test_each_epoch_gives_each_source_its_count_exactly(settings, counts):
    m = mix({"a": A, "b": B, "c": C}, **settings)
    assert list(m.counts.values()) == counts and m.epoch_size == sum(counts)
    loader = DataLoader(m, 6, seed=5)
    for _ in range(3):  # epochs
        got = np.concatenate(list(loader))
        assert np.bincount(_source(got), minlength=3).tolist() == counts
        assert loader.stats()["sources"] == dict(zip("abc", counts))


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=4),
    weights=st.lists(st.integers(0, 9), min_size=4, max_size=4),
    epoch_size=st.integers(1, 200),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 5),
)
def test_proportions_share_out_the_epoch_and_each_source_is_drawn_evenly(
    sizes, weights, epoch_size, seed, epoch
):
    weights = weights[: len(sizes)]
    if not sum(weights):
        weights[0] = 1
    m = mix([np.arange(n) for n in sizes], proportion=weights, epoch_size=epoch_size)
    counts = list(m.counts.values())
    assert sum(counts) == epoch_size
    for count, w in zip(counts, weights):
        assert abs(count - w / sum(weights) * epoch_size) < 1  # the quota, rounded
    order = m.order(epoch, seed)
    assert order.tolist() == m.order(epoch, seed).tolist()  # (seed, epoch) alone
    for s, (n, count) in enumerate(zip(sizes, counts)):
        mine = order[(order >= m.offsets[s]) & (order < m.offsets[s + 1])] - m.offsets[s]
        times = np.bincount(mine, minlength=n)
        assert len(mine) == count
        assert times.max() - times.min() <= 1  # whole passes, then the rest


def test_without_replacement_while_a_count_fits_and_whole_passes_beyond():
    m = mix([A, B, C], choose=[10, 17, 13])
    for order in _epochs(m):
        a, b, c = (order[_source(order) == s] for s in range(3))
        assert sorted(a.tolist()) == A.tolist()  # all 10, once each
        assert len(set(b.tolist())) == 17  # 17 of 30, none twice
        # 13 of 5: two whole passes and 3 others, none a third time
        assert np.bincount(c - 1000, minlength=5).tolist().count(3) == 3
        assert sorted(np.bincount(c - 1000, minlength=5).tolist()) == [2, 2, 3, 3, 3]


def test_the_order_is_a_function_of_seed_and_epoch_and_interleaves_the_sources():
    m = mix([A, B], proportion=[0.5, 0.5], epoch_size=40)
    again = mix([A, B], proportion=[0.5, 0.5], epoch_size=40)
    first, second = _epochs(m, 2)
    assert [e.tolist() for e in _epochs(again, 2)] == [first.tolist(), second.tolist()]
    assert first.tolist() != second.tolist()
    assert first.tolist() != _epochs(m, 1, seed=4)[0].tolist()
    # Interleaved: not all of one source, then the other.
    sources = _source(first)
    assert np.count_nonzero(np.diff(sources)) > 5


def _flat(lists):
    return [x for part in lists for x in part]


def _global_steps(loaders):
    per_rank = [[b.tolist() for b in loader] for loader in loaders]
    return [_flat(p[k] for p in per_rank) for k in range(len(per_rank[0]))]


def _ranks(m, world, **kw):
    return [DataLoader(m, 8 // world, seed=7, shard=(r, world), **kw) for r in range(world)]


@pytest.mark.parametrize("options", [{}, {"parallel": 2}, {"parallel": 2, "backend": "process"}])
def test_every_world_size_loads_the_same_global_batches(options):
    m = mix({"a": A, "b": B}, proportion={"a": 0.7, "b": 0.3}, epoch_size=48)
    (one,) = _ranks(m, 1)
    reference = [_global_steps([one]) for _ in range(2)]  # two epochs
    for world in (2, 4):
        loaders = _ranks(m, world, **options)
        assert [_global_steps(loaders) for _ in range(2)] == reference


@pytest.mark.parametrize("drop_last", [True, False])
def test_a_state_saved_on_one_world_size_resumes_on_another(drop_last):
    m = mix([A, B, C], repeat=[1, 0.5, 2])  # 35 a epoch: a partial global batch of 3
    (one,) = _ranks(m, 1, drop_last=drop_last)
    flat = _flat(_global_steps([one]))  # the epoch's order (what drop_last keeps)
    steps = len(one)
    for before in (1, 2, 4):
        for k in (1, 2, steps - 1):
            saver = _ranks(m, before, drop_last=drop_last)
            its = [iter(loader) for loader in saver]
            done = [_flat(next(it).tolist() for it in its) for _ in range(k)]
            state = saver[-1].state_dict()
            for after in (1, 2, 4):
                resumed = _ranks(m, after, drop_last=drop_last)
                for loader in resumed:
                    loader.load_state_dict(state)
                loaded = _flat(done + _global_steps(resumed))
                # The rest of the epoch exactly once, then the padding of its last step.
                assert loaded[: len(flat)] == flat, (before, after, k)
                assert loaded[len(flat) :] == flat[: len(loaded) - len(flat)]


def test_a_state_is_refused_by_a_loader_without_the_mix():
    m = mix([A, B], choose=[10, 30])
    loader = DataLoader(m, 4, seed=1)
    next(iter(loader))
    with pytest.raises(ValueError, match="sampler"):
        DataLoader(m.joined, 4, seed=1).load_state_dict(loader.state_dict())


def test_a_state_of_one_draw_is_refused_by_a_mix_of_the_other(packed):
    a, b = packed
    chain = Compose([DecodeImage(), CenterCrop(32)])
    sources = [_fields(a, chain), _fields(b, chain)]
    random, blockwise = mix(sources), mix(sources, shuffle="quasi", wave=2)
    states = {}
    for name, m in (("random", random), ("quasi", blockwise)):
        loader = DataLoader(m, 5, seed=1)
        next(iter(loader))
        states[name] = loader.state_dict()
    assert states["quasi"]["sampler"] == "fastload.mixtures.MixOrder(shuffle='quasi', wave=2)"
    assert states["random"]["sampler"] == "fastload.mixtures.MixOrder"  # as 0.3.0 saved it
    for state, other in ((states["random"], blockwise), (states["quasi"], random)):
        with pytest.raises(ValueError, match="sampler"):
            DataLoader(other, 5, seed=1).load_state_dict(state)
    DataLoader(mix(sources, shuffle="quasi", wave=2), 5, seed=1).load_state_dict(states["quasi"])


def test_tables_mix_column_by_column():
    pd = pytest.importorskip("pandas")
    a = pd.DataFrame({"x": np.arange(5.0), "s": list("abcde")})
    b = pd.DataFrame({"x": np.arange(10.0, 13.0), "s": list("xyz")})
    m = mix({"a": a, "b": b}, choose={"a": 5, "b": 6})
    batches = list(DataLoader(m, 4, seed=0))
    x = np.concatenate([batch["x"] for batch in batches])
    s = [v for batch in batches for v in batch["s"]]
    assert sorted(x.tolist()) == [0, 1, 2, 3, 4, 10, 10, 11, 11, 12, 12]
    assert s == ["abcde"[int(v)] if v < 10 else "xyz"[int(v) - 10] for v in x]
    other = pd.DataFrame({"x": np.arange(3, dtype=np.int32), "s": list("abc")})
    with pytest.raises(ValueError, match=r"\['x'\] of source '1' is int32"):
        mix([a, other])


def test_the_pytorch_drop_in_takes_the_mix_as_a_sampler():
    pytest.importorskip("torch")
    import fastload.torch as ft

    m = mix({"a": A, "b": B}, proportion=[0.6, 0.4], epoch_size=25)
    with pytest.raises(ValueError, match=r"sampler=mixed.sampler\(seed\)"):
        ft.DataLoader(m, 5, shuffle=True)
    sampler = m.sampler(seed=3)
    drop_in = ft.DataLoader(m, 5, sampler=sampler, num_workers=0)
    ours = DataLoader(m, 5, seed=3)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        assert [b.tolist() for b in drop_in] == [b.tolist() for b in ours]
    assert len(sampler) == 25


# -- packed datasets ------------------------------------------------------------------------


def _write(path, shade, n):
    images = [simplejpeg.encode_jpeg(np.full((40, 48, 3), shade + k, np.uint8)) for k in range(n)]
    labels = np.full(n, shade, np.int64)
    fastload.write(path, (images, labels), {"image": JPEG(), "label": "int64"}, progress=False)
    return fastload.open(path)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    return _write(root / "a.arrow", 10, 30), _write(root / "b.arrow", 100, 20)


def _fields(ds, pipeline):
    return {"image": mapobs(pipeline, ds["image"].encoded), "label": ds["label"]}


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_two_packed_jpeg_datasets_mixed_70_30_load_natively(monkeypatch, packed, backend):
    plans = []

    def spy(data, schedule, **kw):
        plans.append(make_plan(data, schedule, **kw))
        return plans[-1]

    monkeypatch.setattr(engine_module, "make_plan", spy)
    pipeline = Compose([DecodeImage(), CenterCrop(32)])
    a, b = packed
    m = mix({"a": _fields(a, pipeline), "b": _fields(b, pipeline)}, proportion=[0.7, 0.3])
    assert m.counts == {"a": 35, "b": 15}
    loader = DataLoader(m, 8, seed=2, parallel=2, backend=backend)
    with deadline(60):
        batches = [{k: v.copy() for k, v in batch.items()} for batch in loader]
    assert plans and all(isinstance(p, ItemPlan) and not p.has_python for p in plans)
    order = loader.order(0)
    labels = np.concatenate([batch["label"] for batch in batches])
    assert np.bincount(labels).tolist()[10::90] == [35, 15]
    images = np.concatenate([batch["image"] for batch in batches])
    expected = [getobs(m, int(i))["image"] for i in order]  # through Python, per source
    assert np.array_equal(images, np.stack(expected))
    assert loader.stats()["sources"] == {"a": 35, "b": 15}


def test_the_datasets_checks_run_on_the_native_path(tmp_path):
    # b's file rewritten in place while open: no row of the new bytes is handed out.
    a, b = _write(tmp_path / "a.arrow", 10, 30), _write(tmp_path / "b.arrow", 100, 20)
    pipeline = Compose([DecodeImage(), CenterCrop(32)])
    m = mix({"a": _fields(a, pipeline), "b": _fields(b, pipeline)}, choose=[30, 20])
    loader = DataLoader(m, 8, seed=2, parallel=2)
    assert len([batch for batch in loader]) == 7
    _write(tmp_path / "other.arrow", 50, 20)
    shutil.copyfile(tmp_path / "other.arrow", tmp_path / "b.arrow")  # the same inode
    with deadline(60), pytest.raises(LoadError, match="b.arrow: the file changed"):
        for batch in loader:
            assert set(batch["label"].tolist()) <= {10, 100}


@pytest.mark.parametrize("count", [45, 100, 230])
def test_quasi_draws_a_packed_source_a_wave_of_blocks_at_a_time(tmp_path, count):
    images = [simplejpeg.encode_jpeg(np.full((8, 8, 3), k, np.uint8)) for k in range(100)]
    fields = {"image": JPEG(), "label": "int64"}
    fastload.write(
        tmp_path / "b.arrow", (images, np.arange(100)), fields, progress=False, block_bytes=2_000
    )
    ds = fastload.open(tmp_path / "b.arrow")
    bounds = ds.block_bounds
    assert len(bounds) > 20  # many small blocks
    small = _write(tmp_path / "a.arrow", 10, 20)
    chain = Compose([DecodeImage(), CenterCrop(4)])
    m = mix([_fields(small, chain), _fields(ds, chain)], choose=[7, count], shuffle="quasi", wave=3)
    for epoch in range(3):
        order = m.order(epoch, 5)
        assert np.array_equal(order, m.order(epoch, 5))  # a function of (seed, epoch)
        rows = order[order >= 20] - 20
        assert np.bincount(order < 20).tolist() == [count, 7]
        blocks = np.searchsorted(bounds, rows, side="right") - 1
        for p in range(0, count, 100):  # each pass, and the rest: a permutation's start
            one = rows[p : p + 100]
            assert len(np.unique(one)) == len(one)
            # Wave by wave: the blocks met so far are whole waves of 3, but the last.
            seen, waves = blocks[p : p + 100], []
            for b in seen:
                if b not in (waves[-1] if waves else ()):
                    if not waves or len(waves[-1]) == 3:
                        waves.append([])
                    waves[-1].append(b)
            assert sorted(b for w in waves for b in w) == sorted(set(seen.tolist()))
        assert m.order(epoch, 6).tolist() != order.tolist()


def test_a_packed_dataset_at_a_url_mixes_with_a_local_one(packed, tmp_path):
    a, b = packed
    root = tmp_path / "www"
    root.mkdir()
    _write(root / "b.arrow", 100, 20)  # what b holds
    server = RangeServer(root)
    try:
        remote = fastload.open(f"{server.url}/b.arrow", cache_bytes=0)
        pipeline = Compose([DecodeImage(), CenterCrop(32)])
        m = mix([_fields(a, pipeline), _fields(remote, pipeline)], choose=[10, 25])
        local = mix([_fields(a, pipeline), _fields(b, pipeline)], choose=[10, 25])
        with deadline(60):
            got = list(DataLoader(m, 5, seed=1, parallel=2, shard=(1, 2)))
            want = list(DataLoader(local, 5, seed=1, parallel=2, shard=(1, 2)))
        assert server.requests > 0
    finally:
        server.stop()
    assert len(got) == len(want) == 4  # 35 over 2 ranks: 18 each
    for x, y in zip(got, want):
        assert np.array_equal(x["label"], y["label"])
        assert np.array_equal(x["image"], y["image"])
    labels = np.concatenate([batch["label"] for batch in got])
    assert set(labels.tolist()) == {10, 100}


def _soon_bytes(remote, rows, step):
    """The most bytes of blocks that five consecutive steps read (``rows``: the dataset's
    rows the mix reads, by position, -1 where another source's): what one loader keeps
    past its budget (its first step not delivered and the next four)."""
    blocks = np.searchsorted(remote.bounds, rows, side="right") - 1
    return max(
        int(remote.nbytes[np.unique(blocks[p : p + 5 * step][rows[p : p + 5 * step] >= 0])].sum())
        for p in range(0, len(rows), step)
    )


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_a_dataset_at_a_url_in_a_mix_is_read_within_its_memory_bound(packed, tmp_path, backend):
    a, _ = packed
    root = tmp_path / "www"
    root.mkdir()
    rng = np.random.default_rng(0)
    images = [
        simplejpeg.encode_jpeg(rng.integers(0, 256, (40, 48, 3), np.uint8)) for _ in range(400)
    ]
    labels = np.arange(1000, 1400, dtype=np.int64)
    fields = {"image": JPEG(), "label": "int64"}
    fastload.write(root / "b.arrow", (images, labels), fields, block_bytes=8 << 10, progress=False)
    b = fastload.open(root / "b.arrow")
    server = RangeServer(root)
    pipeline = Compose([DecodeImage(), CenterCrop(32)])
    try:
        budget = 250_000  # two waves of 8 blocks, a sixth of the dataset
        remote = fastload.open(f"{server.url}/b.arrow", cache_bytes=0, memory_bytes=budget)
        blocks = remote.remote_rows
        assert budget < blocks.nbytes.sum() / 5
        m = mix(
            [_fields(a, pipeline), _fields(remote, pipeline)], choose=[30, 400], shuffle="quasi"
        )
        local = mix([_fields(a, pipeline), _fields(b, pipeline)], choose=[30, 400], shuffle="quasi")
        loader = DataLoader(m, 10, seed=1, parallel=2, backend=backend)
        got, held = [], []
        with deadline(120):
            for epoch in range(2):
                order = loader.order(epoch)
                rows = np.where(order >= 30, order - 30, -1)
                bound = budget + _soon_bytes(blocks, rows, 10)
                for batch in loader:
                    got.append({k: np.array(v) for k, v in batch.items()})
                    held.append(blocks.held_bytes())
                assert max(held) <= bound < blocks.nbytes.sum()
            again = DataLoader(local, 10, seed=1, parallel=2)
            want = [batch for _ in range(2) for batch in again]
    finally:
        server.stop()
    assert len(got) == len(want) == 86
    for x, y in zip(got, want):
        assert np.array_equal(x["label"], y["label"])
        assert np.array_equal(x["image"], y["image"])
    assert loader.stats()["sources"] == {"0": 30, "1": 400}


# -- refused --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sources, message",
    [
        ([{"x": A, "y": A}, {"x": B}], "other fields"),
        ([(A, A), (B,)], "other fields"),
        ([A, B.astype(np.float32)], "float32"),
        ([np.zeros((3, 2)), np.zeros((3, 4))], r"\(4,\)"),
    ],
)
def test_sources_of_different_layouts_are_refused_naming_the_difference(sources, message):
    with pytest.raises(ValueError, match=message):
        mix(sources)


def test_packed_datasets_of_different_fields_are_refused(packed, tmp_path):
    images = [simplejpeg.encode_jpeg(np.zeros((8, 8, 3), np.uint8))]
    fastload.write(
        tmp_path / "c.arrow", (images, [0.5]), {"image": JPEG(), "label": "float32"}, progress=False
    )
    with pytest.raises(ValueError, match=r"\['label'\].*float32"):
        mix([packed[0], fastload.open(tmp_path / "c.arrow")])


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"proportion": [0.5, None]}, "every source needs one"),
        ({"proportion": [0.5, 0.5], "repeat": [2, None]}, "has proportion and repeat"),
        ({"proportion": [0, 0]}, "all 0"),
        ({"proportion": [-1, 2]}, "finite number >= 0"),
        ({"repeat": [float("nan"), 1]}, "finite number >= 0"),
        ({"choose": [2.5, None]}, "int >= 0"),
        ({"choose": [3, 4], "epoch_size": 10}, "contradicts"),
        ({"repeat": [1]}, "one value per source"),
        ({"choose": {"z": 3}}, "names no source"),
        ({"choose": [0, 0]}, "epoch is empty"),
        ({"proportion": [1, 1], "epoch_size": 0}, "epoch_size must be an int >= 1"),
        ({"shuffle": False}, "shuffle must be True .* or 'quasi'"),
        ({"shuffle": "quasi", "wave": 0}, "wave must be an int >= 1"),
        ({"shuffle": "quasi"}, "no source is over one"),
    ],
)
def test_invalid_settings_are_refused_saying_what_to_do(settings, message):
    with pytest.raises(ValueError, match=message):
        mix([A, B], **settings)


def test_an_empty_source_with_a_count_and_an_order_of_the_loaders_own_are_refused():
    with pytest.raises(ValueError, match="is empty"):
        mix([A, A[:0]], choose=[3, 2])
    with pytest.raises(ValueError, match="at least one source"):
        mix([])
    m = mix([A, B])
    for kw in ({"shuffle": True}, {"sampler": lambda e, s: [0]}):
        with pytest.raises(ValueError, match="draws its own order"):
            DataLoader(m, 4, **kw)
    with pytest.raises(ValueError, match="give the mix shuffle='quasi'"):
        DataLoader(m, 4, shuffle="quasi")
