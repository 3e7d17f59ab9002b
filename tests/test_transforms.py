"""Compose chains (fastload.transforms) and ImageFolder against numpy/PIL references."""

import io
import warnings

import numpy as np
import pytest
import simplejpeg
from PIL import Image
from test_image_kernels import ModelRng, assert_close_pixels, natural_image, pil_resize

from fastload._images import codecs
from fastload.imagefolder import ImageFolder
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
    image_size,
)


def jpeg(img, quality=92):
    if img.shape[2] == 1:
        return simplejpeg.encode_jpeg(np.ascontiguousarray(img), quality, colorspace="GRAY")
    return simplejpeg.encode_jpeg(img, quality)


def flips(seed, epoch, index, op, p=0.5):
    return ModelRng(seed, epoch, index, op).uniform() < p


def torchvision_resize_size(h, w, size):
    if w <= h:
        return int(size * h / w), size
    return size, int(size * w / h)


def test_random_crop_with_padding_and_flip_is_exact():
    img = natural_image(32, 32)
    t = Compose([RandomCrop(28, padding=4), RandomHorizontalFlip()])
    padded = np.pad(img, ((4, 4), (4, 4), (0, 0)))
    for index in range(20):
        rng = ModelRng(0, 0, index, 0)
        y, x = rng.below(40 - 28 + 1), rng.below(40 - 28 + 1)
        ref = padded[y : y + 28, x : x + 28]
        if flips(0, 0, index, 1):
            ref = ref[:, ::-1]
        assert np.array_equal(t(img, index=index), ref)


def test_center_crop_pads_small_images_with_zeros():
    img = natural_image(10, 40)
    out = Compose([CenterCrop((16, 20))])(img)
    ref = np.zeros((16, 20, 3), np.uint8)
    ref[3:13] = img[:, 10:30]
    assert np.array_equal(out, ref)


@pytest.mark.parametrize("shape", [(375, 500), (500, 375), (256, 256), (200, 300)])
def test_resize_then_center_crop_matches_pil(shape):
    img = natural_image(*shape, seed=1)
    out = Compose([Resize(256), CenterCrop(224)])(img)
    rh, rw = torchvision_resize_size(*shape, 256)
    big = pil_resize(img, rh, rw)
    y, x = int(round((rh - 224) / 2.0)), int(round((rw - 224) / 2.0))
    assert_close_pixels(out, big[y : y + 224, x : x + 224])


def test_enlarging_resize_matches_pil():
    img = natural_image(60, 90, seed=2)
    t = Compose([Resize(200)])
    assert t.output_shape is None
    assert_close_pixels(t(img), pil_resize(img, 200, 300))


def test_crop_then_resize_matches_pil():
    img = natural_image(300, 400, seed=3)
    out = Compose([CenterCrop(250), Resize((100, 120))])(img)
    assert_close_pixels(out, pil_resize(np.ascontiguousarray(img[25:275, 75:325]), 100, 120))


def test_random_resized_crop_pipeline_matches_pil_and_flip():
    img = natural_image(375, 500, seed=4)
    t = Compose([DecodeImage(), RandomResizedCrop(224), RandomHorizontalFlip()])
    data = jpeg(img)
    full = simplejpeg.decode_jpeg(data)
    for index in range(8):
        (y, x, ch, cw), denom = t.pipeline.prepare(375, 500, 0, 0, index)
        ref = pil_resize(np.ascontiguousarray(full[y : y + ch, x : x + cw]), 224, 224)
        if flips(0, 0, index, 2):
            ref = ref[:, ::-1]
        out = t.pipeline.run(full, 375, 500, 1, 0, 0, index)
        assert_close_pixels(out, ref)
        if denom == 1:
            assert np.array_equal(t(data, index=index), out)


def smooth_image(h, w):
    """Photo-like without hard edges: smooth waves, mild noise."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    noise = np.random.default_rng(0).normal(0, 2, (h, w, 3))
    img = (
        np.stack(
            [
                128 + 100 * np.sin(xx / 29.0),
                128 + 100 * np.sin(yy / 37.0),
                128 + 100 * np.sin(xx / 23.0 + yy / 31.0),
            ],
            axis=-1,
        )
        + noise
    )
    return np.clip(img, 0, 255).astype(np.uint8)


REDUCED_CHAINS = [
    Compose([DecodeImage(), RandomResizedCrop(128, scale=(0.3, 1.0))]),
    Compose([DecodeImage(), Resize(150), CenterCrop(128)]),
]


@pytest.mark.parametrize("t", REDUCED_CHAINS)
def test_reduced_scale_decode_matches_full_size_path(t):
    data = jpeg(smooth_image(1200, 1600), quality=95)
    full = simplejpeg.decode_jpeg(data)
    denoms = set()
    for index in range(6):
        _, denom = t.pipeline.prepare(1200, 1600, 0, 0, index)
        denoms.add(denom)
        assert_close_pixels(t(data, index=index), t.pipeline.run(full, 1200, 1600, 1, 0, 0, index))
    assert denoms & {2, 4, 8}


@pytest.mark.parametrize("t", REDUCED_CHAINS)
def test_reduced_scale_decode_differs_only_at_hard_edges(t):
    # DCT scaling filters differently from the antialiased resize: hard edges (the solid
    # discs) differ by up to ~30 levels in about 1% of pixels; the rest stays close.
    data = jpeg(natural_image(1200, 1600, seed=5), quality=95)
    full = simplejpeg.decode_jpeg(data)
    for index in range(6):
        ours = t(data, index=index).astype(int)
        diff = np.abs(ours - t.pipeline.run(full, 1200, 1600, 1, 0, 0, index))
        assert diff.mean() <= 1.0 and np.percentile(diff, 99) <= 8


def test_scale_denom_keeps_the_crop_at_least_the_output_size():
    t = Compose([DecodeImage(), RandomResizedCrop(224)])
    for index in range(200):
        (_, _, ch, cw), denom = t.pipeline.prepare(1000, 1500, 3, 0, index)
        assert denom in (1, 2, 4, 8)
        assert ch // denom >= 224 and cw // denom >= 224
        if denom < 8:
            assert ch < 224 * denom * 2 or cw < 224 * denom * 2


def test_normalize_and_chw_match_numpy():
    img = natural_image(64, 48)
    out = Compose([CenterCrop(32), Normalize(IMAGENET_MEAN, IMAGENET_STD), ToCHW()])(img)
    crop = img[16:48, 8:40]
    ref = ((crop / 255.0 - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD)).transpose(2, 0, 1)
    assert out.dtype == np.float32 and out.shape == (3, 32, 32)
    assert np.abs(out - ref).max() <= 1e-6


def test_uint8_chw_without_normalize():
    img = natural_image(20, 30)
    out = Compose([ToCHW()])(img)
    assert np.array_equal(out, img.transpose(2, 0, 1))


def test_same_key_same_output_and_indices_differ():
    data = jpeg(natural_image(300, 400, seed=6))
    t = Compose(
        [
            DecodeImage(),
            RandomResizedCrop(96),
            RandomHorizontalFlip(),
            Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )
    a = t(data, index=5, seed=11, epoch=2)
    assert np.array_equal(a, t(data, index=5, seed=11, epoch=2))
    rects = {t.pipeline.prepare(300, 400, 11, 2, i)[0] for i in range(20)}
    assert len(rects) == 20
    assert not np.array_equal(a, t(data, index=5, seed=11, epoch=3))


def test_output_shape_and_dtype_are_declared():
    t = Compose([DecodeImage(), RandomResizedCrop((200, 100)), Normalize(0.5, 0.25), ToCHW()])
    assert t.decodes and t.output_shape == (3, 200, 100) and t.output_dtype == np.float32
    assert Compose([DecodeImage(1), Resize(64)]).output_shape is None
    assert Compose([DecodeImage(1), Resize((64, 64))]).output_shape == (64, 64, 1)
    assert Compose([DecodeImage(), CenterCrop(100), Resize(50)]).output_shape == (50, 50, 3)
    arrays = Compose([RandomCrop(32, padding=4)])
    assert not arrays.decodes and arrays.output_shape is None
    assert arrays.output_shape_for((32, 32, 3)) == (32, 32, 3)
    data = jpeg(natural_image(123, 77))
    out = Compose([DecodeImage(), Resize(64)])(data)
    assert out.shape == (102, 64, 3) and out.dtype == np.uint8


def test_grayscale_rgba_and_cmyk_jpegs_give_the_requested_channels():
    rgb = natural_image(90, 120)
    gray_jpeg = jpeg(natural_image(90, 120, channels=1))
    out = Compose([DecodeImage(3)])(gray_jpeg)
    assert out.shape == (90, 120, 3)
    assert np.array_equal(out[:, :, 0], out[:, :, 1]) and np.array_equal(out[:, :, 1], out[:, :, 2])
    assert Compose([DecodeImage(1), CenterCrop(64)])(jpeg(rgb)).shape == (64, 64, 1)
    rgba = Compose([DecodeImage(4)])(jpeg(rgb))
    assert np.all(rgba[:, :, 3] == 255)
    assert np.array_equal(rgba[:, :, :3], Compose([DecodeImage(3)])(jpeg(rgb)))
    buf = io.BytesIO()
    Image.fromarray(rgb).convert("CMYK").save(buf, "JPEG", quality=95)
    out = Compose([DecodeImage(3)])(buf.getvalue())
    ref = np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"))
    assert_close_pixels(out, ref, mae=1.0, max_err=4)


def test_grayscale_and_rgba_arrays_keep_their_channels():
    gray = natural_image(40, 50, channels=1)[:, :, 0]
    assert np.array_equal(Compose([CenterCrop(20)])(gray), gray[10:30, 15:35, None])
    rgba = natural_image(40, 50, channels=4)
    out = Compose([Resize((20, 25)), Normalize((0.5,) * 4, (0.5,) * 4)])(rgba)
    assert out.shape == (20, 25, 4)
    with pytest.raises(ValueError, match="channels"):
        Compose([Normalize(IMAGENET_MEAN, IMAGENET_STD)])(rgba)


@pytest.mark.parametrize(
    "ops,message",
    [
        ([Normalize(0.5, 0.5), CenterCrop(10)], "must come before Normalize"),
        ([RandomHorizontalFlip(), Resize(10)], "must come before"),
        ([CenterCrop(10), RandomCrop(8)], "second crop"),
        ([RandomResizedCrop(10), Resize(8)], "already resizes"),
        ([Resize(8), Resize(9)], "second Resize"),
        ([ToCHW(), Normalize(0.5, 0.5)], "ToCHW"),
        ([CenterCrop(10), DecodeImage()], "first"),
        ([CenterCrop(10), "flip"], "not a fastload transform"),
        ([DecodeImage(1), Normalize(IMAGENET_MEAN, IMAGENET_STD)], "3 values for 1 channels"),
    ],
)
def test_compose_rejects_chains_that_do_not_fit(ops, message):
    with pytest.raises(ValueError, match=message):
        Compose(ops)


def test_transform_arguments_are_validated():
    with pytest.raises(ValueError, match="RandomResizedCrop"):
        RandomResizedCrop(10, scale=(0.5, 0.1))
    with pytest.raises(ValueError, match="DecodeImage"):
        DecodeImage(2)
    with pytest.raises(ValueError, match="float32"):
        Normalize(0.5, 0.5, dtype="float64")


@pytest.mark.parametrize(
    "damage", [lambda b: b[: len(b) // 2], lambda b: b"not a jpeg" + b[10:], lambda b: b""]
)
def test_corrupt_or_truncated_jpeg_raises_value_error(damage):
    data = damage(jpeg(natural_image(64, 64)))
    with pytest.raises(ValueError, match="JPEG"):
        Compose([DecodeImage(), CenterCrop(32)])(data)


def test_image_size_reads_a_jpeg_header():
    assert codecs.image_size(jpeg(natural_image(33, 47))) == (33, 47)
    # The public name, in place of the removed decode_jpeg_header.
    assert image_size(jpeg(natural_image(21, 9))) == (21, 9)


def test_imagefolder_labels_follow_sorted_class_names(tmp_path):
    for name, count in [("dog", 2), ("cat", 3), ("bird", 1)]:
        (tmp_path / name).mkdir()
        for i in range(count):
            (tmp_path / name / f"{i}.jpg").write_bytes(jpeg(natural_image(8, 8, seed=i)))
    (tmp_path / "cat" / "notes.txt").write_text("skip me")
    folder = ImageFolder(tmp_path)
    assert folder.classes == ["bird", "cat", "dog"]
    assert folder.labels.dtype == np.int64
    assert folder.labels.tolist() == [0, 1, 1, 1, 2, 2]
    assert len(folder.images) == 6 and folder.images.paths[0].endswith("bird/0.jpg")
    assert codecs.image_size(folder.images[3]) == (8, 8)


def test_imagefolder_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        ImageFolder(tmp_path / "missing")
    with pytest.raises(ValueError, match="no class subfolders"):
        ImageFolder(tmp_path)
    (tmp_path / "a").mkdir()
    with pytest.raises(ValueError, match="/a' holds no files"):
        ImageFolder(tmp_path)


def test_imagefolder_leaves_out_hidden_folders_and_files_and_names_an_empty_class(tmp_path):
    for name in ("cat", "dog", ".ipynb_checkpoints"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "0.jpg").write_bytes(jpeg(natural_image(8, 8)))
    (tmp_path / "dog" / ".1.jpg").write_bytes(jpeg(natural_image(8, 8)))
    (tmp_path / "dog" / ".cache").mkdir()
    (tmp_path / "dog" / ".cache" / "2.jpg").write_bytes(jpeg(natural_image(8, 8)))
    folder = ImageFolder(tmp_path)
    assert folder.classes == ["cat", "dog"] and folder.labels.tolist() == [0, 1]
    (tmp_path / "bird").mkdir()
    with pytest.raises(ValueError, match="bird"):
        ImageFolder(tmp_path)


def test_misuse_of_a_chain_gets_a_message_that_says_what_to_do():
    image = natural_image(40, 50)
    with pytest.raises(ValueError, match="start it with DecodeImage"):
        Compose([RandomResizedCrop(32)])(jpeg(image))
    with pytest.raises(ValueError, match=r"drop DecodeImage\(\).*\.encoded"):
        Compose([DecodeImage(), CenterCrop(16)])(image)
    with pytest.raises(ValueError, match="larger than the 40x50 image: give the crop padding"):
        Compose([RandomCrop(1000)])(image)
    with pytest.raises(ValueError, match="Apply a function of your own with mapobs"):
        Compose([lambda x: x, CenterCrop(3)])


def test_a_ragged_batch_says_how_to_give_it_one_shape():
    from fastload import DataLoader, LoadError, mapobs

    images = [natural_image(40, 50), natural_image(60, 50)]
    with pytest.raises(LoadError, match="CenterCrop.*collate=False"):
        list(DataLoader(mapobs(Compose([Resize(32)]), images), 2))


def test_normalize_with_values_on_the_0_255_scale_warns():
    with pytest.warns(UserWarning, match="0..1 scale"):
        Normalize((123.7, 116.3, 103.5), (58.4, 57.1, 57.4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Normalize(IMAGENET_MEAN, IMAGENET_STD)


@pytest.mark.parametrize("parallel", [False, 2])
def test_files_loads_images_listed_by_path_and_names_a_bad_one(tmp_path, parallel):
    import fastload
    from fastload import DataLoader, LoadError, mapobs

    paths = []
    for k in range(5):
        path = tmp_path / f"{k}.jpg"
        path.write_bytes(jpeg(natural_image(30 + k, 40, seed=k)))
        paths.append(path if k % 2 else str(path))  # str or os.PathLike
    images = fastload.files(paths)
    chain = Compose([DecodeImage(), CenterCrop(24)])
    batches = [b.copy() for b in DataLoader(mapobs(chain, images), 5, parallel=parallel)]
    expected = np.stack([chain(images[k], index=k) for k in range(5)])
    assert np.array_equal(batches[0], expected)
    (tmp_path / "3.jpg").write_bytes(b"\xff\xd8 truncated")
    with pytest.raises(LoadError, match="3.jpg") as info:
        list(DataLoader(mapobs(chain, images), 5, parallel=parallel))
    assert info.value.index == 3 and info.value.source.endswith("3.jpg")


def test_a_path_given_to_decodejpeg_points_to_files():
    with pytest.raises(ValueError, match=r"fastload.files\(paths\)"):
        Compose([DecodeImage(), CenterCrop(8)])("images/0.jpg")


@pytest.mark.parametrize(
    "ops",
    [
        [Resize(20), CenterCrop((30, 44))],
        [Resize((25, 31)), CenterCrop((20, 40))],
        [RandomResizedCrop(17)],
        [CenterCrop(20), Resize(9)],
        [RandomCrop(50, padding=9), Resize(13)],
        [CenterCrop(70)],
    ],
)
def test_a_flip_mirrors_the_output_whatever_the_geometry(ops):
    """The flip is fused into the resampling (or the copy), also for a window reaching
    outside the image (zero padding): it must equal the unflipped output mirrored."""
    img = natural_image(37, 53, seed=1)
    for index in range(4):
        flipped = Compose(ops + [RandomHorizontalFlip(1.0)])(img, index=index)
        plain = Compose(ops + [RandomHorizontalFlip(0.0)])(img, index=index)
        assert np.array_equal(flipped, plain[:, ::-1])
