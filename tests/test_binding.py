"""The binding of the C core (fastload/_core.pyx) refuses what C cannot use safely, with a
clear error, and keeps alive what C points into."""

import struct

import core_calls
import numpy as np
import pytest

from fastload import _core, limits
from fastload._base.replies import Failure, Loaded
from fastload._base.tree import LeafKind
from fastload._images import codecs


def image_source(**where):
    pipeline = _core.Pipeline()
    return _core.ImageSource(
        pipeline,
        channels=3,
        name="test",
        decoder=codecs,
        max_pixels=limits.MAX_IMAGE_PIXELS,
        max_file_bytes=limits.MAX_FILE_BYTES,
        **where,
    )


def test_an_image_source_holds_its_buffers_so_they_cannot_be_resized_under_it():
    data = bytearray(_core.qoi_encode(np.zeros((4, 4, 3), np.uint8)))
    source = image_source(buffers=[data])
    with pytest.raises(BufferError):
        data[:] = b""
    del source
    data[:] = b""  # released with the source


def test_an_image_source_decodes_its_buffers():
    image = np.arange(48, dtype=np.uint8).reshape(4, 4, 3)
    source = image_source(buffers=[_core.qoi_encode(image)])
    pixels, where, denom = source.decode(_core.qoi_encode(image))
    assert np.array_equal(pixels, image) and where == (0, 0) and denom == 1


@pytest.mark.parametrize(
    "offsets",
    [[0, 1], [1, 0], [0, 5, 3], []],
    ids=["past-an-empty-base", "falling", "not-rising", "none"],
)
def test_offsets_outside_their_base_are_refused(offsets):
    with pytest.raises(ValueError, match="offsets"):
        image_source(offsets=(np.zeros(0 if offsets == [0, 1] else 4, np.uint8), offsets))


def test_offsets_are_checked_against_every_byte_of_a_base_of_several_dimensions():
    source = image_source(offsets=(np.zeros((2, 8), np.uint8), [0, 16]))
    assert source.count == 1


def test_spans_outside_their_base_or_naming_no_base_are_refused():
    base = np.zeros(10, np.uint8)
    with pytest.raises(ValueError, match="outside"):
        image_source(spans=([base], None, [0], [11]))
    with pytest.raises(ValueError, match="not there"):
        image_source(spans=([base], [1], [0], [5]))


def test_an_image_source_needs_exactly_one_kind_of_images_and_a_channel_count_it_decodes_to():
    with pytest.raises(ValueError, match="exactly one"):
        image_source()
    with pytest.raises(ValueError, match="exactly one"):
        image_source(buffers=[], paths=[])
    with pytest.raises(ValueError, match="1, 3 or 4"):
        _core.ImageSource(
            _core.Pipeline(),
            channels=2,
            name="x",
            decoder=codecs,
            max_pixels=10,
            max_file_bytes=10,
            buffers=[],
        )


@pytest.mark.parametrize("value", [None, np.array(1.0)], ids=["none", "0-d"])
def test_a_gather_field_without_observations_is_refused(value):
    with pytest.raises(ValueError, match="gather"):
        _core.Fields([(LeafKind.GATHER, value)], [0])


@pytest.mark.parametrize("kind", ["native", "python", "gather", None])
def test_a_field_kind_that_is_not_a_leaf_kind_is_refused(kind):
    with pytest.raises(ValueError, match="must be a LeafKind"):
        _core.Fields([(kind, np.zeros((2, 1)))], [8])


def test_a_field_of_a_wrong_source_is_refused():
    with pytest.raises(TypeError):
        _core.Fields([(LeafKind.IMAGE, object())], [0])


def test_a_pipeline_is_built_once():
    pipeline = _core.Pipeline(flip_p=0.5)
    with pytest.raises(RuntimeError, match="built once"):
        pipeline.__init__(flip_p=0.5)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"pixel_ops": [{"kind": "jitter", "op": 0, "ranges": [None] * 6}]}, "ranges.*4 values"),
        ({"pixel_ops": [{"kind": "sepia", "op": 0}]}, "unknown colour op"),
        ({"mean": [0.5, 0.5], "std": [0.5]}, "normalize"),
        ({"mean": [0.5] * 5, "std": [0.5] * 5}, "normalize"),
        ({"flip_p": 1.5}, "flip"),
        ({"channels": 2}, "channels"),
    ],
    ids=["jitter-ranges", "colour-op", "mean-std", "five-means", "flip", "channels"],
)
def test_a_pipeline_refuses_stages_c_does_not_accept(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _core.Pipeline(**kwargs)


def test_a_qoi_header_of_no_pixels_is_not_a_qoi_stream_and_one_too_large_is_over_the_limit():
    def header(w, h):
        return b"qoif" + struct.pack(">II", w, h) + bytes([3, 0]) + bytes(8)

    with pytest.raises(ValueError, match="expected format"):
        _core.qoi_header(header(0, 5))
    with pytest.raises(ValueError, match="limit"):
        _core.qoi_header(header(100_000, 100_000))
    assert _core.qoi_header(header(7, 5)) == (5, 7, 3)


# Calls that killed the interpreter (reading past a short tuple or a 0-D array's shape, a
# None where C expects an object, a box whose end overflows an int, a Gamma draw with a
# parameter it recurses on without end) or handed C what it cannot use (NaN draws, rows of
# the wrong size, no rows), each with what it now raises. They run in a child process, so
# that a regression fails this test rather than killing the suite.
# Steps [0, 1), inline, no filler.
RUN = (
    "first_step=0, end_step=1, seed=0, epoch=0, parallel=0, claim_size=1, ordered=True, "
    "skip_errors=False, release_gil=True, filler=None"
)
SOURCE = "channels=3, name='x', decoder=codecs, max_pixels=99, max_file_bytes=99"
ITERATION = "ring=[[]], values=[None], objects=[[]], buffer=False, progress=_core.Progress()"
REFUSED = {
    "_core.rrc_params(10, 10, (0.5,), (0.75, 1.33))": "ValueError: rrc_params: scale",
    "_core.erasing_params(10, 10, 1.0, (), (0.3, 3.3))": "ValueError: erasing_params: scale",
    "_core.cutmix_(arr((2, 4, 4, 3)), (), False)": "ValueError: cutmix: box",
    "_core.cutmix_(arr((2, 4, 4, 3)), (2**31 - 1, 0, 1, 1), False)": "ValueError: cutmix: the box",
    "_core.Pipeline(resize='exact', resize_size=())": "ValueError: resize_size",
    "_core.Pipeline(crop='random_resized', crop_size=(5, 5), scale=(), ratio=())": (
        "ValueError: scale"
    ),
    "_core.Pipeline(pixel_ops=[{'kind': 'blur', 'op': 0, 'kernel': (3,), 'sigma': (1, 2)}])": (
        "ValueError: GaussianBlur: kernel"
    ),
    "_core.Pipeline(crop=[])": "ValueError: crop must be one of",
    "source(0, 'spans')": None,
    f"_core.ImageSource(pipeline(), {SOURCE}, spans=(arr((9,)),))": ("ValueError: spans"),
    f"_core.ImageSource(pipeline(), {SOURCE}, offsets=(arr((9,)),))": ("ValueError: offsets"),
    "_core.mixup_(arr((), 'float32', 'scalar'), 0.5)": "ValueError: mixup: the batch",
    "_core.mixup_(None, 0.5)": "TypeError",
    "_core.mixup_lambda(-1e300, 0, 0, 0)": "ValueError: mixup_lambda: alpha",
    "_core.mixup_lambda(float('nan'), 0, 0, 0)": "ValueError: mixup_lambda: alpha",
    "_core.cutmix_params(float('-inf'), 0, 0, 0, 4, 4)": "ValueError: cutmix_params: alpha",
    "_core.beta_draws(float('inf'), 1.0, 3)": "ValueError: beta_draws: a",
    "_core.Fields([(LeafKind.IMAGE, None)], [0])": "TypeError: field 0: an image field",
    "_core.Fields([(LeafKind.GATHER, arr((3, 4)))], [1])": "ValueError: field 0: an observation",
    f"iteration().start_run(fields(), order=np.array(3), bounds=None, {RUN})": (
        "TypeError: a schedule's order must be a 1-D"
    ),
    f"iteration().start_run(None, order=np.arange(3), bounds=None, {RUN})": "TypeError",
    f"iteration().start_run(fields(), order=np.arange(3), bounds=np.array(0), {RUN})": (
        "TypeError: a schedule's bounds"
    ),
    f"_core.Iteration(Plan(), {ITERATION}, rows=1, stats=None)": "TypeError",
    f"_core.Iteration(Plan(), {ITERATION}, rows=0, stats=_core.Stats())": (
        "ValueError: a step holds at least one observation"
    ),
    "next(iteration())": "RuntimeError: this iteration was not started",
    f"_core.Iteration(Plan(), {ITERATION}, rows=1, stats=_core.Stats(), watches=[object()])": (
        "TypeError: watches must be SlotWatch objects"
    ),
    "iteration().start_run(fields(), order=np.arange(3), bounds=None, first_step=0, end_step=1, "
    "seed=0, epoch=0, parallel=-1, claim_size=1, ordered=True, skip_errors=False, "
    "release_gil=True, filler=None)": "ValueError: parallel is a number of pool threads",
    "iteration().start_run(fields(), order=np.arange(3), bounds=None, first_step=0, end_step=1, "
    "seed=0, epoch=0, parallel=1, claim_size=0, ordered=True, skip_errors=False, "
    "release_gil=True, filler=None)": "ValueError: a claim takes at least one item",
    "iteration().start_run(fields(), order=np.arange(3), bounds=None, first_step=0, end_step=1, "
    "seed=0, epoch=0, parallel=1, claim_size=1, ordered=True, skip_errors=False, "
    "release_gil=True, filler=print, adaptive=True)": (
        "ValueError: adaptive=True needs fields that run no Python code"
    ),
    "iteration().go_inline()": "RuntimeError: go_inline needs a native run",
    "iteration(4, 2, 'gather').watch(np.frombuffer(bytearray(17), np.int64, 2, 1), 0)": (
        "TypeError: the watched word must be a 1-D aligned int64 array"
    ),
}


@pytest.mark.parametrize("call", list(REFUSED))
def test_a_call_that_killed_the_interpreter_raises_instead(call):
    code, _, output = core_calls.run([call], timeout_s=60)
    assert core_calls.completed(code, output), f"{call}: {code}\n{output[-2000:]}"
    expected = REFUSED[call]
    if expected is None:
        assert "ok 0" in output.splitlines()
    else:
        assert f"raised 0 {expected}" in output


def test_image_source_run_refuses_an_out_it_would_fill_through_a_copy():
    image = np.arange(48, dtype=np.uint8).reshape(4, 4, 3)
    source = image_source(buffers=[_core.qoi_encode(image)])
    out = np.zeros((4, 8, 3), np.uint8)[:, ::2]  # reshaped, a copy: the output lost in it
    with pytest.raises(ValueError, match="writable C-contiguous"):
        source.run(_core.qoi_encode(image), out)
    whole = np.zeros((4, 4, 3), np.uint8)
    assert np.array_equal(source.run(_core.qoi_encode(image), whole), image)


@pytest.mark.parametrize(
    "where, match",
    [
        ({"offsets": (np.zeros(8, np.int64), [0, 8])}, "the base must be a uint8 array"),
        ({"offsets": (np.zeros(8, np.uint8), [0.0, 7.9])}, "offsets must be a 1-D"),
        ({"offsets": (np.zeros(8, np.uint8), [[0, 4], [4, 8]])}, "offsets must be a 1-D"),
        ({"spans": ([np.zeros(8, np.float32)], None, [0], [4])}, "each base must be a uint8"),
        ({"spans": ([np.zeros(8, np.uint8)], None, [[0, 1]], [[4, 5]])}, "starts must be a 1-D"),
        ({"spans": ([np.zeros(8, np.uint8)], [0.5], [0], [4])}, "base_of must be a 1-D"),
    ],
    ids=["int64-base", "float-offsets", "2d-offsets", "float-base", "2d-spans", "float-base-of"],
)
def test_spans_and_offsets_that_a_cast_would_change_are_refused(where, match):
    # A cast would have read other bytes than the ones given, without a word.
    with pytest.raises(ValueError, match=match):
        image_source(**where)


def test_a_run_without_fields_is_refused():
    it = core_calls.iteration()
    fields = _core.Fields([], [])
    with pytest.raises(ValueError, match="at least one field"):
        it.start_run(
            fields,
            order=np.arange(3),
            bounds=None,
            first_step=0,
            end_step=1,
            seed=0,
            epoch=0,
            parallel=0,
            claim_size=1,
            ordered=True,
            skip_errors=False,
            release_gil=True,
            filler=None,
        )


NAN = float("nan")


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: _core.Pipeline(crop="random_resized", crop_size=(4, 4), scale=(NAN, 1)), "scale"),
        (lambda: _core.Pipeline(mean=(0.5,) * 3, std=(0.5, 0.0, 0.5)), "std of 0"),
        (lambda: _core.Pipeline(mean=(NAN,) * 3, std=(0.5,) * 3), "mean must be a finite"),
        (
            lambda: _core.Pipeline(
                pixel_ops=[{"kind": "jitter", "op": 0, "ranges": [(NAN, 1.0), None, None, None]}]
            ),
            "ColorJitter must be a finite",
        ),
        (
            lambda: _core.Pipeline(pixel_ops=[{"kind": "grayscale", "op": 0, "p": NAN}]),
            "RandomGrayscale: p",
        ),
        (
            lambda: _core.Pipeline(
                pixel_ops=[{"kind": "blur", "op": 0, "kernel": (3, 3), "sigma": (NAN, 1.0)}]
            ),
            "GaussianBlur: sigma",
        ),
        (
            lambda: _core.Pipeline(
                erasing={"op": 0, "p": 0.5, "scale": (0.1, 0.2), "ratio": (0.3, 3), "value": [NAN]}
            ),
            "RandomErasing: value",
        ),
        (lambda: _core.color_jitter(np.zeros((2, 2, 3), np.uint8), [NAN, None, None, None]), "fac"),
        (lambda: _core.normalize(np.zeros((2, 2, 1), np.uint8), [0.5], [0.0]), "std of 0"),
        (lambda: _core.erasing_params(9, 9, NAN, (0.1, 0.2), (0.3, 3)), "erasing_params: p"),
        (lambda: _core.mixup_(np.zeros((2, 3), np.float32), NAN), "mixup: lam"),
    ],
    ids=[
        "rrc-scale",
        "std-0",
        "mean-nan",
        "jitter",
        "grayscale",
        "blur",
        "erasing-value",
        "color-jitter",
        "normalize",
        "erasing-p",
        "mixup",
    ],
)
def test_nan_parameters_are_refused_before_c_turns_them_into_pixels(make, match):
    # A NaN made black pixels (color_jitter), pixels of NaN (mixup_), or an error only
    # when the first image ran.
    with pytest.raises(ValueError, match=match):
        make()


def test_sizes_and_mixes_that_c_arithmetic_cannot_hold_are_refused():
    # Each of these overflowed an int (or a uint8) inside C, undefined behaviour that
    # UBSan reports and that gave offsets or pixels of no meaning.
    with pytest.raises(ValueError, match="sizes are at least 1"):
        _core.center_crop_params(25, 14, -(2**31), 24)
    with pytest.raises(ValueError, match="random_crop_params"):
        _core.random_crop_params(30, 2**31 - 1, 35, 15, -(2**31))
    with pytest.raises(ValueError, match="random_crop_params"):
        _core.random_crop_params(30, 30, 35, 15, 2**30)
    batch = np.zeros((4, 2, 2, 3), np.uint8)
    for lam in (-0.5, 1.5, 2.0**63):
        with pytest.raises(ValueError, match=r"lam must be in \[0, 1\]"):
            _core.mixup_(batch, lam)
    assert _core.random_crop_params(30, 30, 35, 15, 4) is not None


def test_a_cutmix_box_near_the_int_limit_is_clamped_to_the_image():
    # The centre plus half a side passed INT_MAX inside C before it was clamped.
    lam, (y, x, h, w) = _core.cutmix_params(0.8, 12, 34, 38, 2**31 - 1, 26)
    assert 0 <= y and 0 <= x and 0 <= h and 0 <= w
    assert y + h <= 2**31 - 1 and x + w <= 26
    assert 0 <= lam <= 1


# What the binding validates and keeps is its own: a caller that changes its arrays or lists
# afterwards changes nothing that C reads or writes (it overran the heap, or C wrote into
# freed memory). The crashes run in a child: a regression fails the test, not the suite.
def start(it, fields, order, bounds=None, first_step=0, end_step=3, **options):
    options = {"parallel": 0, "claim_size": 1, "ordered": True, **options}
    it.start_run(
        fields, order=order, bounds=bounds, first_step=first_step, end_step=end_step, seed=0,
        epoch=0, skip_errors=False, release_gil=True, filler=None, **options,
    )  # fmt: skip


def observations(indices):
    """What core_calls.fields("gather") loads for the observations `indices`."""
    return core_calls.arr((10, 2, 3))[indices]


def in_a_child(code):
    """Runs `code` (with the names of core_calls.NAMESPACE) in a child process: whether it
    ran to its end without an exception, and what the child wrote."""
    code_, _, output = core_calls.run([f"exec({code!r})"], timeout_s=60)
    return core_calls.completed(code_, output) and "ok 0" in output.splitlines(), output


@pytest.mark.parametrize("parallel", [0, 2])
def test_a_run_loads_the_order_and_bounds_as_they_were_when_it_started(parallel):
    order, bounds = np.arange(10, dtype=np.int64), np.array([0, 3, 7, 10], np.int64)
    it = core_calls.iteration(4, 3)
    start(it, core_calls.fields("gather"), order, bounds, parallel=parallel)
    order[:] = order[::-1].copy()
    bounds[:] = [0, 1, 2, 3]
    steps = [batch[0].copy() for batch in it]  # views of a reused slot
    assert [len(step) for step in steps] == [3, 4, 3]
    assert np.array_equal(np.concatenate(steps), observations(np.arange(10)))


def test_bounds_changed_after_start_run_cannot_overrun_a_slot():
    # The bounds were checked, then read again by C as the caller left them: steps of
    # 2**62 items written into slots of 4 rows (heap-buffer-overflow in fl_fill_gather).
    ran, output = in_a_child(
        """
it = iteration(4, 2)
bounds = np.array([0, 3, 7, 10])
it.start_run(fields('gather'), order=np.arange(10), bounds=bounds, first_step=0, end_step=3,
             seed=0, epoch=0, parallel=1, claim_size=1, ordered=True, skip_errors=False,
             release_gil=True, filler=None)
bounds[1:] = 2**62
sizes = [len(batch[0]) for batch in it]
assert sizes == [3, 4, 3], sizes
"""
    )
    assert ran, output[-2000:]


def test_a_ring_changed_after_an_iteration_was_made_is_not_where_it_writes_or_reads():
    # C kept pointers into the arrays of the caller's ring list: replacing them freed the
    # memory C went on writing into, and the steps came from the new, empty arrays.
    ran, output = in_a_child(
        """
ring = [[np.zeros((4, 2, 3), np.uint8)] for _ in range(2)]
it = _core.Iteration(Plan(), ring=ring, values=[None, None], objects=[[[]], [[]]], rows=4,
                     buffer=False, stats=_core.Stats(), progress=_core.Progress())
it.start_run(fields('gather'), order=np.arange(8), bounds=None, first_step=0, end_step=2,
             seed=0, epoch=0, parallel=1, claim_size=1, ordered=True, skip_errors=False,
             release_gil=True, filler=None)
for dests in ring:
    dests[0] = np.zeros((4, 2, 3), np.uint8)
ring.clear()
steps = [batch[0].copy() for batch in it]  # views of a reused slot
assert np.array_equal(np.concatenate(steps), arr((10, 2, 3))[:8])
"""
    )
    assert ran, output[-2000:]


def test_the_kinds_and_row_sizes_of_fields_cannot_be_changed_under_c():
    # A gather field changed into a Python one had no destination (C wrote at NULL); a
    # smaller row size let a run take destinations too small for what C copies.
    fields = core_calls.fields("gather")
    assert fields.kinds == (LeafKind.GATHER,) and fields.row_bytes == (6,)
    with pytest.raises(TypeError):
        fields.kinds[0] = LeafKind.OBJECT  # type: ignore[index]
    with pytest.raises(TypeError):
        fields.row_bytes[0] = 1  # type: ignore[index]


def test_a_destination_of_one_row_whose_bytes_are_fewer_than_a_row_is_refused():
    # numpy calls an array of one row C-contiguous whatever its first stride says: a row
    # of 3 bytes passed for one of 6, and C copied 6.
    short = np.lib.stride_tricks.as_strided(np.zeros((1, 1, 3), np.uint8), strides=(6, 3, 1))
    it = _core.Iteration(
        core_calls.Plan(), ring=[[short]], values=[None], objects=[[[]]], rows=1,
        buffer=False, stats=_core.Stats(), progress=_core.Progress(),
    )  # fmt: skip
    with pytest.raises(ValueError, match="a destination must be"):
        start(it, core_calls.fields("gather"), np.arange(10), end_step=1)


def test_a_run_from_a_later_step_numbers_its_steps_as_the_schedule_does():
    # A run copies the order and bounds from its first step on, numbering them from 0 for
    # C; what it reports (steps, failed observations) is in the caller's numbers.
    order = np.array([0, 1, 2, 3, 4, 5, 99, 7, 8, 9], np.int64)
    it = core_calls.iteration(4, 2)
    start(it, core_calls.fields("gather"), order, np.array([0, 3, 5, 8, 10]), 1, 4)
    step, rows, failure, keep = it.load_next()
    assert (step, rows, failure, keep) == (1, 2, None, None)
    step, rows, failure, _ = it.load_next()
    assert (step, rows) == (2, 3) and failure[:3] == (2, 0, 99)
    assert "index 99 is out of range" in failure[3]


def test_a_loaded_step_and_its_failure_are_named_tuples():
    order = np.array([0, 1, 2, 99], np.int64)
    it = core_calls.iteration(2, 2)
    start(it, core_calls.fields("gather"), order, end_step=2)
    loaded = it.load_next()
    assert isinstance(loaded, Loaded) and (loaded.step, loaded.rows) == (0, 2)
    assert loaded.failure is None and loaded.keep is None
    failure = it.load_next().failure
    assert isinstance(failure, Failure)
    assert (failure.step, failure.field, failure.observation) == (1, 0, 99)
    assert "index 99 is out of range" in failure.message and failure.cause is None


@pytest.mark.parametrize(
    "rows, options",
    [
        (4, {"parallel": 2, "claim_size": 2**63 - 1}),
        (4, {"parallel": 2**31 - 1, "claim_size": 2**62, "ordered": False}),
        (2**63 - 1, {"parallel": 0, "claim_size": 1}),
        (2**62, {"parallel": 2, "claim_size": 2**62}),
    ],
    ids=["claim-size", "threads", "rows-inline", "rows-parallel"],
)
def test_counts_near_the_int64_limit_load_every_step(rows, options):
    # Each overflowed inside C (UBSan: signed-integer-overflow in csrc/engine.c): a claim
    # or a thread count that ended the run with "could not start the native thread pool",
    # steps of 2**63 - 1 rows that loaded nothing, or a run that never ended.
    seen = []
    it = _core.Iteration(
        core_calls.Plan(), ring=[[None], [None]], values=[None, None], objects=[[[]], [[]]],
        rows=rows, buffer=False, stats=_core.Stats(), progress=_core.Progress(),
    )  # fmt: skip
    fields = _core.Fields([(LeafKind.OBJECT, None)], [2**62])  # no destination: no offset
    it.start_run(
        fields, order=np.arange(10), bounds=None, first_step=0, end_step=10, seed=0, epoch=0,
        skip_errors=False, release_gil=True, filler=lambda slot, f, pos, i: seen.append(i),
        **{"ordered": True, **options},
    )  # fmt: skip
    steps = list(it)
    assert sorted(seen) == list(range(10))
    assert len(steps) == (3 if rows == 4 else 1)
