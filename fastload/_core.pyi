"""Types of fastload._core, the binding of the C core (fastload/_core.pyx)."""

from collections.abc import Callable, Sequence
from os import PathLike
from types import ModuleType
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ._base.tree import LeafKind
from ._loading.seams import Dests, Field, Loaded, Objects, Plan, Transport

_Bytes = bytes | bytearray | memoryview
_Box = tuple[int, int, int, int]
_U8 = npt.NDArray[np.uint8]

# The pool and per-item randomness.
def pool_size() -> int: ...
def reserve_threads(n: int) -> int: ...
def default_pool_size() -> int: ...
def shutdown_pool() -> None: ...
def rng_uniform(seed: int, epoch: int, index: int, op: int, n: int) -> npt.NDArray[np.float64]: ...
def rng_bits(seed: int, epoch: int, index: int, op: int, n: int) -> npt.NDArray[np.uint64]: ...

# Runs of a schedule and the delivery loop.
class Fields:
    @property
    def nfields(self) -> int: ...
    @property
    def kinds(self) -> tuple[LeafKind, ...]: ...
    @property
    def row_bytes(self) -> tuple[int, ...]: ...
    def __init__(self, fields: list[Field], row_bytes: list[int]) -> None: ...

class Stats:
    items: int
    batches: int
    skipped: int
    wait_s: float
    compute_s: float

class Progress:
    epoch: int
    step: int
    def __init__(self, epoch: int = 0, step: int = 0) -> None: ...

class SlotWatch:
    def __init__(self, dests: list[Any], value: Any) -> None: ...

def watch_ring(ring: list[Any], values: list[Any]) -> list[SlotWatch]: ...

class Iteration:
    # Told True (the caller's thread loads the rest) or False (the pool does) once an
    # adaptive run decided.
    on_adapted: Callable[[bool], None] | None
    @property
    def plan(self) -> Plan: ...
    @property
    def objects(self) -> list[Objects]: ...
    @property
    def done(self) -> bool: ...
    def __init__(
        self,
        plan: Plan,
        *,
        ring: list[Dests],
        values: list[Any],
        objects: list[Objects],
        rows: int,
        buffer: bool,
        stats: Stats,
        progress: Progress,
        on_end: Callable[[], None] | None = None,
        count_values: bool = False,
        check: Callable[[int], None] | None = None,
        watches: list[SlotWatch] | None = None,
        copier: Callable[[Any], Any] | None = None,
    ) -> None: ...
    def start_run(
        self,
        fields: Fields,
        *,
        order: npt.NDArray[np.int64],
        bounds: npt.NDArray[np.int64] | None,
        first_step: int,
        end_step: int,
        seed: int,
        epoch: int,
        parallel: int,
        claim_size: int,
        ordered: bool,
        skip_errors: bool,
        release_gil: bool,
        filler: Callable[[int, int, int, int], None] | None,
        adaptive: bool = ...,
    ) -> None: ...
    def go_inline(self, on: bool = True) -> None: ...
    @property
    def inline(self) -> bool | None: ...
    def begin(self) -> None: ...
    def watch(self, word: npt.NDArray[np.int64], value: int) -> None: ...
    @property
    def is_gated(self) -> bool: ...
    def gate(self, word: npt.NDArray[np.int64]) -> None: ...
    def load_next(self) -> Loaded | None: ...
    def start_transport(self, transport: Transport) -> None: ...
    def cancel(self) -> None: ...
    def close(self) -> None: ...
    def __iter__(self) -> Iteration: ...
    def __next__(self) -> Any: ...

# Image kernels and batch mixes.
CROP_KINDS: dict[str | None, int]
RESIZE_KINDS: dict[str | None, int]
MAX_PIXEL_OPS: int

def as_image(x: npt.ArrayLike) -> _U8: ...
def resize(img: npt.ArrayLike, height: int, width: int) -> _U8: ...
def resize_area_scratch_bytes(h: int, w: int, c: int, height: int, width: int) -> int: ...
def resize_area(
    img: npt.ArrayLike,
    height: int,
    width: int,
    out: _U8 | None = None,
    scratch: _U8 | None = None,
) -> _U8: ...
def set_simd(on: bool) -> bool: ...
def flip_horizontal(img: npt.ArrayLike) -> _U8: ...
def normalize(
    img: npt.ArrayLike, mean: Sequence[float], std: Sequence[float], chw: bool = False
) -> npt.NDArray[np.float32]: ...
def convert_channels(img: npt.ArrayLike, channels: int) -> _U8: ...
def rrc_params(
    h: int,
    w: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    seed: int = 0,
    epoch: int = 0,
    index: int = 0,
    op: int = 0,
) -> _Box: ...
def center_crop_params(h: int, w: int, th: int, tw: int) -> tuple[int, int]: ...
def random_crop_params(
    h: int,
    w: int,
    th: int,
    tw: int,
    padding: int = 0,
    seed: int = 0,
    epoch: int = 0,
    index: int = 0,
    op: int = 0,
) -> tuple[int, int]: ...
def color_jitter(
    img: npt.ArrayLike, factors: Sequence[float | None], order: Sequence[int] = (0, 1, 2, 3)
) -> _U8: ...
def grayscale(img: npt.ArrayLike) -> _U8: ...
def gaussian_blur(img: npt.ArrayLike, kh: int, kw: int, sigma_y: float, sigma_x: float) -> _U8: ...
def erasing_params(
    h: int,
    w: int,
    p: float,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    seed: int = 0,
    epoch: int = 0,
    index: int = 0,
    op: int = 0,
) -> _Box | None: ...
def normal_draws(n: int, seed: int = 0) -> npt.NDArray[np.float64]: ...
def beta_draws(a: float, b: float, n: int, seed: int = 0) -> npt.NDArray[np.float64]: ...
def mixup_lambda(alpha: float, seed: int, epoch: int, step: int) -> float: ...
def cutmix_params(
    alpha: float, seed: int, epoch: int, step: int, h: int, w: int
) -> tuple[float, _Box]: ...
def cutmix_box(lam: float, cy: int, cx: int, h: int, w: int) -> tuple[float, _Box]: ...
def mixup_(batch: np.ndarray, lam: float) -> np.ndarray: ...
def cutmix_(batch: np.ndarray, box: _Box, chw: bool) -> np.ndarray: ...

class Pipeline:
    @property
    def chw(self) -> bool: ...
    @property
    def normalize(self) -> bool: ...
    def __init__(
        self,
        *,
        channels: int = 0,
        crop: Literal["center", "random", "random_resized"] | None = None,
        crop_op: int = 0,
        crop_after_resize: bool = False,
        crop_size: tuple[int, int] = (0, 0),
        padding: int = 0,
        scale: tuple[float, float] = (0.0, 0.0),
        ratio: tuple[float, float] = (0.0, 0.0),
        resize: Literal["shorter", "exact"] | None = None,
        resize_size: tuple[int, int] = (0, 0),
        flip_p: float = 0.0,
        flip_op: int = 0,
        pixel_ops: Sequence[dict[str, Any]] = (),
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        chw: bool = False,
        erasing: dict[str, Any] | None = None,
    ) -> None: ...
    def output_shape(self, h: int, w: int, c: int) -> tuple[int, int, int]: ...
    def prepare(
        self, h: int, w: int, seed: int = 0, epoch: int = 0, index: int = 0
    ) -> tuple[_Box, int]: ...
    def run(
        self,
        decoded: npt.ArrayLike,
        src_h: int,
        src_w: int,
        scale_denom: int = 1,
        seed: int = 0,
        epoch: int = 0,
        index: int = 0,
    ) -> np.ndarray: ...

# The QOI codec.
def qoi_header(data: _Bytes) -> tuple[int, int, int]: ...
def qoi_encode(image: npt.ArrayLike) -> bytes: ...
def qoi_decode(data: _Bytes, channels: int | None = None, out: _U8 | None = None) -> _U8: ...

# Native image fields.
JPEG_FALLBACK_REASON: str

def jpeg_library_version() -> int: ...
def jpeg_size(data: _Bytes) -> tuple[int, int]: ...

class ImageSource:
    @property
    def count(self) -> int: ...
    def __init__(
        self,
        pipeline: Pipeline,
        *,
        channels: int,
        name: str,
        decoder: ModuleType,
        max_pixels: int,
        max_file_bytes: int,
        exact: bool = False,
        buffers: Sequence[_Bytes] | None = None,
        spans: tuple[Sequence[_U8], npt.ArrayLike | None, npt.ArrayLike, npt.ArrayLike]
        | None = None,
        offsets: tuple[_U8, npt.NDArray[np.int64]] | None = None,
        paths: Sequence[str | bytes | PathLike[str]] | None = None,
        pixels: Sequence[_U8] | None = None,
    ) -> None: ...
    def run(
        self, data: _Bytes, out: np.ndarray, seed: int = 0, epoch: int = 0, index: int = 0
    ) -> np.ndarray: ...
    def decode(
        self, data: _Bytes, seed: int = 0, epoch: int = 0, index: int = 0
    ) -> tuple[_U8, tuple[int, int], int]: ...

# Guarded file maps.
class FileGuard:
    def __init__(self, mapping: Any) -> None: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...
    def __len__(self) -> int: ...
    @property
    def faults(self) -> int: ...

def guarded_faults() -> int: ...
