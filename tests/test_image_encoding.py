"""The writer's image encoding: the area resize (exact, against a rational reference and a
full decode of natural photos), JPEG chroma subsampling against Pillow's encoder at the same
quality, and what a file and ``python -m fastload info`` say about it.

The photos in tests/data/photos are scikit-image's sample photos (public domain or CC0:
tests/data/photos/README.md), stored as JPEG at quality 90, 4:2:0, as a camera would.
"""

import io
import os
import shutil
from fractions import Fraction

import numpy as np
import pytest
import simplejpeg
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from fastload import _core
from fastload import storage as fs
from fastload.__main__ import main
from fastload._images.encoding import fit_pixels, fit_size, resize_area
from fastload._storage.fields import from_meta
from fastload.storage import JPEG, QOI, Smart
from fastload.storage.info import describe

PHOTOS = os.path.join(os.path.dirname(__file__), "data", "photos")
PHOTO_NAMES = sorted(name for name in os.listdir(PHOTOS) if name.endswith(".jpg"))
PILLOW_SUBSAMPLING = {"444": 0, "422": 1, "420": 2}


def photo(name):
    with open(os.path.join(PHOTOS, name), "rb") as f:
        return f.read()


def full_decode_then_area(data, max_side):
    """The reference resize: Pillow's full-size decode, then the exact area mean."""
    img = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    return resize_area(img, fit_size(img.shape[0], img.shape[1], max_side))


def sampling_factors(jpeg):
    """[(h, v), ...] per component, from the JPEG's start-of-frame segment."""
    i = 2
    while i < len(jpeg):
        marker, length = jpeg[i + 1], int.from_bytes(jpeg[i + 2 : i + 4], "big")
        if marker in (0xC0, 0xC1, 0xC2):
            count = jpeg[i + 9]
            comps = jpeg[i + 10 : i + 10 + 3 * count]
            return [(comps[k + 1] >> 4, comps[k + 1] & 15) for k in range(0, len(comps), 3)]
        i += 2 + length
    raise ValueError("no start-of-frame segment")


def pillow_jpeg(img, quality, subsampling):
    out = io.BytesIO()
    Image.fromarray(img).save(out, "JPEG", quality=quality, subsampling=subsampling)
    return out.getvalue()


def exact_area(img, size):
    """The area mean of each output pixel in exact fractions, rounded half up."""
    h, w, c = img.shape

    def weights(n, m):
        rows = []
        for j in range(m):
            lo, hi = Fraction(j * n, m), Fraction((j + 1) * n, m)
            rows.append({i: min(hi, i + 1) - max(lo, i) for i in range(n) if lo < i + 1 and i < hi})
        return rows

    wy, wx = weights(h, size[0]), weights(w, size[1])
    out = np.zeros(size + (c,), np.uint8)
    for y, row in enumerate(wy):
        for x, col in enumerate(wx):
            for k in range(c):
                total = sum(
                    a * b * int(img[i, j, k]) for i, a in row.items() for j, b in col.items()
                )
                mean = total / (Fraction(h, size[0]) * Fraction(w, size[1]))
                out[y, x, k] = int(mean + Fraction(1, 2))
    return out


# ---- the area resize ----------------------------------------------------------------


@st.composite
def shrinks(draw):
    h, w = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    c = draw(st.sampled_from([1, 3, 4]))
    seed = draw(st.integers(0, 2**32 - 1))
    img = np.random.default_rng(seed).integers(0, 256, (h, w, c), np.uint8)
    return img, (draw(st.integers(1, h)), draw(st.integers(1, w)))


@given(shrinks())
def test_resize_area_is_the_exact_mean_of_each_covered_area(case):
    img, size = case
    out = resize_area(img, size)
    assert out.flags.c_contiguous and out.dtype == np.uint8
    assert np.array_equal(out, exact_area(img, size))


def numpy_area(img, size):
    """The area mean by two separable passes of exact int64 sums in numpy (rounded half up
    in integers): a reference fast enough for large images, where ``exact_area`` is not."""

    def sums(x, m):  # along the first axis, times x.shape[0]
        n = x.shape[0]
        out = np.zeros((m,) + x.shape[1:], np.int64)
        for j in range(m):
            a, b = j * n, (j + 1) * n
            lo, hi = a // m, b // m
            out[j] = x[lo:hi].astype(np.int64).sum(axis=0) * m
            out[j] += (b % m) * x[min(hi, n - 1)].astype(np.int64)
            out[j] -= (a % m) * x[min(lo, n - 1)].astype(np.int64)
        return out

    h, w = img.shape[:2]
    total = sums(sums(img, size[0]).swapaxes(0, 1), size[1]).swapaxes(0, 1)
    return ((2 * total + h * w) // (2 * h * w)).astype(np.uint8)


@st.composite
def large_shrinks(draw):
    h, w = draw(st.integers(1, 300)), draw(st.integers(1, 300))
    c = draw(st.sampled_from([1, 3, 4]))
    img = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).integers(
        0, 256, (h, w, c), np.uint8
    )
    size = (draw(st.integers(1, h)), draw(st.integers(1, w)))
    if draw(st.booleans()) and w > 2:  # a view with a row stride past its width
        img = img[:, 1 : w - 1]
        size = (size[0], min(size[1], w - 2))
    return img, size


@given(large_shrinks())
def test_resize_area_in_c_equals_numpys_integer_sums_on_large_and_strided_images(case):
    img, size = case
    assert np.array_equal(resize_area(img, size), numpy_area(img, size))


def test_resize_area_sums_in_64_bits_where_32_would_overflow():
    # Below 2.8 million rows the first pass sums in int32; this column takes the int64 one.
    rng = np.random.default_rng(0)
    img = rng.integers(200, 256, (2_900_001, 1, 1), np.uint8)
    for size in ((3, 1), (1, 1), (1000, 1)):
        assert np.array_equal(resize_area(img, size), numpy_area(img, size))
    tall = np.full((2_900_001, 2, 3), 255, np.uint8)
    assert (resize_area(tall, (7, 1)) == 255).all()


def test_resize_area_into_reused_buffers_equals_numpys_sums_and_overwrites_them_whole():
    """One out and one scratch per size, reused over images of one size and then of
    others, as the encoders reuse them: each result is numpy's, none left from before."""
    rng = np.random.default_rng(1)
    scratch = np.full(1 << 16, 77, np.uint8)
    for h, w, c, oh, ow in [(97, 130, 3, 40, 53), (97, 130, 3, 40, 53), (64, 64, 4, 9, 31)]:
        out = np.full((oh, ow, c), 77, np.uint8)
        for _ in range(2):
            img = rng.integers(0, 256, (h, w, c), np.uint8)
            need = _core.resize_area_scratch_bytes(h, w, c, oh, ow)
            got = _core.resize_area(img, oh, ow, out=out, scratch=scratch[:need])
            assert got is out and np.array_equal(got, numpy_area(img, (oh, ow)))


def test_resize_area_refuses_buffers_it_cannot_write_whole():
    img = np.zeros((20, 30, 3), np.uint8)
    need = _core.resize_area_scratch_bytes(20, 30, 3, 10, 15)
    assert need > 0 and _core.resize_area_scratch_bytes(20, 30, 3, 21, 15) == 0
    bad_outs = [
        np.zeros((10, 15, 4), np.uint8),  # another channel count
        np.zeros((10, 15, 6), np.uint8)[:, :, ::2],  # pixels not contiguous
        np.zeros((10, 15, 3), np.uint16),
        np.zeros((10, 15, 3), np.uint8)[::-1],
    ]
    readonly = np.zeros((10, 15, 3), np.uint8)
    readonly.flags.writeable = False
    for out in bad_outs + [readonly]:
        with pytest.raises(
            ValueError, match=r"out must be a writable uint8 array of shape \(10, 15, 3\)"
        ):
            _core.resize_area(img, 10, 15, out=out)
    with pytest.raises(TypeError, match="out must be a numpy array"):
        _core.resize_area(img, 10, 15, out=bytearray(450))
    with pytest.raises(ValueError, match=f"scratch must be .* at least {need} bytes"):
        _core.resize_area(img, 10, 15, scratch=np.zeros(need - 1, np.uint8))
    with pytest.raises(ValueError, match="scratch must be"):
        _core.resize_area(img, 10, 15, scratch=np.zeros(2 * need, np.uint8)[::2])
    with pytest.raises(TypeError, match="scratch must be a numpy array"):
        _core.resize_area(img, 10, 15, scratch=bytearray(need))
    gappy = np.zeros((10, 20, 3), np.uint8)[:, :15]  # rows wider than the image: written
    assert _core.resize_area(img + 9, 10, 15, out=gappy) is gappy and (gappy == 9).all()


def test_the_encoders_buffers_give_each_image_the_bytes_of_fresh_arrays(monkeypatch):
    """The JPEG, QOI and Smart fields shrink in this thread's buffers: photos of several
    sizes in turn, larger after smaller and back, on two threads at once, and past the
    size a thread keeps (``REUSED_BYTES``), encode to the bytes of a decode and shrink
    into new arrays."""
    from concurrent.futures import ThreadPoolExecutor

    from fastload._images import encoding

    fields = [JPEG(max_side=120), JPEG(max_side=90, exact=False), QOI(max_side=64)]
    fields.append(Smart(max_side=200, threshold_bytes=1000))
    inputs = [photo(name) for name in PHOTO_NAMES] * 2
    inputs.insert(1, np.random.default_rng(2).integers(0, 256, (300, 250, 3), np.uint8))

    def fresh(field, value):
        with monkeypatch.context() as m:
            m.setattr(encoding, "REUSED_BYTES", 0)  # every buffer a new array
            return field.encode(value)

    expected = [[fresh(field, value) for value in inputs] for field in fields]
    for field, want in zip(fields, expected):
        assert [field.encode(value) for value in inputs] == want
        with ThreadPoolExecutor(2) as pool:
            assert list(pool.map(field.encode, inputs)) == want
    assert encoding._reused.slots["decoded"].nbytes > 0  # the buffers were used


def test_resize_area_only_shrinks():
    for size in [(5, 4), (4, 5), (0, 4), (4, 0)]:
        with pytest.raises(ValueError, match="only shrinks"):
            resize_area(np.zeros((4, 4, 3), np.uint8), size)


@pytest.mark.parametrize("name", PHOTO_NAMES)
@pytest.mark.parametrize("max_side", [256, 128, 64, 37])
def test_the_writer_shrinks_a_photo_as_a_full_decode_then_the_area_mean(tmp_path, name, max_side):
    data = photo(name)
    # QOI is lossless: the stored pixels are the resize's output.
    fs.write(tmp_path / "p.arrow", [{"im": data}], {"im": QOI(max_side=max_side)}, progress=False)
    assert np.array_equal(
        fs.open(tmp_path / "p.arrow")[0]["im"], full_decode_then_area(data, max_side)
    )


@pytest.mark.parametrize("max_side", [256, 128, 64])
def test_the_reduced_scale_decode_stays_within_its_documented_error_on_photos(max_side):
    """docs/format.md: exact=False is on average 1-2 gray levels off, 99th percentile
    12-21, at longer sides 256, 128 and 64 (scikit-image's photos)."""
    diffs = [
        np.abs(
            fit_pixels(photo(name), max_side, exact=False).astype(int)
            - full_decode_then_area(photo(name), max_side)
        ).ravel()
        for name in PHOTO_NAMES
    ]
    d = np.concatenate(diffs)
    assert d.mean() <= 2 and np.percentile(d, 99) <= 21


def test_the_reduced_scale_decode_is_a_power_of_two_scale_no_smaller_than_the_target():
    data = photo("coffee.jpg")  # 400 x 600
    # 1/4 scale (100 x 150) is the smallest no smaller than 67 x 100: 1/8 would be 50 x 75
    assert fit_pixels(data, 100, exact=False).shape == (67, 100, 3)
    img = simplejpeg.decode_jpeg(data, min_height=100, min_width=150, min_factor=4)
    assert img.shape[:2] == (100, 150)
    assert np.array_equal(fit_pixels(data, 100, exact=False), resize_area(img, (67, 100)))


# ---- JPEG chroma subsampling ----------------------------------------------------------


@pytest.mark.parametrize("subsampling", ["444", "422", "420"])
def test_jpeg_subsampling_encodes_as_pillow_does_at_the_same_quality(subsampling):
    for name in PHOTO_NAMES:
        img = fit_pixels(photo(name), 256, exact=True)
        ours = JPEG(quality=90, subsampling=subsampling, restart_px=None).encode(img)[0]
        ref = pillow_jpeg(img, 90, PILLOW_SUBSAMPLING[subsampling])
        assert sampling_factors(ours) == sampling_factors(ref)
        assert abs(len(ours) / len(ref) - 1) < 0.02
        ours_px = np.asarray(Image.open(io.BytesIO(ours)).convert("RGB")).astype(int)
        ref_px = np.asarray(Image.open(io.BytesIO(ref)).convert("RGB")).astype(int)
        assert np.abs(ours_px - ref_px).mean() < 1.5
        # as close to the pixels encoded as Pillow's encoder gets
        assert np.abs(ours_px - img).mean() <= np.abs(ref_px - img).mean() + 0.25


def test_the_default_subsampling_is_pillows_4_2_0_at_every_quality():
    img = fit_pixels(photo("chelsea.jpg"), 64, exact=True)
    for quality in (50, 90, 100):
        ours = JPEG(quality=quality).encode(img)[0]
        ref = io.BytesIO()
        Image.fromarray(img).save(ref, "JPEG", quality=quality)
        assert (
            sampling_factors(ours) == sampling_factors(ref.getvalue()) == [(2, 2), (1, 1), (1, 1)]
        )
    assert JPEG().subsampling == Smart(0).subsampling == "420"


@pytest.mark.parametrize("bad", ["4:2:0", "411", 2, None, "Gray"])
@pytest.mark.parametrize("encoding", [JPEG, lambda **kw: Smart(0, **kw)])
def test_a_bad_subsampling_is_refused_naming_the_values(encoding, bad):
    with pytest.raises(ValueError, match='"444", "422" or "420"'):
        encoding(subsampling=bad)


@pytest.mark.parametrize("encoding", [JPEG, QOI, lambda **kw: Smart(0, **kw)])
def test_exact_must_be_a_bool(encoding):
    with pytest.raises(TypeError, match="exact must be True or False"):
        encoding(exact="yes")


def test_smart_encodes_its_jpeg_rows_with_its_subsampling(tmp_path):
    img = fit_pixels(photo("rocket.jpg"), 128, exact=True)
    fs.write(
        tmp_path / "s.arrow", [{"im": img}], {"im": Smart(0, subsampling="422")}, progress=False
    )
    ds = fs.open(tmp_path / "s.arrow")
    assert sampling_factors(bytes(ds["im"].encoded[0])) == [(2, 1), (1, 1), (1, 1)]


# ---- what a file says ---------------------------------------------------------------


def test_subsampling_and_exact_are_kept_in_the_file(tmp_path):
    fields = {
        "a": JPEG(quality=80, max_side=64, subsampling="444", exact=False),
        "b": Smart(100, subsampling="422"),
        "c": QOI(max_side=64, exact=False),
    }
    img = fit_pixels(photo("chelsea.jpg"), 128, exact=True)
    fs.write(tmp_path / "f.arrow", [{"a": img, "b": img, "c": img}], fields, progress=False)
    assert fs.open(tmp_path / "f.arrow").fields == fields


def test_a_file_written_before_these_options_reads_as_it_was_written():
    """0.2 wrote 4:4:4 and decoded JPEG input at a reduced scale before resizing."""
    jpeg = from_meta({"encoding": "jpeg", "columns": ["im"], "quality": 90, "max_side": 256})
    assert (jpeg.subsampling, jpeg.exact) == ("444", False)
    smart = from_meta(
        {
            "encoding": "smart",
            "columns": ["im"],
            "threshold_bytes": 9,
            "quality": 90,
            "max_side": None,
        }
    )
    assert (smart.subsampling, smart.exact) == ("444", False)
    assert from_meta({"encoding": "qoi", "columns": ["im"], "max_side": None}).exact is False


def test_info_says_the_chroma_subsampling_of_the_stored_jpegs(tmp_path):
    img = fit_pixels(photo("coffee.jpg"), 64, exact=True)
    given_444 = pillow_jpeg(img, 90, 0)  # stored as given: it keeps its 4:4:4
    rows = [{"encoded": img, "given": given_444, "small": img} for _ in range(3)]
    fields = {"encoded": JPEG(), "given": JPEG(), "small": Smart(10**6)}
    fs.write(tmp_path / "i.arrow", rows, fields, progress=False)
    lines = [line.strip() for line in describe(fs.open(tmp_path / "i.arrow"))]
    after = {line.split()[0]: lines[k + 1] for k, line in enumerate(lines) if line[:1] in "egs"}
    assert lines[lines.index("fields:") + 1].endswith(
        "JPEG(quality=90, max_side=None, subsampling='420', exact=True, restart_px=32, "
        "keep_given=False)"
    )
    assert after["encoded"] == "chroma: 4:2:0 in 3 of the first 3 rows"
    assert after["given"] == "chroma: 4:4:4 in 3 of the first 3 rows"
    assert after["small"] == "chroma: no JPEG in the first 3 rows"


def test_convert_takes_the_subsampling(tmp_path, capsys):
    for k, name in enumerate(PHOTO_NAMES[:2]):
        (tmp_path / "src" / f"c{k}").mkdir(parents=True)
        shutil.copy(os.path.join(PHOTOS, name), tmp_path / "src" / f"c{k}" / name)
    dst = tmp_path / "out.arrow"
    argv = ["convert", str(tmp_path / "src"), str(dst), "--max-side", "64", "--no-progress"]
    assert main([*argv, "--subsampling", "444"]) == 0
    ds = fs.open(dst)
    assert ds.fields["image"] == JPEG(max_side=64, subsampling="444")
    assert sampling_factors(bytes(ds["image"].encoded[0])) == [(1, 1)] * 3
    assert main(["info", str(dst)]) == 0
    assert "chroma: 4:4:4 in 2 of the first 2 rows" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([*argv, "--subsampling", "4:2:0"])


def test_stored_bytes_at_longer_side_256_are_pillows_at_quality_90_4_2_0(tmp_path):
    """FFCV's recipe (OpenCV at quality 90, 4:2:0, longer side 256): Pillow's encoder, the
    same libjpeg tables and sampling, stands in for OpenCV's."""
    data = [photo(name) for name in PHOTO_NAMES]
    fs.write(
        tmp_path / "r.arrow", [{"im": d} for d in data], {"im": JPEG(max_side=256)}, progress=False
    )
    ds = fs.open(tmp_path / "r.arrow")
    ours = sum(len(ds["im"].encoded[i]) for i in range(len(ds)))
    ref = sum(len(pillow_jpeg(full_decode_then_area(d, 256), 90, 2)) for d in data)
    assert abs(ours / ref - 1) < 0.05
