"""Decoding inside the image pipeline (csrc/jpeg.c, csrc/imagesource.c, fastload._images.codecs):
the JPEG crop-region decode against a full decode, every file format through Pillow against
PIL itself, DecodeImage(exact=True), and errors for what cannot be decoded."""

import io
import os
import subprocess
import sys

import numpy as np
import pytest
import simplejpeg
from PIL import Image
from test_image_kernels import natural_image

import fastload
from fastload import DataLoader, LoadError, _core, mapobs
from fastload._images import codecs
from fastload.imagefolder import IMAGE_EXTENSIONS, ImageFolder
from fastload.storage import JPEG
from fastload.transforms import (
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

NATIVE = codecs.decoder_name().startswith("libjpeg")


def pil_jpeg(img, **options):
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "JPEG", quality=90, **options)
    return buf.getvalue()


JPEG_KINDS = {
    "420": lambda img: simplejpeg.encode_jpeg(img, 90, colorsubsampling="420"),
    "422": lambda img: simplejpeg.encode_jpeg(img, 90, colorsubsampling="422"),
    "444": lambda img: simplejpeg.encode_jpeg(img, 90, colorsubsampling="444"),
    "gray": lambda img: simplejpeg.encode_jpeg(
        np.ascontiguousarray(img[:, :, :1]), 90, colorspace="GRAY"
    ),
    "progressive": lambda img: pil_jpeg(img, progressive=True),
    "restart markers": lambda img: pil_jpeg(img, restart_marker_blocks=3),
    "restart every MCU": lambda img: pil_jpeg(img, restart_marker_blocks=1),
    "fastload 420": lambda img: JPEG(90).encode(img)[0],
    "fastload 444": lambda img: JPEG(90, subsampling="444", restart_px=8).encode(img)[0],
}

CROP_CHAINS = {
    "rrc": lambda big: Compose(
        [DecodeImage(), RandomResizedCrop(224 if big else 24), RandomHorizontalFlip()]
    ),
    "small rrc": lambda big: Compose([DecodeImage(), RandomResizedCrop(40, scale=(0.02, 0.2))]),
    "padded crop": lambda big: Compose([DecodeImage(), RandomCrop(16, padding=4)]),
    "center crop": lambda big: Compose([DecodeImage(), CenterCrop(20)]),
    "crop then resize": lambda big: Compose([DecodeImage(), CenterCrop(30), Resize(12)]),
}


def full_decode_reference(chain, data, h, w, index, seed=7):
    """Full decode (simplejpeg) at the scale the chain picks, then the chain's pipeline on
    the whole image: what the crop-region decode must reproduce."""
    _, d = chain.pipeline.prepare(h, w, seed, 0, index)
    decoded = simplejpeg.decode_jpeg(
        data,
        colorspace="RGB",
        min_factor=d,
        min_height=-(-h // d) if d > 1 else 0,
        min_width=-(-w // d) if d > 1 else 0,
    )
    return chain.pipeline.run(decoded, h, w, d, seed, 0, index), d


@pytest.mark.parametrize("kind", JPEG_KINDS)
@pytest.mark.parametrize("size", [(37, 53), (64, 64), (413, 371), (1001, 777)])
@pytest.mark.parametrize("chain_name", CROP_CHAINS)
def test_crop_region_decode_matches_full_decode_then_crop(kind, size, chain_name):
    h, w = size
    data = JPEG_KINDS[kind](natural_image(h, w, seed=h))
    chain = CROP_CHAINS[chain_name](h > 100)
    scales = set()
    for index in range(12):
        out = chain(data, index=index, seed=7)
        ref, d = full_decode_reference(chain, data, h, w, index)
        scales.add(d)
        diff = np.abs(out.astype(int) - ref.astype(int))
        assert diff.mean() <= 1 and diff.max() <= 8, (kind, size, index, d)
    if chain_name == "rrc" and h > 1000:
        assert scales != {1}, "the large image never decoded at a reduced scale"


@pytest.mark.skipif(
    not NATIVE,
    reason="this build decodes JPEG through simplejpeg, which has no region decode (libjpeg-"
    "turbo's headers were missing at build time): install them and rebuild to test it",
)
@pytest.mark.parametrize("kind", JPEG_KINDS)
def test_crop_region_decode_is_exact_at_full_scale(kind):
    """At full scale the region decode gives the very pixels of decoding the whole image
    with the same decoder (a chain without a crop decodes all of it) and cropping."""
    h, w = 149, 203
    data = JPEG_KINDS[kind](natural_image(h, w, seed=3))
    whole = Compose([DecodeImage()])(data)
    for chain in (
        Compose([DecodeImage(exact=True), RandomResizedCrop(32)]),
        Compose([DecodeImage(), RandomCrop(50, padding=9)]),
    ):
        for index in range(20):
            expected = chain.pipeline.run(whole, h, w, 1, 5, 0, index)
            assert np.array_equal(chain(data, index=index, seed=5), expected), (kind, index)


def test_the_loader_and_a_call_decode_alike():
    images = [simplejpeg.encode_jpeg(natural_image(90 + k, 120 - k, seed=k), 85) for k in range(24)]
    chain = Compose(
        [
            DecodeImage(),
            RandomResizedCrop(32),
            RandomHorizontalFlip(),
            Normalize(0.5, 0.25),
            ToCHW(),
        ]
    )
    loader = DataLoader(mapobs(chain, images), 5, parallel=2, seed=3)
    batches = np.concatenate(list(loader))
    expected = np.stack([chain(b, index=i, seed=3, epoch=0) for i, b in enumerate(images)])
    assert np.array_equal(batches, expected)


def test_a_truncated_jpeg_is_reported_whatever_the_crop():
    """Rows below a crop are not decoded, but a stream that does not end in EOI is
    decoded whole: a truncated file fails on every draw, not only on some."""
    data = simplejpeg.encode_jpeg(natural_image(200, 160, seed=1), 90)
    cut = data[: len(data) * 2 // 3]
    chain = Compose([DecodeImage(), RandomResizedCrop(24, scale=(0.01, 0.05))])
    for index in range(20):
        with pytest.raises(ValueError, match="corrupt or truncated JPEG"):
            chain(cut, index=index)
    loader = DataLoader(mapobs(chain, [data, cut, data]), 3, parallel=2)
    with pytest.raises(LoadError, match="image 1 of list: .*corrupt or truncated JPEG"):
        list(loader)


def test_exact_decode_never_reduces_the_scale_and_matches_pil():
    h, w = 900, 700
    img = natural_image(h, w, seed=2)
    data = pil_jpeg(img)
    fast = Compose([DecodeImage(), Resize(100)])
    exact = Compose([DecodeImage(exact=True), Resize(100)])
    assert fast.pipeline.prepare(h, w)[1] == 4  # 1/4 when scaling is allowed
    whole = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    reference = Compose([Resize(100)])(whole)  # PIL's decode, then the same resize
    assert np.abs(exact(data).astype(int) - reference.astype(int)).max() <= 1
    assert not np.array_equal(fast(data), reference)  # the reduced scale is not exact


def test_decode_image_is_the_one_decode_op():
    assert not hasattr(fastload.transforms, "DecodeJPEG")
    assert "DecodeJPEG" not in fastload.transforms.__all__


@pytest.mark.parametrize(
    "head, is_jpeg",
    [
        (b"", False),
        (b"\xff", False),
        (b"\xff\xd8", False),  # the start-of-image marker alone
        (b"\xff\xd8\x00", False),
        (b"\xff\xd8\xff", True),  # and the FF of the marker after it
        (b"\xff\xd8\xff\xe0", True),
    ],
)
def test_the_jpeg_magic_is_three_bytes(head, is_jpeg):
    for data in (head, bytearray(head), memoryview(head)):
        assert codecs.is_jpeg(data) is is_jpeg


def test_every_reader_refuses_ff_d8_without_a_marker_after_it(tmp_path):
    data = b"\xff\xd8\x00" + bytes(64)
    with pytest.raises(ValueError, match="not an image file fastload reads"):
        codecs.image_size(data)
    with pytest.raises(ValueError, match="not an image file fastload reads"):
        codecs.decode(data)
    (tmp_path / "0.jpg").write_bytes(data)
    chain = Compose([DecodeImage(), CenterCrop(8)])
    for images in (fastload.files([tmp_path / "0.jpg"]), [data]):
        with pytest.raises(LoadError, match="not an image file fastload reads"):
            list(DataLoader(mapobs(chain, images), 1))


def test_build_info_names_the_jpeg_decoder():
    info = fastload.build_info()
    assert info["jpeg_decoder"].startswith(codecs.decoder_name())
    assert info["jpeg_decoder"].startswith(("libjpeg-turbo", "simplejpeg ("))
    assert info["other_formats"].startswith("Pillow")


# A library of libjpeg's name that the dynamic loader finds first and cannot load, as when
# the system's libjpeg is gone or broken: fastload._jpeg fails to load, fastload does not.
UNLOADABLE_LIBJPEG = """
import pathlib, sys
import numpy as np, fastload
from fastload import DataLoader, mapobs
from fastload.transforms import Compose, DecodeImage, Resize

folder = pathlib.Path(sys.argv[1])
images = [(folder / f"{k}.jpg").read_bytes() for k in range(6)]
chain = Compose([DecodeImage(exact=True), Resize((20, 24))])
loader = DataLoader(mapobs(chain, images), batch_size=3, parallel=2, buffer=False)
np.save(folder / "batches.npy", np.concatenate(list(loader)))
print(fastload.build_info()["jpeg_decoder"])
"""


def test_import_works_and_jpeg_decodes_through_simplejpeg_when_libjpeg_cannot_be_loaded(
    tmp_path,
):
    (tmp_path / "libjpeg.so.62").write_bytes(b"")  # found first, and not a library
    images = [simplejpeg.encode_jpeg(natural_image(40, 48, seed=k), 90) for k in range(6)]
    for k, data in enumerate(images):
        (tmp_path / f"{k}.jpg").write_bytes(data)
    run = subprocess.run(
        [sys.executable, "-c", UNLOADABLE_LIBJPEG, str(tmp_path)],
        env={**os.environ, "LD_LIBRARY_PATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    decoder = run.stdout.strip()
    if NATIVE:
        assert decoder.startswith("simplejpeg (libjpeg-turbo could not be loaded: ")
        assert "libjpeg.so.62" in decoder
    else:
        assert decoder == "simplejpeg (built without libjpeg's headers)"
    # The same pixels as this process decodes, in C where libjpeg is here.
    chain = Compose([DecodeImage(exact=True), Resize((20, 24))])
    expected = np.stack([chain(data) for data in images])
    assert np.array_equal(np.load(tmp_path / "batches.npy"), expected)


def test_a_build_without_the_libjpeg_module_decodes_through_simplejpeg_and_says_why():
    # What an install from the sdist without libjpeg's headers has: no fastload._jpeg.
    code = (
        "import sys; sys.modules['fastload._jpeg'] = None\n"
        "import fastload; print(fastload.build_info()['jpeg_decoder'])"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert run.stdout.strip() == "simplejpeg (built without libjpeg's headers)"


# ---- other formats, through Pillow ----------------------------------------------------------


def encoded(img, fmt, **options):
    buf = io.BytesIO()
    img.save(buf, fmt, **options)
    return buf.getvalue()


def rgb(h=41, w=57, seed=0):
    return Image.fromarray(natural_image(h, w, seed=seed))


FORMATS = {
    "png": lambda: encoded(rgb(), "PNG"),
    "png rgba": lambda: encoded(rgb().convert("RGBA"), "PNG"),
    "png gray": lambda: encoded(rgb().convert("L"), "PNG"),
    "png palette": lambda: encoded(rgb().convert("P"), "PNG"),
    "bmp": lambda: encoded(rgb(), "BMP"),
    "gif": lambda: encoded(rgb().convert("P"), "GIF"),
    "webp lossless": lambda: encoded(rgb(), "WEBP", lossless=True),
    "tiff": lambda: encoded(rgb(), "TIFF"),
    "tiff cmyk": lambda: encoded(rgb().convert("CMYK"), "TIFF"),
    "ppm": lambda: encoded(rgb(), "PPM"),
}


def pil_pixels(data, mode):
    return np.asarray(Image.open(io.BytesIO(data)).convert(mode))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("channels", [1, 3, 4])
def test_other_formats_decode_as_pil_does(fmt, channels):
    data = FORMATS[fmt]()
    mode = {1: "L", 3: "RGB", 4: "RGBA"}[channels]
    reference = pil_pixels(data, mode).reshape(41, 57, channels)
    assert np.array_equal(Compose([DecodeImage(channels)])(data), reference)
    chain = Compose([DecodeImage(channels), RandomResizedCrop(16), RandomHorizontalFlip()])
    crops = np.concatenate(list(DataLoader(mapobs(chain, [data] * 6), 4, parallel=2, seed=3)))
    expected = np.stack([chain.pipeline.run(reference, 41, 57, 1, 3, 0, i) for i in range(6)])
    assert np.array_equal(crops, expected)


def test_sixteen_bit_png_keeps_the_high_byte():
    values = ((np.arange(30 * 40).reshape(30, 40) * 53) % 65536).astype(np.uint16)
    data = encoded(Image.fromarray(values.astype(np.uint16)), "PNG")
    out = Compose([DecodeImage(1)])(data)
    assert np.array_equal(out[:, :, 0], (values >> 8).astype(np.uint8))


def test_an_animated_gif_gives_its_first_frame():
    frames = [Image.fromarray(np.full((12, 14, 3), v, np.uint8)) for v in (10, 200)]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:])
    out = Compose([DecodeImage(1)])(buf.getvalue())
    assert out.shape == (12, 14, 1) and np.all(out == pil_pixels(buf.getvalue(), "L")[..., None])
    assert np.all(np.abs(out.astype(int) - 10) <= 1)


def test_float_images_are_refused_not_guessed():
    data = encoded(Image.fromarray(np.linspace(0, 1, 64, dtype=np.float32).reshape(8, 8)), "TIFF")
    with pytest.raises(ValueError, match="floating-point pixels"):
        Compose([DecodeImage()])(data)


def test_corrupt_png_and_the_pixel_limit_are_errors_naming_the_item(monkeypatch):
    good = FORMATS["png"]()
    loader = DataLoader(
        mapobs(Compose([DecodeImage(), CenterCrop(8)]), [good, good[:60], good]), 3, parallel=2
    )
    with pytest.raises(LoadError, match="image 1 of list: .*cannot decode this PNG"):
        list(loader)
    monkeypatch.setattr(fastload.limits, "MAX_IMAGE_PIXELS", 41 * 57 - 1)
    loader = DataLoader(mapobs(Compose([DecodeImage(), CenterCrop(8)]), [good]), 1, parallel=2)
    with pytest.raises(LoadError, match="41x57 image is over the limit"):
        list(loader)


def test_image_folder_lists_exactly_the_formats_that_decode(tmp_path):
    img = rgb(20, 24, seed=4)
    jpg = pil_jpeg(np.asarray(img))
    writers = {
        ".jpg": lambda: jpg,
        ".jpeg": lambda: jpg,
        ".png": FORMATS["png"],
        ".bmp": FORMATS["bmp"],
        ".gif": FORMATS["gif"],
        ".webp": FORMATS["webp lossless"],
        ".tif": FORMATS["tiff"],
        ".tiff": FORMATS["tiff"],
        ".ppm": FORMATS["ppm"],
        ".pgm": lambda: encoded(img.convert("L"), "PPM"),
        ".pbm": lambda: encoded(img.convert("1"), "PPM"),
        ".qoi": lambda: _core.qoi_encode(np.asarray(img)),
    }
    assert set(writers) == set(IMAGE_EXTENSIONS)
    (tmp_path / "a").mkdir()
    for ext, write in writers.items():
        (tmp_path / "a" / f"x{ext}").write_bytes(write())
    (tmp_path / "a" / "notes.txt").write_text("not an image")
    folder = ImageFolder(tmp_path)
    assert len(folder) == len(writers)
    chain = Compose([DecodeImage(), CenterCrop(16)])
    batch, labels = next(
        iter(DataLoader((mapobs(chain, folder.images), folder.labels), len(writers), parallel=2))
    )
    assert batch.shape == (len(writers), 16, 16, 3) and labels.tolist() == [0] * len(writers)


@pytest.mark.skipif(
    not NATIVE,
    reason="this build decodes JPEG through simplejpeg, which has no region decode (libjpeg-"
    "turbo's headers were missing at build time): install them and rebuild to test it",
)
def test_only_the_crop_region_is_decoded():
    h, w = 300, 400
    data = simplejpeg.encode_jpeg(natural_image(h, w, seed=8), 90)
    whole = Compose([DecodeImage()])(data)
    chain = Compose([DecodeImage(exact=True), RandomResizedCrop(64, scale=(0.05, 0.2))])
    source = fastload._core.ImageSource(
        chain.pipeline,
        channels=3,
        name="bytes",
        decoder=codecs,
        max_pixels=10**8,
        max_file_bytes=10**8,
        exact=True,
        buffers=[data],
    )
    for index in range(10):
        part, (y, x), denom = source.decode(data, 0, 0, index)
        (cy, cx, ch, cw), _ = chain.pipeline.prepare(h, w, 0, 0, index)
        assert denom == 1
        assert part.shape[0] * part.shape[1] < h * w / 2  # a fraction of the image
        assert y <= cy and y + part.shape[0] >= cy + ch  # holds the crop
        assert x <= cx and x + part.shape[1] >= cx + cw
        assert np.array_equal(part, whole[y : y + part.shape[0], x : x + part.shape[1]])


def test_an_empty_item_is_an_error_naming_it(tmp_path):
    good = simplejpeg.encode_jpeg(natural_image(20, 20), 90)
    chain = Compose([DecodeImage(), CenterCrop(8)])
    with pytest.raises(LoadError, match="image 1 of list: empty image"):
        list(DataLoader(mapobs(chain, [good, b"", good]), 3, parallel=2))
    (tmp_path / "empty.jpg").write_bytes(b"")
    with pytest.raises(LoadError, match="empty.jpg.*not an image file"):
        list(DataLoader(mapobs(chain, fastload.files([tmp_path / "empty.jpg"])), 1, parallel=2))
