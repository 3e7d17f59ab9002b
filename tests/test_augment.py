"""The augmentation ops (colour jitter, grayscale, blur, erasing, Lambda, MixUp, CutMix)
against numpy references written from torchvision's documented rules.

Tolerances: brightness, contrast, saturation, grayscale, erasing and the mixes match their
references exactly (same formulas, same rounding); hue within 1 gray level (the reference
goes through torchvision's HSV formulas in float64, the kernel through their algebraic
simplification); the blur within 1 gray level (float32 sums against float64).
"""

import math

import numpy as np
import pytest
from test_image_kernels import ModelRng, natural_image

from fastload import DataLoader, _core, mapobs
from fastload._base.randomness import Purpose, generator
from fastload.transforms import (
    CenterCrop,
    ColorJitter,
    Compose,
    CutMix,
    GaussianBlur,
    Lambda,
    MixUp,
    Normalize,
    RandomErasing,
    RandomGrayscale,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    ToCHW,
)

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


# ---- numpy references ------------------------------------------------------------------


def round_u8(v):
    """Round half up, clamped to 0..255."""
    return np.clip(np.floor(v + 0.5), 0, 255).astype(np.uint8)


def luma(img):
    rgb = img[..., :3].astype(np.int64)
    return (rgb[..., 0] * 19595 + rgb[..., 1] * 38470 + rgb[..., 2] * 7471 + 32768) >> 16


def on_colour(img, f):
    """f applied to the colour channels of img (float64), alpha kept."""
    out = img.copy()
    cc = 3 if img.shape[2] >= 3 else 1
    out[..., :cc] = f(img[..., :cc].astype(np.float64))
    return out


def ref_brightness(img, f):
    return on_colour(img, lambda x: round_u8(f * x))


def ref_contrast(img, f):
    m = luma(img).mean() if img.shape[2] >= 3 else img[..., 0].astype(np.int64).mean()
    return on_colour(img, lambda x: round_u8(f * x + (1.0 - f) * m))


def ref_saturation(img, f):
    if img.shape[2] == 1:
        return img.copy()
    gray = luma(img)[..., None].astype(np.float64)
    return on_colour(img, lambda x: round_u8(f * x + (1.0 - f) * gray))


def ref_hue(img, h):
    """torchvision's _rgb2hsv, hue shift and _hsv2rgb, in float64 on the 0..1 scale."""
    if img.shape[2] == 1:
        return img.copy()
    rgb = img[..., :3].astype(np.float64) / 255.0
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    maxc, minc = rgb.max(-1), rgb.min(-1)
    eqc = maxc == minc
    cr = maxc - minc
    s = cr / np.where(eqc, 1.0, maxc)
    div = np.where(eqc, 1.0, cr)
    rc, gc, bc = (maxc - r) / div, (maxc - g) / div, (maxc - b) / div
    hr = (maxc == r) * (bc - gc)
    hg = ((maxc == g) & (maxc != r)) * (2.0 + rc - bc)
    hb = ((maxc != g) & (maxc != r)) * (4.0 + gc - rc)
    hue = np.fmod((hr + hg + hb) / 6.0 + 1.0, 1.0)
    hue = np.mod(hue + h, 1.0)
    i = np.floor(hue * 6.0)
    f = hue * 6.0 - i
    i = i.astype(np.int64) % 6
    v = maxc
    p = np.clip(v * (1.0 - s), 0, 1)
    q = np.clip(v * (1.0 - s * f), 0, 1)
    t = np.clip(v * (1.0 - s * (1.0 - f)), 0, 1)
    pick = lambda *xs: np.choose(i, xs)
    out_rgb = np.stack([pick(v, q, p, p, t, v), pick(t, v, v, q, p, p), pick(p, p, t, v, v, q)], -1)
    return on_colour(img, lambda _: round_u8(out_rgb * 255.0))


REFS = (ref_brightness, ref_contrast, ref_saturation, ref_hue)


def ref_jitter(img, factors, order):
    for k in order:
        if factors[k] is not None:
            img = REFS[k](img, factors[k])
    return img


def ref_grayscale(img):
    out = img.copy()
    if img.shape[2] >= 3:
        out[..., :3] = luma(img)[..., None]
    return out


def ref_gaussian_blur(img, kh, kw, sigma_y, sigma_x):
    """torchvision's kernel and reflect padding; a full 2-D sum in float64, rounded."""

    def taps(k, sigma):
        x = np.linspace(-(k - 1) / 2, (k - 1) / 2, k)
        pdf = np.exp(-0.5 * (x / sigma) ** 2)
        return pdf / pdf.sum()

    kernel = np.outer(taps(kh, sigma_y), taps(kw, sigma_x))
    padded = np.pad(
        img.astype(np.float64), ((kh // 2,) * 2, (kw // 2,) * 2, (0, 0)), mode="reflect"
    )
    h, w = img.shape[:2]
    out = np.zeros(img.shape, np.float64)
    for dy in range(kh):
        for dx in range(kw):
            out += kernel[dy, dx] * padded[dy : dy + h, dx : dx + w]
    return round_u8(out)


def model_permutation(rng):
    order = [0, 1, 2, 3]
    for i in range(3, 0, -1):
        j = rng.below(i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def model_jitter_draws(rng, ranges):
    """The (factors, order) a ColorJitter draws from `rng`: the permutation, then 4 factors."""
    order = model_permutation(rng)
    factors = []
    for r in ranges:
        u = rng.uniform()
        factors.append(None if r is None else r[0] + (r[1] - r[0]) * u)
    return factors, order


def torchvision_erasing_params(rng, h, w, p, scale, ratio):
    """torchvision's RandomErasing draws, written out, drawing from `rng`."""
    if not rng.uniform() < p:
        return None
    area = h * w
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        erase_area = area * (scale[0] + (scale[1] - scale[0]) * rng.uniform())
        aspect = math.exp(log_ratio[0] + (log_ratio[1] - log_ratio[0]) * rng.uniform())
        eh = int(round(math.sqrt(erase_area * aspect)))
        ew = int(round(math.sqrt(erase_area / aspect)))
        if not (eh < h and ew < w):
            continue
        return rng.below(h - eh + 1), rng.below(w - ew + 1), eh, ew
    return None


def torchvision_cutmix_box(lam, cy, cx, h, w):
    r = 0.5 * math.sqrt(1.0 - lam)
    half_w, half_h = int(r * w), int(r * h)
    x1, y1 = max(cx - half_w, 0), max(cy - half_h, 0)
    x2, y2 = min(cx + half_w, w), min(cy + half_h, h)
    return 1.0 - (x2 - x1) * (y2 - y1) / (w * h), (y1, x1, y2 - y1, x2 - x1)


# ---- colour ----------------------------------------------------------------------------


@pytest.mark.parametrize("channels", [1, 3, 4])
@pytest.mark.parametrize(
    "which,factor",
    [(0, 0.0), (0, 0.63), (0, 1.7), (1, 0.0), (1, 0.55), (1, 1.9), (2, 0.0), (2, 0.4), (2, 2.5)],
)
def test_brightness_contrast_saturation_match_numpy_exactly(channels, which, factor):
    img = natural_image(37, 53, channels=channels, seed=which)
    factors = [None] * 4
    factors[which] = factor
    assert np.array_equal(_core.color_jitter(img, factors), ref_jitter(img, factors, range(4)))


@pytest.mark.parametrize("channels", [1, 3, 4])
@pytest.mark.parametrize("shift", [-0.5, -0.23, 0.0, 0.01, 1 / 3, 0.5])
def test_hue_matches_torchvision_formulas_within_one_level(channels, shift):
    img = natural_image(41, 47, channels=channels, seed=3)
    ours = _core.color_jitter(img, (None, None, None, shift)).astype(int)
    ref = ref_hue(img, shift).astype(int)
    assert np.abs(ours - ref).max() <= 1  # exact halves may round either way
    assert (ours == ref).mean() > 0.99


def test_hue_turns_primary_colours_and_keeps_grays():
    img = np.array([[[255, 0, 0], [0, 255, 0], [90, 90, 90]]], np.uint8)
    out = _core.color_jitter(img, (None, None, None, 1 / 3))
    assert out.tolist() == [[[0, 255, 0], [0, 0, 255], [90, 90, 90]]]


def test_jitter_applies_its_adjustments_in_the_given_order():
    img = natural_image(30, 40, seed=5)
    factors = (1.3, 0.6, 1.8, None)
    outs = set()
    for order in [(0, 1, 2, 3), (2, 1, 0, 3), (1, 2, 3, 0), (3, 0, 2, 1)]:
        out = _core.color_jitter(img, factors, order)
        assert np.array_equal(out, ref_jitter(img, factors, order))
        outs.add(out.tobytes())
    assert len(outs) == 4


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_grayscale_is_the_luma_in_every_colour_channel(channels):
    img = natural_image(20, 30, channels=channels)
    assert np.array_equal(_core.grayscale(img), ref_grayscale(img))


# ---- blur ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape,kh,kw,sy,sx",
    [
        ((40, 50, 3), 5, 5, 1.0, 1.0),
        ((40, 50, 3), 23, 23, 2.0, 2.0),
        ((33, 20, 1), 3, 9, 0.5, 3.0),
        ((17, 19, 4), 1, 7, 0.3, 1.5),
        ((5, 6, 3), 13, 15, 4.0, 5.0),
    ],
)
def test_gaussian_blur_matches_numpy_within_one_level(shape, kh, kw, sy, sx):
    img = natural_image(shape[0], shape[1], channels=shape[2], seed=kh)
    ours = _core.gaussian_blur(img, kh, kw, sy, sx).astype(int)
    ref = ref_gaussian_blur(img, kh, kw, sy, sx).astype(int)
    assert np.abs(ours - ref).max() <= 1
    assert (ours == ref).mean() > 0.99


def test_gaussian_blur_keeps_flat_images_flat_and_rejects_even_kernels():
    flat = np.full((9, 11, 3), 201, np.uint8)
    assert np.all(_core.gaussian_blur(flat, 7, 5, 3.0, 2.0) == 201)
    with pytest.raises(ValueError):
        _core.gaussian_blur(flat, 4, 5, 1.0, 1.0)


# ---- in a chain ------------------------------------------------------------------------


def test_colour_ops_in_a_chain_draw_from_their_own_position():
    img = natural_image(60, 80, seed=2)
    ops = [
        CenterCrop(40),
        ColorJitter(0.4, 0.4, 0.4),
        RandomGrayscale(0.5),
        GaussianBlur((5, 3), sigma=(0.5, 2.0)),
    ]
    chain = Compose(ops)
    crop = img[10:50, 20:60]
    for index in range(6):
        factors, order = model_jitter_draws(
            ModelRng(3, 1, index, 1),
            [ops[1].brightness, ops[1].contrast, ops[1].saturation, ops[1].hue],
        )
        expected = _core.color_jitter(crop, factors, order)
        if ModelRng(3, 1, index, 2).uniform() < 0.5:
            expected = _core.grayscale(expected)
        sigma = 0.5 + 1.5 * ModelRng(3, 1, index, 3).uniform()
        expected = _core.gaussian_blur(expected, 3, 5, sigma, sigma)  # kernel (kx, ky)
        assert np.array_equal(chain(img, index=index, seed=3, epoch=1), expected)


def test_hue_in_a_chain_matches_the_kernel():
    img = natural_image(32, 32, seed=4)
    jitter = ColorJitter(hue=0.3)
    chain = Compose([jitter])
    factors, order = model_jitter_draws(ModelRng(0, 0, 5, 0), [None, None, None, jitter.hue])
    assert np.array_equal(chain(img, index=5), _core.color_jitter(img, factors, order))


def test_same_key_same_output_and_indices_differ():
    img = natural_image(64, 64, seed=6)
    chain = Compose(
        [
            RandomResizedCrop(32),
            RandomHorizontalFlip(),
            ColorJitter(0.4, 0.4, 0.4, 0.1),
            GaussianBlur(3),
            Normalize(MEAN, STD),
            ToCHW(),
            RandomErasing(p=1.0, value="random"),
        ]
    )
    a = chain(img, index=11, seed=5, epoch=2)
    assert np.array_equal(a, chain(img, index=11, seed=5, epoch=2))
    assert not np.array_equal(a, chain(img, index=12, seed=5, epoch=2))
    assert not np.array_equal(a, chain(img, index=11, seed=5, epoch=3))


def test_erasing_params_follow_torchvision_rules():
    found = 0
    for index in range(300):
        h, w = 20 + index % 17, 30 + index % 23
        scale, ratio = (0.02, 0.6), (0.3, 3.3)
        ours = _core.erasing_params(h, w, 0.7, scale, ratio, 9, 0, index, 4)
        assert ours == torchvision_erasing_params(ModelRng(9, 0, index, 4), h, w, 0.7, scale, ratio)
        found += ours is not None
    assert 100 < found < 300


@pytest.mark.parametrize("ratio", [(1e17, 1e18), (1e-18, 1e-17)])
def test_erasing_with_a_ratio_whose_sides_overflow_an_int_erases_nothing(ratio):
    img = natural_image(40, 50, seed=12)
    box = _core.erasing_params(40, 50, 1.0, (0.3, 0.33), ratio, 0, 0, 0, 0)
    assert box is None
    assert box == torchvision_erasing_params(ModelRng(0, 0, 0, 0), 40, 50, 1.0, (0.3, 0.33), ratio)
    out = Compose([RandomErasing(p=1.0, scale=(0.3, 0.33), ratio=ratio, value=7)])(img)
    assert np.array_equal(out, img)


@pytest.mark.parametrize("chw", [False, True])
def test_erasing_writes_its_value_into_the_final_output(chw):
    img = natural_image(48, 40, seed=8)
    head = [CenterCrop(32), Normalize(MEAN, STD)] + ([ToCHW()] if chw else [])
    plain = Compose(head)
    erasing = Compose(head + [RandomErasing(p=1.0, value=(1.0, 2.0, 3.0))])
    for index in range(5):
        expected = plain(img, index=index)
        box = _core.erasing_params(32, 32, 1.0, (0.02, 0.33), (0.3, 3.3), 0, 0, index, len(head))
        if box is not None:
            y, x, h, w = box
            values = np.array([1.0, 2.0, 3.0], np.float32)
            if chw:
                expected[:, y : y + h, x : x + w] = values[:, None, None]
            else:
                expected[y : y + h, x : x + w] = values
        assert np.array_equal(erasing(img, index=index), expected)


def test_random_erasing_draws_normal_values_for_floats_and_bytes_for_uint8():
    img = natural_image(64, 64, seed=9)
    floats = Compose(
        [Normalize(MEAN, STD), ToCHW(), RandomErasing(p=1.0, scale=(0.3, 0.33), value="random")]
    )
    out, plain = floats(img, index=1), Compose([Normalize(MEAN, STD), ToCHW()])(img)
    erased = out[out != plain]
    assert erased.size > 0.25 * out.size
    assert abs(erased.mean()) < 0.1 and 0.9 < erased.std() < 1.1
    uint8 = Compose([RandomErasing(p=1.0, scale=(0.3, 0.33), value="random")])
    changed = uint8(img, index=1)[uint8(img, index=1) != img]
    assert changed.size > 0.2 * img.size and 100 < changed.mean() < 155


def test_uint8_erasing_with_a_constant():
    img = natural_image(30, 30, seed=10)
    box = _core.erasing_params(30, 30, 1.0, (0.1, 0.2), (0.5, 2.0), 0, 0, 3, 0)
    out = Compose([RandomErasing(1.0, (0.1, 0.2), (0.5, 2.0), value=7)])(img, index=3)
    y, x, h, w = box
    expected = img.copy()
    expected[y : y + h, x : x + w] = 7
    assert np.array_equal(out, expected)


# ---- Lambda ----------------------------------------------------------------------------


def test_lambda_runs_between_the_native_parts_with_their_positions_as_keys():
    img = natural_image(60, 70, seed=11)
    calls = []

    def invert(image):
        calls.append(image.shape)
        return 255 - image

    with_lambda = Compose(
        [
            RandomResizedCrop(32),
            Lambda(invert),
            ColorJitter(0.5, 0.5),
            Normalize(MEAN, STD),
            ToCHW(),
        ]
    )
    head = Compose([RandomResizedCrop(32)])
    tail = Compose(
        [
            RandomGrayscale(0.0),
            RandomGrayscale(0.0),
            ColorJitter(0.5, 0.5),
            Normalize(MEAN, STD),
            ToCHW(),
        ]
    )  # ColorJitter at the same position, 2
    assert not with_lambda.native and with_lambda.output_shape is None
    assert with_lambda.output_shape_for((60, 70, 3)) == (3, 32, 32)
    for index in range(4):
        expected = tail(255 - head(img, index=index, seed=1), index=index, seed=1)
        assert np.array_equal(with_lambda(img, index=index, seed=1), expected)
    assert calls == [(32, 32, 3)] * 4


def test_lambda_with_rng_gets_a_generator_keyed_by_the_item():
    seen = []

    def noise(image, rng):
        seen.append(rng.integers(1 << 30))
        return image

    chain = Compose([CenterCrop(8), Lambda(noise)])
    img = natural_image(10, 10)
    for index in (0, 1, 0):
        chain(img, index=index, seed=4, epoch=2)
    assert seen[0] == seen[2] != seen[1]
    expected = generator(4, Purpose.TRANSFORM, 2, 0, 1).integers(1 << 30)
    assert seen[0] == expected


def test_lambda_must_keep_the_shape_and_dtype():
    chain = Compose([Lambda(lambda image: image[1:])])
    with pytest.raises(ValueError, match="same shape"):
        chain(natural_image(10, 10))
    with pytest.raises(ValueError, match="same shape"):
        Compose([Lambda(lambda image: image / 2)])(natural_image(10, 10))


# ---- the loader --------------------------------------------------------------------------


@pytest.mark.parametrize("with_lambda", [False, True])
def test_loader_output_equals_calling_the_chain_per_item(with_lambda):
    images = [natural_image(40 + k, 50, seed=k) for k in range(12)]
    middle = [Lambda(lambda image: image[:, ::-1].copy())] if with_lambda else []
    chain = Compose(
        [RandomResizedCrop(24), ColorJitter(0.4, 0.4, 0.4, 0.1)]
        + middle
        + [
            RandomGrayscale(0.3),
            GaussianBlur(3),
            Normalize(MEAN, STD),
            ToCHW(),
            RandomErasing(value="random"),
        ]
    )
    batches = [b.copy() for b in DataLoader(mapobs(chain, images), 8, parallel=2, seed=7)]
    expected = np.stack([chain(images[k], index=k, seed=7, epoch=0) for k in range(12)])
    assert np.array_equal(np.concatenate(batches), expected)


# ---- chain rules and arguments -----------------------------------------------------------


@pytest.mark.parametrize(
    "ops,message",
    [
        ([Normalize(MEAN, STD), ColorJitter(0.2)], "before Normalize"),
        ([ToCHW(), GaussianBlur(3)], "after ToCHW"),
        ([Lambda(abs), Resize(10)], "must come before Lambda"),
        ([ColorJitter(0.2), CenterCrop(8)], "must come before ColorJitter"),
        ([RandomGrayscale(), RandomHorizontalFlip()], "must come before RandomGrayscale"),
        ([RandomErasing(), Normalize(MEAN, STD)], "after RandomErasing, which must be last"),
        ([RandomErasing(), RandomErasing()], "after RandomErasing, which must be last"),
        ([ColorJitter(0.1)] * 9, "one colour op too many"),
        ([RandomErasing(value=0.5)], "whole numbers in 0..255"),
        ([RandomErasing(value=300)], "whole numbers in 0..255"),
    ],
)
def test_chains_that_break_the_rules_say_what_to_do(ops, message):
    with pytest.raises(ValueError, match=message):
        Compose(ops)


def test_chains_that_fit_the_rules():
    Compose(
        [
            CenterCrop(8),
            GaussianBlur(3),
            ColorJitter(0.1),
            Lambda(abs),
            GaussianBlur(3),
            RandomGrayscale(),
            Normalize(MEAN, STD),
            ToCHW(),
            RandomErasing(value="random"),
        ]
    )
    Compose([ColorJitter(0.1)] * 8 + [Lambda(abs)] * 3 + [ToCHW(), RandomErasing(value=255)])


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: ColorJitter(brightness=-0.1), "brightness as one number must be >= 0"),
        (lambda: ColorJitter(contrast=(1.2, 0.8)), "contrast must give min <= max"),
        (lambda: ColorJitter(hue=0.6), "hue must give min <= max within"),
        (lambda: ColorJitter(hue=(-0.7, 0.1)), "hue must give"),
        (lambda: ColorJitter(saturation="a lot"), "number or a"),
        (lambda: RandomGrayscale(1.5), r"p must be in \[0, 1\]"),
        (lambda: GaussianBlur(4), "odd positive"),
        (lambda: GaussianBlur((3, 0)), "odd positive"),
        (lambda: GaussianBlur(3, sigma=0), "sigma must be > 0"),
        (lambda: GaussianBlur(3, sigma=(2.0, 1.0)), "sigma must be > 0"),
        (lambda: RandomErasing(scale=(0.5, 1.5)), "scale must be"),
        (lambda: RandomErasing(ratio=(0, 1)), "ratio"),
        (lambda: RandomErasing(value="noise"), "'random'"),
        (lambda: Lambda(3), "callable"),
        (lambda: MixUp(alpha=0, num_classes=3), "alpha must be a finite number > 0"),
        (lambda: CutMix(alpha=float("inf"), num_classes=3), "alpha must be a finite number"),
        (lambda: CutMix(num_classes=0), "num_classes"),
        (lambda: CutMix(num_classes=3, layout="CHW"), "layout"),
    ],
)
def test_arguments_are_validated(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_jitter_ranges_follow_torchvision():
    j = ColorJitter(brightness=0.4, contrast=1.5, saturation=(0.2, 0.3), hue=0.1)
    assert j.brightness == (0.6, 1.4) and j.contrast == (0.0, 2.5)
    assert j.saturation == (0.2, 0.3) and j.hue == (-0.1, 0.1)
    assert ColorJitter(brightness=(1, 1), hue=0).brightness is None
    assert GaussianBlur((3, 5)).kernel_size == (3, 5) and GaussianBlur(7, 1.0).sigma == (1.0, 1.0)


# ---- random variates -----------------------------------------------------------------------


def ks_distance(draws, cdf):
    x = np.sort(draws)
    n = len(x)
    f = cdf(x)
    return max(np.max(np.arange(1, n + 1) / n - f), np.max(f - np.arange(n) / n))


@pytest.mark.parametrize(
    "a,cdf",
    [
        (1.0, lambda x: x),
        (2.0, lambda x: 3 * x**2 - 2 * x**3),
        (0.5, lambda x: 2 / np.pi * np.arcsin(np.sqrt(x))),
    ],
)
def test_beta_sampler_matches_the_distribution(a, cdf):
    draws = _core.beta_draws(a, a, 20000, seed=1)
    assert np.all((draws >= 0) & (draws <= 1))
    assert ks_distance(draws, cdf) < 1.63 / math.sqrt(len(draws))  # KS at the 1% level


def test_beta_sampler_stays_finite_for_small_alpha():
    draws = _core.beta_draws(0.05, 0.05, 5000, seed=2)
    assert np.all(np.isfinite(draws)) and abs(draws.mean() - 0.5) < 0.05
    assert abs(draws.var() - 1 / (4 * 1.1)) < 0.02


def test_normal_sampler_matches_the_distribution():
    draws = _core.normal_draws(20000, seed=3)
    erf = np.vectorize(math.erf)
    assert ks_distance(draws, lambda x: 0.5 * (1 + erf(x / math.sqrt(2)))) < 0.0115


# ---- MixUp and CutMix ------------------------------------------------------------------------


def test_mixup_mixes_in_place_with_the_batch_rolled_by_one():
    rng = np.random.default_rng(0)
    images = rng.normal(size=(5, 3, 8, 6)).astype(np.float32)
    original = images.copy()
    mixup = MixUp(alpha=0.4, num_classes=4, seed=3)
    out, targets = mixup(images, np.array([0, 1, 2, 3, 0]), epoch=1, step=7)
    lam = _core.mixup_lambda(0.4, 3, 1, 7)
    rolled = np.roll(original, 1, axis=0)
    assert out is images
    assert np.array_equal(images, rolled * np.float32(1 - lam) + original * np.float32(lam))
    one_hot = np.eye(4, dtype=np.float32)[[0, 1, 2, 3, 0]]
    assert targets.dtype == np.float32 and targets.shape == (5, 4)
    assert np.allclose(targets, lam * one_hot + (1 - lam) * np.roll(one_hot, 1, axis=0))


def test_mixup_of_uint8_rounds_half_up():
    images = np.random.default_rng(1).integers(0, 256, (4, 5, 5, 3), np.uint8)
    original = images.copy()
    lam = _core.mixup_lambda(1.0, 0, 0, 2)
    MixUp(num_classes=2)(images, np.zeros(4, np.int64), epoch=0, step=2)
    a, b = original.astype(np.float32), np.roll(original, 1, axis=0).astype(np.float32)
    expected = np.floor(b * np.float32(1 - lam) + a * np.float32(lam) + np.float32(0.5))
    assert np.array_equal(images, expected.astype(np.uint8))


def test_mix_draws_are_keyed_by_seed_epoch_and_step():
    lam = _core.mixup_lambda(1.0, 5, 2, 9)
    assert lam == _core.mixup_lambda(1.0, 5, 2, 9)
    assert (
        len(
            {
                lam,
                _core.mixup_lambda(1.0, 5, 2, 10),
                _core.mixup_lambda(1.0, 5, 3, 9),
                _core.mixup_lambda(1.0, 6, 2, 9),
            }
        )
        == 4
    )


def test_cutmix_box_follows_torchvision_rules():
    rng = np.random.default_rng(2)
    for _ in range(500):
        h, w = rng.integers(1, 300, 2)
        lam, cy, cx = rng.uniform(), rng.integers(h), rng.integers(w)
        ours = _core.cutmix_box(lam, int(cy), int(cx), int(h), int(w))
        assert ours == torchvision_cutmix_box(lam, cy, cx, h, w)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", [np.float32, np.uint8])
def test_cutmix_pastes_the_box_of_the_item_before(layout, dtype):
    shape = (6, 3, 20, 28) if layout == "NCHW" else (6, 20, 28, 3)
    images = (np.random.default_rng(3).random(shape) * 255).astype(dtype)
    original = images.copy()
    labels = np.eye(5, dtype=np.float32)[[0, 1, 2, 3, 4, 0]] * 0.9 + 0.02
    out, targets = CutMix(alpha=1.0, num_classes=5, seed=1)(images, labels, epoch=0, step=4)
    lam, (y, x, h, w) = _core.cutmix_params(1.0, 1, 0, 4, 20, 28)
    expected = original.copy()
    rolled = np.roll(original, 1, axis=0)
    if layout == "NCHW":
        expected[:, :, y : y + h, x : x + w] = rolled[:, :, y : y + h, x : x + w]
    else:
        expected[:, y : y + h, x : x + w] = rolled[:, y : y + h, x : x + w]
    assert out is images and np.array_equal(images, expected)
    assert h * w > 0 and lam == pytest.approx(1 - h * w / (20 * 28))
    assert np.allclose(targets, lam * labels + (1 - lam) * np.roll(labels, 1, axis=0))


def test_cutmix_infers_the_layout_or_says_to_give_it():
    images = np.zeros((2, 4, 4, 3), np.float32)
    with pytest.raises(ValueError, match="layout='NCHW'"):
        CutMix(num_classes=2)(images, np.zeros(2, np.int64), epoch=0, step=0)
    CutMix(num_classes=2, layout="NHWC")(images, np.zeros(2, np.int64), epoch=0, step=0)


def test_mixes_reject_labels_and_batches_of_the_wrong_kind():
    mixup = MixUp(num_classes=3)
    with pytest.raises(ValueError, match="class ids must be in"):
        mixup(np.zeros((2, 3, 4, 4), np.float32), np.array([0, 3]), epoch=0, step=0)
    with pytest.raises(ValueError, match="integer class ids or a"):
        mixup(np.zeros((2, 3, 4, 4), np.float32), np.zeros((2, 2)), epoch=0, step=0)
    with pytest.raises(ValueError, match="float32 or uint8"):
        mixup(np.zeros((2, 3, 4, 4)), np.array([0, 1]), epoch=0, step=0)
    with pytest.raises(ValueError, match="C-contiguous"):
        mixup(np.zeros((2, 4, 4, 3), np.float32)[:, ::2], np.array([0, 1]), epoch=0, step=0)
