"""The native image plan (fastload._loading.plan, csrc/imagesource.c): which sources run natively,
and that the native C path gives exactly the pixels of the Python path (Compose called per item
by the sequential loader), errors included."""

import io
import os
import warnings

import numpy as np
import pytest
import simplejpeg
from helpers import copy_tree, deadline
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from test_image_kernels import natural_image

import fastload
from fastload import DataLoader, LoadError, _core, batchview, mapobs
from fastload._base.tree import LeafKind
from fastload._loading.plan import make_plan
from fastload._loading.schedule import schedule_of
from fastload.imagefolder import ImageFolder
from fastload.storage import JPEG, QOI
from fastload.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    CenterCrop,
    Compose,
    DecodeImage,
    Normalize,
    RandomCrop,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    ToCHW,
)

N = 20  # images per source
BS = 6  # batch size (the last batch of an epoch is partial)
SEED = 1234


def plan_of(view):
    """The plan the engine makes for iterating ``view``."""
    return make_plan(*schedule_of(view))


def jpeg(img, quality=90):
    if img.ndim == 3 and img.shape[2] == 1:
        return simplejpeg.encode_jpeg(np.ascontiguousarray(img), quality, colorspace="GRAY")
    return simplejpeg.encode_jpeg(np.ascontiguousarray(img), quality)


def sizes(n, lo, hi, seed=0):
    rng = np.random.default_rng(seed)
    return [(int(rng.integers(lo, hi)), int(rng.integers(lo, hi))) for _ in range(n)]


# ---- sources ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pixels():
    """N RGB images of different sizes (>= 48 px a side, for the crops below)."""
    return [natural_image(h, w, seed=k) for k, (h, w) in enumerate(sizes(N, 48, 110))]


@pytest.fixture(scope="module")
def jpegs(pixels):
    return [jpeg(p) for p in pixels]


@pytest.fixture(scope="module")
def mixed(pixels, jpegs):
    """JPEG bytes, every third item QOI instead."""
    return [_core.qoi_encode(p) if k % 3 == 1 else j for k, (p, j) in enumerate(zip(pixels, jpegs))]


@pytest.fixture(scope="module")
def folder(mixed, tmp_path_factory):
    root = tmp_path_factory.mktemp("folder")
    for k, data in enumerate(mixed):
        cls = root / f"class{k % 3}"
        cls.mkdir(exist_ok=True)
        (cls / f"img{k:03d}.{'qoi' if data[:4] == b'qoif' else 'jpg'}").write_bytes(data)
    return ImageFolder(root)


def write_packed(path, images, encoding):
    fastload.write(
        path,
        (images, np.arange(len(images), dtype=np.int64)),
        {"image": encoding, "label": "int64"},
        progress=False,
        parallel=2,
    )
    return fastload.open(path)


@pytest.fixture(scope="module")
def packed_jpeg(jpegs, tmp_path_factory):
    return write_packed(tmp_path_factory.mktemp("pj") / "jpeg.arrow", jpegs, JPEG())


@pytest.fixture(scope="module")
def packed_qoi(pixels, tmp_path_factory):
    return write_packed(tmp_path_factory.mktemp("pq") / "qoi.arrow", pixels, QOI())


@pytest.fixture(scope="module")
def two_file_dataset(jpegs, tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    half = N // 2
    for k, part in enumerate((slice(0, half), slice(half, N))):
        fastload.write(
            root / f"part{k}.arrow",
            (jpegs[part], np.arange(N, dtype=np.int64)[part]),
            {"image": JPEG(), "label": "int64"},
            progress=False,
            parallel=2,
        )
    ds = fastload.open(root)
    assert len(ds) == N and ds["image"].encoded.contiguous is False
    return ds


@pytest.fixture(scope="module")
def sources(pixels, jpegs, mixed, folder, packed_jpeg, packed_qoi, two_file_dataset):
    """Source kind -> (images container, labels)."""
    labels = np.arange(N, dtype=np.int64)
    same = np.stack([natural_image(72, 96, seed=100 + k) for k in range(N)])
    return {
        "bytes": (jpegs, labels),
        "mixed": (mixed, labels),
        "files": (folder.images, folder.labels),
        "packed_jpeg": (packed_jpeg["image"].encoded, packed_jpeg["label"]),
        "packed_qoi": (packed_qoi["image"].encoded, packed_qoi["label"]),
        "packed_shards": (two_file_dataset["image"].encoded, two_file_dataset["label"]),
        "array": (same, labels),
        "arrays": (pixels, labels),
        "gray": (np.ascontiguousarray(same[..., 1]), labels),
        "rgba": (np.concatenate([same, same[..., :1]], axis=-1), labels),
    }


ENCODED = ["bytes", "mixed", "files", "packed_jpeg", "packed_qoi", "packed_shards"]
DECODED = ["array", "arrays", "gray", "rgba"]


def chain(name, decodes, channels=3):
    """A Compose of each kind under test, with a fixed output size."""
    first = [DecodeImage(channels)] if decodes else []
    mean, std = (IMAGENET_MEAN, IMAGENET_STD) if channels == 3 else ((0.5,), (0.25,))
    ops = {
        "rrc_flip": [RandomResizedCrop(32, scale=(0.2, 1.0)), RandomHorizontalFlip()],
        "crop_resize": [CenterCrop(44), Resize((24, 30))],
        "normalize_chw": [Resize(40), RandomCrop(32), Normalize(mean, std), ToCHW()],
        "gray": [Resize(36), CenterCrop(30), RandomHorizontalFlip()],
        "rgba": [RandomResizedCrop((28, 36)), RandomHorizontalFlip()],
    }[name]
    return Compose(first + ops)


CHAINS = {"rrc_flip": 3, "crop_resize": 3, "normalize_chw": 3, "gray": 1, "rgba": 4}


def images_view(sources, kind, chain_name):
    images, labels = sources[kind]
    if kind in ENCODED:
        compose = chain(chain_name, True, CHAINS[chain_name])
    else:
        channels = {"gray": 1, "rgba": 4}.get(kind, 3)
        compose = chain(chain_name, False, channels)
    return (mapobs(compose, images), labels)


def run(data, epochs=2, **options):
    """Every batch of `epochs` epochs, copied."""
    options = {"shuffle": True, "seed": SEED, **options}
    loader = DataLoader(data, BS, **options)
    try:
        return [copy_tree(b) for _ in range(epochs) for b in loader]
    finally:
        loader.close()


def assert_same_batches(got, want):
    assert len(got) == len(want)
    for k, ((gi, gl), (wi, wl)) in enumerate(zip(got, want)):
        assert gi.shape == wi.shape and gi.dtype == wi.dtype, f"batch {k}"
        assert np.array_equal(gl, wl), f"batch {k}: labels differ"
        assert np.array_equal(gi, wi), (
            f"batch {k}: pixels differ (max {np.abs(gi.astype(float) - wi).max()})"
        )


# ---- 1. which plan ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ENCODED + DECODED)
def test_plan_is_native_for_every_image_source(sources, kind):
    plan = plan_of(batchview(images_view(sources, kind, "rrc_flip"), BS))
    assert plan.leaves[0].kind is LeafKind.IMAGE
    assert plan.leaves[1].kind is LeafKind.GATHER
    assert not plan.has_python


def test_plan_is_native_for_arrays_of_different_sizes_with_each_fixed_size_crop(pixels):
    for crop in (RandomCrop(40), CenterCrop(40), RandomResizedCrop(40)):
        view = mapobs(Compose([crop]), pixels)
        plan = plan_of(batchview((view, np.arange(N)), BS))
        assert plan.leaves[0].kind is LeafKind.IMAGE, crop
        assert plan.leaves[0].spec.shape == (40, 40, 3)


class GenericBytes:
    """A container of JPEG bytes that is not a list, has no paths and no buffers."""

    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


@pytest.fixture(scope="module")
def fallbacks(jpegs):
    labels = np.arange(N, dtype=np.int64)
    return {
        "generic": (GenericBytes(jpegs), labels),
        "bytearrays": ([bytearray(b) for b in jpegs], labels),
    }


@pytest.mark.parametrize("kind", ["generic", "bytearrays"])
def test_plan_falls_back_to_python_for_other_containers(fallbacks, kind):
    images, labels = fallbacks[kind]
    plan = plan_of(batchview((mapobs(chain("rrc_flip", True), images), labels), BS))
    assert plan.leaves[0].kind is LeafKind.INTO
    assert plan.has_python


def test_plan_falls_back_for_varying_output_size_or_strided_pixels(pixels, jpegs):
    varying = plan_of(
        batchview((mapobs(Compose([DecodeImage(), Resize(32)]), jpegs), np.arange(N)), BS)
    )
    assert varying.leaves[0].kind is not LeafKind.IMAGE
    strided = [p[:, ::2] for p in pixels]  # pixels not packed in their rows
    data = (mapobs(Compose([CenterCrop(20)]), strided), np.arange(N))
    assert plan_of(batchview(data, BS)).leaves[0].kind is LeafKind.INTO
    assert_same_batches(run(data, parallel=2), run(data, parallel=False))


# ---- 2. native == Python ------------------------------------------------------------------

CASES = [(kind, name) for kind in ENCODED for name in CHAINS] + [
    (kind, name) for kind in DECODED for name in ("rrc_flip", "crop_resize", "normalize_chw")
]


@pytest.mark.parametrize("kind,chain_name", CASES)
def test_native_parallel_output_equals_python_sequential_output(sources, kind, chain_name):
    data = images_view(sources, kind, chain_name)
    assert plan_of(batchview(data, BS)).leaves[0].kind is LeafKind.IMAGE
    want = run(data, parallel=False)
    assert want[0][0].shape[0] == BS and want[-1][0].shape[0] == N % BS
    for parallel in (1, 2, 4):
        for buffer in (True, False):
            got = run(data, parallel=parallel, buffer=buffer)
            assert_same_batches(got, want)


@pytest.mark.parametrize("kind", ["generic", "bytearrays"])
def test_python_fallback_parallel_output_equals_sequential_output(fallbacks, kind):
    images, labels = fallbacks[kind]
    data = (mapobs(chain("normalize_chw", True), images), labels)
    want = run(data, parallel=False)
    assert_same_batches(run(data, parallel=3, buffer=True), want)


def pil_jpeg(img, **options):
    buf = io.BytesIO()
    Image.fromarray(img).convert(options.pop("mode", (img.ndim == 2 and "L") or "RGB")).save(
        buf, "JPEG", **options
    )
    return buf.getvalue()


FLAVOURS = {
    "420": lambda img: simplejpeg.encode_jpeg(img, 85, colorsubsampling="420"),
    "gray": lambda img: jpeg(img[:, :, :1]),
    "progressive": lambda img: pil_jpeg(img, progressive=True),
    "cmyk": lambda img: pil_jpeg(img, mode="CMYK"),
    "exif": lambda img: pil_jpeg(img, exif=b"Exif\x00\x00" + bytes(100), optimize=True),
}


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_native_equals_python_for_jpeg_flavours_at_reduced_scale(flavour):
    # Odd sizes, several times the output: decoded at 1/2 .. 1/8 with rounded-up sizes.
    shapes = [(601, 799), (451, 603), (389, 277), (500, 499), (321, 241), (599, 401)]
    items = [FLAVOURS[flavour](natural_image(h, w, seed=k)) for k, (h, w) in enumerate(shapes)]
    for compose in (
        Compose([DecodeImage(), RandomResizedCrop(32), RandomHorizontalFlip()]),
        Compose([DecodeImage(1), Resize(40), CenterCrop(32)]),
        Compose([DecodeImage(4), CenterCrop(240), Resize((30, 40)), Normalize(0.5, 0.5), ToCHW()]),
    ):
        denoms = {compose.pipeline.prepare(h, w, SEED, 0, k)[1] for k, (h, w) in enumerate(shapes)}
        assert denoms - {1}, compose
        data = (mapobs(compose, items), np.arange(len(items)))
        assert plan_of(batchview(data, 4)).leaves[0].kind is LeafKind.IMAGE
        assert_same_batches(run(data, parallel=3), run(data, parallel=False))


def test_eachobs_native_equals_python(sources):
    view = images_view(sources, "mixed", "normalize_chw")[0]
    assert plan_of(view).leaves[0].kind is LeafKind.IMAGE
    want = [x.copy() for x in fastload.eachobs(view, shuffle=True, seed=SEED)]
    got = [x.copy() for x in fastload.eachobs(view, shuffle=True, seed=SEED, parallel=3)]
    assert len(got) == len(want) == N
    assert all(np.array_equal(g, w) for g, w in zip(got, want))


def test_epochs_and_seeds_change_the_draws(sources):
    data = images_view(sources, "bytes", "rrc_flip")
    a = run(data, epochs=2, parallel=2, shuffle=False)
    b = run(data, epochs=1, parallel=2, shuffle=False, seed=SEED + 1)
    half = len(a) // 2
    assert not np.array_equal(a[0][0], a[half][0])  # epoch 0 vs epoch 1
    assert not np.array_equal(a[0][0], b[0][0])  # seed vs seed + 1


# ---- 3. reduced-scale decode --------------------------------------------------------------

BIG = (1200, 1600)


@pytest.fixture(scope="module")
def big_jpegs():
    base = natural_image(*BIG, seed=7)
    # Mirror and roll the one generated image: distinct images at little cost.
    variants = [base, base[:, ::-1], base[::-1], np.roll(base, 400, axis=1)]
    return [jpeg(v, quality=95) for v in variants]


def torchvision_resize_size(h, w, size):
    if w <= h:
        return int(size * h / w), size
    return size, int(size * w / h)


def pil_resize(img, h, w):
    return np.asarray(Image.fromarray(np.ascontiguousarray(img)).resize((w, h), Image.BILINEAR))


def mae(a, b):
    return np.abs(a.astype(np.float64) - b.astype(np.float64)).mean()


def test_reduced_scale_decode_resize_center_crop_native_equals_python_and_pil(big_jpegs):
    compose = Compose([DecodeImage(), Resize(72), CenterCrop(64)])
    assert compose.pipeline.prepare(*BIG, SEED, 0, 0)[1] > 1  # decoded at reduced scale
    data = (mapobs(compose, big_jpegs), np.arange(len(big_jpegs)))
    assert plan_of(batchview(data, 2)).leaves[0].kind is LeafKind.IMAGE
    want = run(data, epochs=1, parallel=False)
    got = run(data, epochs=1, parallel=2)
    assert_same_batches(got, want)
    rh, rw = torchvision_resize_size(*BIG, 72)
    y, x = int(round((rh - 64) / 2.0)), int(round((rw - 64) / 2.0))
    for images, labels in got:
        for img, label in zip(images, labels):
            full = simplejpeg.decode_jpeg(big_jpegs[label])
            ref = pil_resize(full, rh, rw)[y : y + 64, x : x + 64]
            assert mae(img, ref) <= 1.5, f"image {label}: mean abs error {mae(img, ref):.2f}"


def test_reduced_scale_decode_random_resized_crop_native_equals_python_and_pil(big_jpegs):
    compose = Compose([DecodeImage(), RandomResizedCrop(64)])
    data = (mapobs(compose, big_jpegs), np.arange(len(big_jpegs)))
    want = run(data, epochs=2, parallel=False, shuffle=False)
    got = run(data, epochs=2, parallel=4, shuffle=False)
    assert_same_batches(got, want)
    denoms = set()
    per_epoch = len(got) // 2
    for step, (images, labels) in enumerate(got):
        epoch = step // per_epoch
        for img, label in zip(images, labels):
            (cy, cx, ch, cw), denom = compose.pipeline.prepare(*BIG, SEED, epoch, int(label))
            denoms.add(denom)
            full = simplejpeg.decode_jpeg(big_jpegs[label])
            ref = pil_resize(full[cy : cy + ch, cx : cx + cw], 64, 64)
            assert mae(img, ref) <= 1.5, f"image {label}: mean abs error {mae(img, ref):.2f}"
    assert denoms & {2, 4, 8}


# ---- 4. errors ----------------------------------------------------------------------------


def truncated(data):
    return data[: len(data) // 2]


@pytest.mark.parametrize("parallel", [2, False])
@pytest.mark.parametrize("damage", [truncated, lambda d: d[:40]], ids=["body", "header"])
def test_truncated_jpeg_raises_load_error_naming_its_index(jpegs, parallel, damage):
    items = list(jpegs)
    items[7] = damage(items[7])
    data = (mapobs(chain("rrc_flip", True), items), np.arange(N))
    with pytest.raises(LoadError) as info:
        run(data, parallel=parallel)
    assert info.value.index == 7
    assert "7" in str(info.value)
    assert "JPEG" in str(info.value)


def damaged_folder(jpegs, root, bad):
    (root / "a").mkdir()
    for k, data in enumerate(jpegs):
        (root / "a" / f"{k:03d}.jpg").write_bytes(truncated(data) if k == bad else data)
    return ImageFolder(root)


@pytest.mark.parametrize("parallel", [2, False])
def test_truncated_file_in_image_folder_names_the_path(jpegs, tmp_path, parallel):
    folder = damaged_folder(jpegs, tmp_path, bad=7)
    data = (mapobs(chain("crop_resize", True), folder.images), folder.labels)
    with pytest.raises(LoadError) as info:
        run(data, parallel=parallel)
    assert info.value.index == 7
    assert info.value.source == folder.images.paths[7]
    assert folder.images.paths[7] in str(info.value)


@pytest.mark.parametrize(
    "bad, says",
    [
        (b"<html>not an image</html>", "not an image file"),
        (b"GIF89a" + bytes(200), "cannot decode this GIF"),
    ],
)
def test_bytes_that_are_not_a_readable_image_raise_load_error(jpegs, bad, says):
    items = list(jpegs)
    items[3] = bad
    data = (mapobs(chain("rrc_flip", True), items), np.arange(N))
    with pytest.raises(LoadError) as info:
        run(data, parallel=2)
    assert info.value.index == 3
    assert says in str(info.value)
    with pytest.raises(LoadError) as info:
        run(data, parallel=False)
    assert info.value.index == 3


@pytest.mark.parametrize("parallel", [2, False])
def test_corrupt_qoi_raises_load_error(pixels, parallel):
    items = [_core.qoi_encode(p) for p in pixels]
    items[5] = items[5][: len(items[5]) // 3]
    data = (mapobs(chain("crop_resize", True), items), np.arange(N))
    assert plan_of(batchview(data, BS)).leaves[0].kind is LeafKind.IMAGE
    with pytest.raises(LoadError) as info:
        run(data, parallel=parallel)
    assert info.value.index == 5


@pytest.mark.parametrize("parallel", [2, False])
def test_missing_file_raises_load_error_naming_the_path(jpegs, tmp_path, parallel):
    folder = damaged_folder(jpegs, tmp_path, bad=-1)
    os.remove(folder.images.paths[11])
    data = (mapobs(chain("crop_resize", True), folder.images), folder.labels)
    with pytest.raises(LoadError) as info:
        run(data, parallel=parallel)
    assert folder.images.paths[11] in str(info.value)
    if parallel:
        assert info.value.index == 11


@pytest.mark.parametrize("parallel", [2, False])
def test_image_smaller_than_random_crop_raises_load_error(pixels, parallel):
    items = list(pixels)
    items[9] = items[9][:20, :20]
    data = (mapobs(Compose([RandomCrop(40)]), items), np.arange(N))
    assert plan_of(batchview(data, BS)).leaves[0].kind is LeafKind.IMAGE
    with pytest.raises(LoadError) as info:
        run(data, parallel=parallel)
    assert info.value.index == 9


BAD = (2, 7, 13)


@pytest.mark.parametrize("parallel", [2, False])
def test_on_error_skip_drops_exactly_the_bad_items(jpegs, parallel):
    items = list(jpegs)
    for k in BAD:
        items[k] = truncated(items[k])
    compose = chain("normalize_chw", True)
    data = (mapobs(compose, items), np.arange(N, dtype=np.int64))
    loader = DataLoader(
        data, BS, shuffle=True, seed=SEED, parallel=parallel, on_error="skip", buffer=True
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for epoch in range(2):
            order = loader.order(epoch)
            seen = []
            for step, (images, labels) in enumerate(loader):
                want = [int(i) for i in order[step * BS : (step + 1) * BS] if i not in BAD]
                assert labels.tolist() == want
                assert images.shape[0] == len(want)
                for img, i in zip(images, want):
                    ref = compose(jpegs[i], index=i, seed=SEED, epoch=epoch)
                    assert np.array_equal(img, ref), f"epoch {epoch} image {i}"
                seen += want
            assert sorted(seen) == sorted(set(range(N)) - set(BAD))
    loader.close()
    assert loader.stats()["skipped"] == 2 * len(BAD)
    runtime = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(runtime) == 1, [str(w.message) for w in runtime]


# Output is documented identical for every value of `parallel`, and the Python path reads
# the list live; the native path caches its source per view (imagesources._sources) with a
# copy of the list taken on the first plan, so it must not serve a stale copy.


def test_native_source_sees_an_item_replaced_between_epochs(jpegs, pixels):
    items = list(jpegs)
    data = (mapobs(chain("crop_resize", True), items), np.arange(N))
    run(data, epochs=1, parallel=2)
    items[3] = jpeg(pixels[4])
    assert_same_batches(run(data, epochs=1, parallel=2), run(data, epochs=1, parallel=False))


def test_native_source_sees_an_item_appended_between_epochs(jpegs):
    items = list(jpegs)
    view = mapobs(chain("crop_resize", True), items)
    run((view, np.arange(N)), epochs=1, parallel=2)
    items.append(jpegs[0])
    data = (view, np.arange(N + 1))
    assert_same_batches(run(data, epochs=1, parallel=2), run(data, epochs=1, parallel=False))


# ---- 5. scratch memory --------------------------------------------------------------------


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_scratch_memory_is_bounded_by_the_largest_image_not_the_batch():
    base = natural_image(1000, 1000, seed=3)
    items = [jpeg(base[:h, :w], quality=80) for h, w in sizes(200, 300, 1001, seed=9)]
    # No resize: every image is decoded at full size into its thread's scratch.
    data = (mapobs(Compose([DecodeImage(), RandomCrop(64)]), items), np.arange(len(items)))
    assert plan_of(batchview(data, 32)).leaves[0].kind is LeafKind.IMAGE
    # Warm up the pool threads and the decoder on a few small items.
    run((mapobs(data[0].f, items[:8]), np.arange(8)), epochs=1, parallel=4)
    before = peak = rss_bytes()
    loader = DataLoader(data, 32, shuffle=True, seed=SEED, parallel=4, buffer=True)
    for _ in range(2):
        for _images, _labels in loader:
            peak = max(peak, rss_bytes())
    loader.close()
    # One 1000 x 1000 slot row per batch row would take 3 MB x 32 rows x 3 slots.
    assert peak - before < 200 << 20, f"RSS grew by {(peak - before) >> 20} MB"


# ---- 6. jpeg_size -------------------------------------------------------------------------


def header_jpegs():
    out = []
    for k, (h, w) in enumerate([(1, 1), (7, 13), (64, 48), (333, 517), (1080, 1920)]):
        img = natural_image(h, w, seed=k)
        out.append(jpeg(img))
        out.append(simplejpeg.encode_jpeg(img, 75, colorsubsampling="420"))
        out.append(jpeg(img[:, :, :1]))
        out.append(pil_jpeg(img, progressive=True))
        out.append(pil_jpeg(img, exif=b"Exif\x00\x00" + bytes(300), optimize=True))
    return out


def test_jpeg_size_equals_simplejpeg_header_baseline_and_progressive():
    for data in header_jpegs():
        h, w, _, _ = simplejpeg.decode_jpeg_header(data)
        assert _core.jpeg_size(data) == (h, w)
        assert _core.jpeg_size(memoryview(data)) == (h, w)


def test_jpeg_size_raises_value_error_on_truncated_or_garbage_input():
    data = jpeg(natural_image(40, 60))
    sof = data.index(b"\xff\xc0")
    for cut in (0, 1, 2, 3, 4, 10, sof, sof + 5):
        with pytest.raises(ValueError):
            _core.jpeg_size(data[:cut])
    for garbage in (
        b"GIF89a" + bytes(100),
        b"qoif" + bytes(20),
        bytes(64),
        b"\xff\xd8\xff\xd9",
        b"\xff\xd8\xff\xda\x00\x02",
    ):
        with pytest.raises(ValueError):
            _core.jpeg_size(garbage)


VALID = jpeg(natural_image(37, 53, seed=11), quality=80)
SOF = VALID.index(b"\xff\xc0")
SOF_END = SOF + 2 + int.from_bytes(VALID[SOF + 2 : SOF + 4], "big")  # the whole frame header


def check_jpeg_size(data):
    try:
        h, w = _core.jpeg_size(data)
    except ValueError:
        return
    assert 0 < h < 65536 and 0 < w < 65536


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_jpeg_size_never_crashes_on_random_bytes(data):
    check_jpeg_size(data)
    check_jpeg_size(b"\xff\xd8" + data)


@given(
    st.integers(0, len(VALID)),
    st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), max_size=6),
)
def test_jpeg_size_never_crashes_on_truncated_or_flipped_jpeg(cut, flips):
    data = bytearray(VALID)
    for pos, value in flips:
        data[pos] = value
    check_jpeg_size(bytes(data[:cut]))
    if not flips and cut >= SOF_END:
        assert _core.jpeg_size(bytes(data[:cut])) == (37, 53)
    elif not flips:
        with pytest.raises(ValueError):
            _core.jpeg_size(bytes(data[:cut]))


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_ctrl_c_in_a_decoder_called_from_c_stops_the_loader_with_keyboard_interrupt(
    monkeypatch, on_error
):
    pngs = []
    for k in range(8):
        out = io.BytesIO()
        Image.fromarray(natural_image(20, 30, seed=k)).save(out, format="PNG")
        pngs.append(out.getvalue())

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(fastload._images.codecs, "decode_pillow", interrupted)
    chain = Compose([DecodeImage(), Resize((8, 8))])
    loader = DataLoader(mapobs(chain, pngs), 4, parallel=2, on_error=on_error)
    with deadline(10), pytest.raises(KeyboardInterrupt):
        next(iter(loader))
    loader.close()
