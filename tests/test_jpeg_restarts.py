"""JPEG restart markers (csrc/jpeg.c): the writer adds them losslessly, and a crop of a
stream that has them entropy-decodes only the restart intervals under it, as a JPEG of
their own whose pixels must be the full decode's."""

import io
import os

import numpy as np
import pytest
import simplejpeg
from PIL import Image
from test_decode import JPEG_KINDS, NATIVE
from test_image_encoding import sampling_factors
from test_image_kernels import natural_image

from fastload import DataLoader, LoadError, mapobs
from fastload import storage as fs
from fastload.__main__ import main
from fastload._images.encoding import fit_pixels
from fastload._storage.fields import from_meta
from fastload.storage import JPEG, Smart
from fastload.storage.convert import convert
from fastload.transforms import Compose, DecodeImage, RandomCrop, RandomResizedCrop

pytestmark = pytest.mark.skipif(
    not NATIVE,
    reason="this build has no fastload._jpeg (libjpeg-turbo's headers were missing at build "
    "time), so JPEGs are written without restart markers and decoded whole: install "
    "libjpeg-turbo's headers (libturbojpeg0-dev or libjpeg-turbo8-dev) and rebuild to test them",
)

PHOTOS = os.path.join(os.path.dirname(__file__), "data", "photos")
PHOTO_NAMES = sorted(name for name in os.listdir(PHOTOS) if name.endswith(".jpg"))


def _jpeg():
    from fastload import _jpeg

    return _jpeg


def markers(data):
    """(restart interval in MCUs or 0, the RST markers in the scan, MCU width in pixels)."""
    factors = sampling_factors(data)
    mcu_w = 8 * max(h for h, _ in factors) if len(factors) > 1 else 8
    i, interval = 2, 0
    while data[i + 1] != 0xDA:
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        if data[i + 1] == 0xDD:
            interval = int.from_bytes(data[i + 4 : i + 6], "big")
        i += 2 + length
    scan = data[i + 2 + int.from_bytes(data[i + 2 : i + 4], "big") :]
    return interval, sum(scan.count(bytes([0xFF, 0xD0 + k])) for k in range(8)), mcu_w


def pixels(data):
    """PIL's decode (its own libjpeg-turbo, not fastload's)."""
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im)


# The plain encoders of test_decode's kinds: simplejpeg at 4:2:0, 4:2:2, 4:4:4 and gray.
ENCODERS = {kind: JPEG_KINDS[kind] for kind in ("420", "422", "444", "gray")}


@pytest.mark.parametrize("kind", ENCODERS)
@pytest.mark.parametrize("span", [1, 16, 32, 100])
def test_markers_are_added_without_changing_a_pixel(kind, span):
    for h, w in [(37, 53), (64, 64), (200, 333), (256, 171)]:
        data = ENCODERS[kind](natural_image(h, w, seed=h + w))
        with_markers = _jpeg().add_restarts(data, span)
        assert np.array_equal(pixels(with_markers), pixels(data))
        interval, count, mcu_w = markers(with_markers)
        per_row = -(-w // mcu_w)
        rows = -(-h // (8 if kind in ("444", "gray") else 16 if kind == "420" else 8))
        assert interval >= 1 and per_row % interval == 0
        assert interval == 1 or interval * mcu_w <= span
        # the most MCUs that divide the row within the span
        assert not any(per_row % k == 0 for k in range(interval + 1, span // mcu_w + 1))
        assert count == rows * per_row // interval - 1
        assert markers(data)[:2] == (0, 0)


def test_a_progressive_stream_is_left_as_it_is_and_garbage_is_an_error():
    img = natural_image(40, 50)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "JPEG", progressive=True)
    assert _jpeg().add_restarts(buf.getvalue()) == buf.getvalue()
    with pytest.raises(ValueError, match="corrupt or truncated JPEG"):
        _jpeg().add_restarts(buf.getvalue()[:20] + b"\0" * 50)


@pytest.mark.parametrize("kind", ENCODERS)
def test_the_intervals_under_a_region_decode_as_the_whole_image_does(kind):
    """The part is a JPEG of its own: decoded by another decoder (PIL's), the region (with
    fl_jpeg_decode's one-pixel margin) holds the pixels of the whole image's decode."""
    rng = np.random.default_rng(len(kind))
    parts = 0
    for h, w in [(53, 37), (131, 200), (333, 256), (480, 640)]:
        data = _jpeg().add_restarts(ENCODERS[kind](natural_image(h, w, seed=h)), 16)
        whole = pixels(data)
        for _ in range(15):
            rh, rw = int(rng.integers(1, h + 1)), int(rng.integers(1, w + 1))
            y, x = int(rng.integers(0, h - rh + 1)), int(rng.integers(0, w - rw + 1))
            found = _jpeg().part(data, 1, y, x, rh, rw)
            if found is None:  # every column from the first row: no interval to leave out
                assert y - 1 < 16 and x - 1 < 16 and x + rw + 1 > w - 16
                continue
            part, dy, dx = found
            parts += 1
            got = pixels(part)
            assert len(part) < len(data)
            assert 0 <= dy <= max(y - 1, 0) and 0 <= dx <= max(x - 1, 0)
            assert dy + got.shape[0] >= min(y + rh + 1, h)
            assert dx + got.shape[1] >= min(x + rw + 1, w)
            region = got[y - dy : y - dy + rh, x - dx : x - dx + rw]
            assert np.array_equal(region, whole[y : y + rh, x : x + rw]), (h, w, y, x, rh, rw)
    assert parts > 30


@pytest.mark.parametrize("kind", ENCODERS)
def test_crops_of_marked_and_plain_streams_are_the_same_pixels_at_every_scale(kind):
    """Markers change no coefficient, so a pipeline's crop (decoded through the restart
    intervals under it, at the DCT scale the pipeline picks) gives the plain stream's
    pixels, bit for bit: at full scale, and at 1/2, 1/4 and 1/8 where the crop is large."""
    chains = [
        Compose([DecodeImage(), RandomResizedCrop(24)]),
        Compose([DecodeImage(), RandomResizedCrop(8, scale=(0.05, 0.3))]),
        Compose([DecodeImage(), RandomResizedCrop(64)]),
        Compose([DecodeImage(), RandomCrop(20, padding=3)]),
    ]
    scales = set()
    for h, w in [(53, 37), (333, 256), (1001, 777)]:
        plain = ENCODERS[kind](natural_image(h, w, seed=h))
        for span in (8, 32):
            marked = _jpeg().add_restarts(plain, span)
            for chain in chains:
                for index in range(6):
                    scales.add(chain.pipeline.prepare(h, w, 0, 0, index)[1])
                    expected = chain(plain, index=index)
                    assert np.array_equal(chain(marked, index=index), expected), (h, w, index)
    assert scales == {1, 2, 4, 8}


def test_no_part_without_usable_intervals():
    img = natural_image(64, 80)  # 5 MCUs across at 4:2:0
    plain = simplejpeg.encode_jpeg(img, 90, colorsubsampling="420")
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "JPEG", quality=90, restart_marker_blocks=3)
    across_rows = buf.getvalue()  # intervals of 3 MCUs: not a whole number per row
    progressive = io.BytesIO()
    Image.fromarray(img).save(progressive, "JPEG", progressive=True, restart_marker_blocks=1)
    for data in (plain, across_rows, progressive.getvalue()):
        assert _jpeg().part(data, 1, 30, 30, 4, 4) is None
    every = _jpeg().add_restarts(plain, 16)
    assert _jpeg().part(every, 1, 30, 30, 4, 4) is not None
    assert _jpeg().part(every, 1, 0, 0, 64, 80) is None  # the whole image
    assert _jpeg().part(every[:-2], 1, 30, 30, 4, 4) is None  # no EOI
    assert _jpeg().part(every[: len(every) // 2] + every[-2:], 1, 30, 30, 4, 4) is None


def damaged(data, nbytes):
    """``data`` with the first ``nbytes`` of its scan replaced by bits that are no Huffman
    code of the standard tables."""
    at = data.index(b"\xff\xda")
    at += 2 + int.from_bytes(data[at + 2 : at + 4], "big")
    filler = b"\xff\x00" * (nbytes // 2) + b"\xfe" * (nbytes % 2)  # ones: no code
    return data[:at] + filler + data[at + nbytes :]


def first_interval_bytes(data):
    """The bytes of a scan's first restart interval, up to its marker."""
    at = data.index(b"\xff\xda")
    at += 2 + int.from_bytes(data[at + 2 : at + 4], "big")
    return data.index(b"\xff\xd0", at) - at


def test_a_crop_decodes_only_its_own_intervals():
    """Damage in the first restart interval (the top-left 16 x 16 pixels) fails the crops
    that need it and goes unnoticed by the others: they read none of its bytes. (A decode
    of the whole stream down to a crop's rows would entropy-decode the first MCU row for
    every crop, meet the damage, and at the interval's marker fail.)"""
    h, w = 64, 64
    plain = simplejpeg.encode_jpeg(natural_image(h, w, seed=4), 90, colorsubsampling="420")
    marked = _jpeg().add_restarts(plain, 16)
    nbytes = first_interval_bytes(marked)
    whole = pixels(plain)
    chain = Compose([DecodeImage(exact=True), RandomCrop(24)])
    near = far = 0
    for index in range(60):
        (y, x, _, _), _ = chain.pipeline.prepare(h, w, 0, 0, index)
        if y >= 17 or x >= 17:  # the crop and its margin miss the first interval
            far += 1
            assert np.array_equal(
                chain(damaged(marked, nbytes), index=index), whole[y : y + 24, x : x + 24]
            )
        else:
            near += 1
            with pytest.raises(ValueError, match="corrupt"):
                chain(damaged(marked, nbytes), index=index)
    assert near and far


def test_misnumbered_markers_are_an_error_not_a_shortcut():
    data = _jpeg().add_restarts(simplejpeg.encode_jpeg(natural_image(96, 96), 90), 16)
    at = data.index(b"\xff\xd3")
    wrong = data[:at] + b"\xff\xd5" + data[at + 2 :]
    chain = Compose([DecodeImage(), RandomResizedCrop(16)])
    for index in range(8):
        with pytest.raises(ValueError, match="corrupt or truncated JPEG"):
            chain(wrong, index=index)
    cut = data[: len(data) * 2 // 3]
    with pytest.raises(LoadError, match="image 0 of list: .*corrupt or truncated JPEG"):
        list(DataLoader(mapobs(chain, [cut, data]), 2, parallel=2))


def test_the_writer_adds_markers_by_default_and_says_so():
    img = natural_image(100, 150)
    assert JPEG().restart_px == Smart(0).restart_px == 32
    with_markers, h, w = JPEG(90).encode(img)
    without = JPEG(90, restart_px=None).encode(img)[0]
    assert (h, w) == (100, 150)
    assert markers(with_markers)[0] == 2 and markers(without)[0] == 0  # 32 px at 4:2:0
    assert np.array_equal(pixels(with_markers), pixels(without))
    assert 1 < len(with_markers) / len(without) < 1.1
    assert markers(Smart(0, restart_px=64).encode(img)[0])[0] == 2  # 10 MCUs: 2 divides
    # Files written before restart markers read as written without them.
    assert from_meta({"encoding": "jpeg", "quality": 90}).restart_px is None
    for bad in (0, -1, 1.5, True, "32", 70000):
        with pytest.raises(ValueError, match="restart_px must be an int 1..65535 or None"):
            JPEG(restart_px=bad)


def test_convert_and_its_command_line_write_markers_unless_told_not_to(tmp_path):
    src = tmp_path / "src" / "cat"
    src.mkdir(parents=True)
    for k in range(3):
        Image.fromarray(natural_image(80, 120, seed=k)).save(src / f"{k}.png")
    convert(str(tmp_path / "src"), str(tmp_path / "a.arrow"), progress=False)
    main(
        [
            "convert",
            str(tmp_path / "src"),
            str(tmp_path / "b.arrow"),
            "--restart-px",
            "0",
            "--no-progress",
        ]
    )
    a, b = fs.open(str(tmp_path / "a.arrow")), fs.open(str(tmp_path / "b.arrow"))
    assert markers(bytes(a["image"].encoded[0]))[0] > 0
    assert markers(bytes(b["image"].encoded[0]))[0] == 0
    assert a.fields["image"].restart_px == 32 and b.fields["image"].restart_px is None
    assert np.array_equal(a["image"][1], b["image"][1])


def test_photographs_cost_a_few_percent_more_bytes():
    """The markers' price on natural photographs at FFCV's recipe (longer side 256,
    quality 90, 4:2:0): what docs/format.md states."""
    for name in PHOTO_NAMES:
        with Image.open(os.path.join(PHOTOS, name)) as im:
            img = fit_pixels(np.asarray(im.convert("RGB")), 256, exact=True)
        ratio = len(JPEG(90).encode(img)[0]) / len(JPEG(90, restart_px=None).encode(img)[0])
        assert 1.0 < ratio < 1.045, name


def pillow_jpeg(img, quality, subsampling, restart_px):
    """Pillow's encoder (its own libjpeg-turbo) at the same settings: the accurate DCT, the
    standard tables, the restart interval the writer's rule gives."""
    h_factor = 1 if subsampling == "444" else 2
    per_row, blocks = -(-img.shape[1] // (8 * h_factor)), max(1, restart_px // (8 * h_factor))
    while per_row % blocks:
        blocks -= 1
    out = io.BytesIO()
    options = {"restart_marker_blocks": blocks} if restart_px else {}
    Image.fromarray(img).save(
        out,
        "JPEG",
        quality=quality,
        subsampling={"444": 0, "422": 1, "420": 2}[subsampling],
        **options,
    )
    return out.getvalue()


@pytest.mark.parametrize("subsampling", ["420", "422", "444"])
@pytest.mark.parametrize("restart_px", [0, 16, 32, 100])
def test_the_one_pass_encoder_writes_pillows_bytes(subsampling, restart_px):
    rng = np.random.default_rng(restart_px)
    for h, w, quality in ((1, 1, 90), (17, 33, 1), (100, 150, 90), (64, 200, 100), (9, 250, 57)):
        img = natural_image(h, w) if h > 8 else rng.integers(0, 256, (h, w, 3), np.uint8)
        got = _jpeg().encode(img, quality, subsampling, restart_px)
        assert got == pillow_jpeg(img, quality, subsampling, restart_px)
        if restart_px:  # the interval add_restarts puts in
            assert markers(got)[0] == markers(_jpeg().add_restarts(got, restart_px))[0]


def test_the_writer_encodes_in_one_pass_what_encoding_then_adding_markers_gives():
    img = natural_image(120, 90)
    stored = JPEG(85, subsampling="422").encode(img)[0]
    plain = _jpeg().encode(img, 85, "422", 0)
    assert stored == _jpeg().add_restarts(plain, 32)
    assert np.array_equal(pixels(stored), pixels(plain))


def test_the_encoder_refuses_what_it_cannot_encode():
    img = natural_image(20, 20)
    with pytest.raises(ValueError, match="subsampling must be one of"):
        _jpeg().encode(img, 90, "411")
    with pytest.raises(ValueError, match="quality must be 1..100"):
        _jpeg().encode(img, 0)
    with pytest.raises(ValueError, match=r"shape \(h, w, 3\)"):
        _jpeg().encode(np.zeros((4, 4, 4), np.uint8))
    with pytest.raises(ValueError, match="C-contiguous"):
        _jpeg().encode(np.zeros((4, 4, 4), np.uint8)[:, :, :3])
    with pytest.raises(ValueError):
        _jpeg().encode(np.zeros((0, 4, 3), np.uint8))


def test_bad_arguments_are_refused():
    data = _jpeg().add_restarts(simplejpeg.encode_jpeg(natural_image(40, 40), 90), 16)
    with pytest.raises(ValueError, match="empty JPEG"):
        _jpeg().add_restarts(b"")
    for denom, h, w, blob in ((3, 4, 4, data), (2, 0, 4, data), (1, 4, 4, b"")):
        with pytest.raises(ValueError, match="no part of"):
            _jpeg().part(blob, denom, 0, 0, h, w)


# ---- crops that are the full decode, at every width and edge --------------------------

# Every chroma subsampling simplejpeg writes (4:4:0 and 4:1:1 too), and gray.
SUBSAMPLINGS = ("444", "422", "420", "440", "411", "gray")


def encode(img, subsampling):
    if subsampling == "gray":
        return simplejpeg.encode_jpeg(np.ascontiguousarray(img[:, :, :1]), 90, colorspace="GRAY")
    return simplejpeg.encode_jpeg(img, 90, colorsubsampling=subsampling)


def region(data, y, x, h, w, channels=3, denom=1):
    """fl_jpeg_decode's pixels of exactly rows y..y+h and columns x..x+w."""
    got, h, w, c = _jpeg().decode_region(data, y, x, h, w, channels, denom)
    return np.frombuffer(got, np.uint8).reshape(h, w, c)


@pytest.mark.parametrize("subsampling", SUBSAMPLINGS)
def test_narrow_crops_at_the_edges_are_the_full_decode(subsampling):
    """Crops 1-8 pixels wide at the left edge, the right edge and the middle (and as tall,
    at the top, the bottom and the middle), of plain streams and through restart
    intervals, are the full decode's pixels bit for bit: the decoder widens a region so
    that its chroma keeps the full decode's smooth upsampling."""
    channels = 1 if subsampling == "gray" else 3
    for h, w in [(37, 53), (64, 98), (50, 100), (33, 131)]:
        plain = encode(natural_image(h, w, seed=h * w), subsampling)
        marked = _jpeg().add_restarts(plain, 16)
        whole = region(plain, 0, 0, h, w, channels)
        assert np.array_equal(whole, pixels(plain).reshape(h, w, channels))  # as PIL decodes
        assert np.array_equal(region(marked, 0, 0, h, w, channels), whole)
        for data in (plain, marked):
            for size in range(1, 9):
                for at in (0, (w - size) // 2, w - size):
                    for y in (h // 2 - 2, h - 4):
                        got = region(data, y, at, 4, size, channels)
                        assert np.array_equal(got, whole[y : y + 4, at : at + size]), (h, w, y, at)
                for at in (0, (h - size) // 2, h - size):
                    got = region(data, at, w // 2, size, 3, channels)
                    assert np.array_equal(got, whole[at : at + size, w // 2 : w // 2 + 3])


def test_narrow_random_crops_of_a_pipeline_are_the_full_decode():
    """The same through DecodeImage + RandomCrop, whose crops of a 9-pixel-wide image
    meet both edges."""
    for subsampling in ("420", "422"):
        plain = encode(natural_image(40, 9, seed=2), subsampling)
        whole = pixels(plain)
        for data in (plain, _jpeg().add_restarts(plain, 8)):
            for size in (1, 2, 3):
                chain = Compose([DecodeImage(), RandomCrop((5, size))])
                for index in range(40):
                    (y, x, _, _), _ = chain.pipeline.prepare(40, 9, 0, 0, index)
                    expected = whole[y : y + 5, x : x + size]
                    assert np.array_equal(chain(data, index=index), expected), (size, index)


# ---- damage in the intervals a crop decodes ---------------------------------------------


def interval_spans(data):
    """(start, end) of the entropy-coded bytes of each restart interval, in scan order."""
    at = data.index(b"\xff\xda")
    at += 2 + int.from_bytes(data[at + 2 : at + 4], "big")
    spans, start = [], at
    for k in range(at, len(data) - 1):
        if data[k] == 0xFF and (0xD0 <= data[k + 1] <= 0xD7 or data[k + 1] == 0xD9):
            spans.append((start, k))
            start = k + 2
    return spans


def extraneous(data, span):
    """``data`` with 8 bytes more at the end of one interval: its MCUs decode as before,
    and libjpeg finds the bytes left over at the next marker."""
    return data[: span[1]] + bytes(range(1, 9)) + data[span[1] :]


def bad_codes(data, span):
    """``data`` with the start of one interval made bits that are no Huffman code."""
    n = min(6, span[1] - span[0])
    return data[: span[0]] + b"\xff\x00" * (n // 2) + b"\xfe" * (n % 2) + data[span[0] + n :]


@pytest.mark.parametrize("subsampling", ("420", "422", "444", "gray"))
def test_damage_in_every_interval_a_crop_decodes_is_an_error(subsampling):
    """A crop through restart intervals reads 2 MCU rows x 3 intervals of a 4 x 6 grid:
    damage in any one of them (the first and the last too, whose end the decoder checks
    at the part's EOI) fails the crop as it fails the full decode; damage in the others
    goes unnoticed, the crop keeping the full decode's pixels. A crop of the top rows
    across the whole width (the stream decoded as it is, down to its rows) fails for
    damage in the intervals of its MCU row, and where it does not fail (damage further
    down), its pixels are the full decode's."""
    mcu = 16 if subsampling == "420" else 8  # MCU rows; every interval is 16 pixels across
    h, w = 4 * mcu, 96
    channels = 1 if subsampling == "gray" else 3
    marked = _jpeg().add_restarts(encode(natural_image(h, w, seed=5), subsampling), 16)
    spans = interval_spans(marked)
    per_row = w // 16
    assert len(spans) == h // mcu * per_row
    whole = region(marked, 0, 0, h, w, channels)
    crops = {  # (y, x, h, w): the intervals (row, column) it decodes, whether a part
        (mcu + 2, 20, 2 * mcu - 4, 40): ({(r, c) for r in (1, 2) for c in (1, 2, 3)}, True),
        (0, 0, 2, w): ({(0, c) for c in range(per_row)}, False),
    }
    for (y, x, ch, cw), (used, part) in crops.items():
        assert (_jpeg().part(marked, 1, y, x, ch, cw) is not None) == part
        for k, span in enumerate(spans):
            for damage in (extraneous, bad_codes):
                data = damage(marked, span)
                with pytest.raises(ValueError, match="Corrupt JPEG data"):
                    region(data, 0, 0, h, w, channels)  # the full decode
                if divmod(k, per_row) in used:
                    with pytest.raises(ValueError, match="Corrupt JPEG data"):
                        region(data, y, x, ch, cw, channels)
                    continue
                try:
                    got = region(data, y, x, ch, cw, channels)
                except ValueError:
                    assert not part  # a plain decode may read on into the damage
                    continue
                assert np.array_equal(got, whole[y : y + ch, x : x + cw]), k


def test_no_crop_of_a_damaged_stream_is_silently_wrong():
    """Single bytes changed at random inside the intervals: every crop either fails or is
    the pixels of a full decode that goes on past the damage (which equal the undamaged
    ones outside the damaged interval)."""
    rng = np.random.default_rng(1)
    outcomes = {"raised": 0, "equal": 0}
    for subsampling in ("420", "422", "444"):
        h, w = 75, 131
        marked = _jpeg().add_restarts(encode(natural_image(h, w, seed=h), subsampling), 16)
        spans = interval_spans(marked)
        for _ in range(60):
            a, b = spans[int(rng.integers(len(spans)))]
            at = int(rng.integers(a + 1, max(a + 2, b - 1)))
            data = bytearray(marked)
            data[at] = int(rng.integers(0, 255))
            if 0xFF in data[at - 1 : at + 2]:  # a marker made or unmade: another test's
                continue
            lenient = simplejpeg.decode_jpeg(bytes(data), colorspace="RGB", strict=False)
            for _ in range(5):
                ch, cw = int(rng.integers(1, h // 2)), int(rng.integers(1, w // 2))
                y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
                try:
                    got = region(bytes(data), y, x, ch, cw)
                except ValueError:
                    outcomes["raised"] += 1
                    continue
                assert np.array_equal(got, lenient[y : y + ch, x : x + cw]), (at, y, x, ch, cw)
                outcomes["equal"] += 1
    assert outcomes["raised"] > 20 and outcomes["equal"] > 200


# ---- JPEG files kept at their size ------------------------------------------------------


def with_segments(img):
    """A JPEG (Pillow, 4:2:2) carrying an EXIF segment, an ICC profile and a comment."""
    exif = Image.Exif()
    exif[0x010E] = "a description"
    buf = io.BytesIO()
    Image.fromarray(img).save(
        buf, "JPEG", quality=85, subsampling=1, exif=exif, icc_profile=b"icc" * 40, comment=b"hi"
    )
    return buf.getvalue()


def test_jpeg_files_kept_at_their_size_get_markers_and_the_same_pixels():
    """A JPEG that needs no resize is stored with restart markers added losslessly: the same
    pixels (PIL's decode and fastload's), its own segments kept, and crops through the
    intervals that are the full decode's; keep_given=True stores it byte for byte."""
    h, w = 121, 203
    img = natural_image(h, w, seed=9)
    given = {kind: encode(img, kind) for kind in SUBSAMPLINGS}
    given["pillow with segments"] = with_segments(img)
    rng = np.random.default_rng(3)
    for kind, data in given.items():
        stored, sh, sw = JPEG().encode(data)
        assert (sh, sw) == (h, w) and markers(stored)[0] > 0 and markers(data)[0] == 0, kind
        assert np.array_equal(pixels(stored), pixels(data)), kind
        assert len(stored) < 1.25 * len(data)  # a marker every 16 or 32 pixels: small images
        channels = 1 if kind == "gray" else 3
        whole = region(data, 0, 0, h, w, channels)
        for _ in range(20):
            ch, cw = int(rng.integers(1, h)), int(rng.integers(1, w))
            y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
            got = region(stored, y, x, ch, cw, channels)
            assert np.array_equal(got, whole[y : y + ch, x : x + cw]), (kind, y, x, ch, cw)
        assert JPEG(keep_given=True).encode(data)[0] == data
        assert JPEG(restart_px=None).encode(data)[0] == data
    stored = JPEG().encode(given["pillow with segments"])[0]
    for segment in (b"Exif\0\0", b"ICC_PROFILE\0" + b"\1\1" + b"icc" * 40, b"\xff\xfe\0\4hi"):
        assert segment in stored
    with Image.open(io.BytesIO(stored)) as im:
        assert im.getexif()[0x010E] == "a description"
    progressive = io.BytesIO()
    Image.fromarray(img).save(progressive, "JPEG", progressive=True)
    assert JPEG().encode(progressive.getvalue())[0] == progressive.getvalue()
    with pytest.raises(ValueError, match="corrupt or truncated JPEG"):
        JPEG().encode(given["420"][: len(given["420"]) // 2])
    assert Smart(0).encode(given["420"])[0] == JPEG().encode(given["420"])[0]
    assert Smart(0, keep_given=True).encode(given["420"])[0] == given["420"]


def test_convert_adds_markers_to_kept_files_unless_told_to_keep_them(tmp_path):
    src = tmp_path / "src" / "cat"
    src.mkdir(parents=True)
    files = [with_segments(natural_image(70, 90 + k, seed=k)) for k in range(3)]
    for k, data in enumerate(files):
        (src / f"{k}.jpg").write_bytes(data)
    convert(str(tmp_path / "src"), str(tmp_path / "a.arrow"), progress=False)
    main(["convert", str(tmp_path / "src"), str(tmp_path / "b.arrow"), "--keep-given",
          "--no-progress"])  # fmt: skip
    a, b = fs.open(str(tmp_path / "a.arrow")), fs.open(str(tmp_path / "b.arrow"))
    assert a.fields["image"].keep_given is False and b.fields["image"].keep_given is True
    for k, data in enumerate(files):
        assert bytes(b["image"].encoded[k]) == data
        assert markers(bytes(a["image"].encoded[k]))[0] > 0
        assert np.array_equal(a["image"][k], b["image"][k])
    # Files written before the option stored every JPEG as given, and say so.
    assert from_meta({"encoding": "jpeg", "quality": 90}).keep_given is True
    with pytest.raises(TypeError, match="keep_given must be True or False"):
        JPEG(keep_given=1)
