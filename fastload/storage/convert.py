"""Converting a folder of class subfolders of images into a packed dataset."""

import os

from fastload._base.arguments import renamed_keywords
from fastload._images import encoding as images
from fastload._storage.fields import JPEG, QOI, NDArray, Smart, Str
from fastload._storage.remote import is_url
from fastload.imagefolder import ImageFolder
from fastload.storage.writer import write

__all__ = ["MODES", "convert", "image_encoding"]

MODES = ("jpeg", "raw", "qoi", "smart")
DEFAULT_SMART_THRESHOLD = 64 * 64 * 3


def image_encoding(
    mode,
    quality=90,
    max_side=None,
    threshold_bytes=DEFAULT_SMART_THRESHOLD,
    check=True,
    subsampling="420",
    exact=True,
    restart_px=32,
    keep_given=False,
):
    """The image field encoding for a convert ``mode``; raises ValueError for another.
    ``check``: image files stored as given are decoded once first (raw mode decodes
    every image anyway). ``subsampling``, ``exact``, ``restart_px`` and ``keep_given``:
    as ``JPEG``'s."""
    if mode == "jpeg":
        return JPEG(
            quality,
            max_side,
            check,
            subsampling=subsampling,
            exact=exact,
            restart_px=restart_px,
            keep_given=keep_given,
        )
    if mode == "qoi":
        return QOI(max_side, check, exact=exact)
    if mode == "smart":
        return Smart(
            threshold_bytes,
            quality,
            max_side,
            check,
            subsampling=subsampling,
            exact=exact,
            restart_px=restart_px,
            keep_given=keep_given,
        )
    if mode == "raw":
        return NDArray("uint8")
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


class _Sources:
    """ImageFolder observations with each image's path under the folder: ``(image,
    label, path)``, the rows convert writes."""

    def __init__(self, images, folder):
        self.images, self.paths = images, folder.paths
        self.root = os.path.abspath(folder.root)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        image, label = self.images[i]
        return image, label, os.path.relpath(os.path.abspath(self.paths[i]), self.root)


class _DecodedImages:
    """ImageFolder observations with the image decoded (and shrunk to max_side, as an
    image field would): the input of raw mode, whose NDArray field stores pixels."""

    def __init__(self, folder, max_side, exact):
        self.folder, self.max_side, self.exact = folder, max_side, exact
        self.paths = folder.paths

    def __len__(self):
        return len(self.folder)

    def __getitem__(self, i):
        data, label = self.folder[i]
        return images.fit_pixels(data, self.max_side, self.exact), label


@renamed_keywords(chunk_bytes="block_bytes")
def convert(
    src,
    dst,
    *,
    mode="jpeg",
    quality=90,
    max_side=None,
    threshold_bytes=DEFAULT_SMART_THRESHOLD,
    parallel=True,
    progress=True,
    block_bytes=None,
    on_error="raise",
    check=True,
    subsampling="420",
    exact=True,
    restart_px=32,
    keep_given=False,
    num_threads=None,
    storage_options=None,
):
    """Packs ``src/<class>/<image files>`` into the file ``dst`` with fields ``image``
    (encoded per ``mode``), ``label`` (int64, classes in sorted name order; the class
    names are kept in ``Dataset.metadata["classes"]``) and ``path`` (the image's file
    under ``src``, which errors in loading a row name). Returns ``(written, skipped)``:
    the number of images written and the ``LoadError`` of each file left out.

    ``parallel``: the encoders at once, as ``write`` takes it (True: one per CPU;
    ``num_threads=n`` is its deprecated spelling, which warns).

    Every image is decoded once: JPEG (or QOI) files stored as they are too, unless
    ``check=False`` (faster; a file that cannot be decoded then fails in training).
    ``quality``, ``subsampling``, ``restart_px``, ``keep_given`` (jpeg and smart modes),
    ``max_side`` and ``exact``: as ``JPEG``'s: JPEG files that need no resize get restart
    markers losslessly, or with ``keep_given=True`` are stored byte for byte.
    ``block_bytes``: as ``write`` takes it (default: 64 MiB for a local file, 4 MiB at a
    URL). ``dst`` may be a URL (``s3://bucket/train.arrow``;
    ``storage_options``: fsspec's), where the file is uploaded as ``write`` says.

    Raises FileNotFoundError for a missing ``src`` or ``dst`` directory, ValueError for a
    folder without images or a bad option, LoadError naming the file that fails (with
    ``on_error="skip"``: files that fail are left out and returned instead).
    """
    encoding = image_encoding(
        mode, quality, max_side, threshold_bytes, check, subsampling, exact, restart_px, keep_given
    )
    folder = ImageFolder(src)
    dst_dir = os.path.dirname(os.path.abspath(os.fspath(dst)))
    if not is_url(dst) and not os.path.isdir(dst_dir):
        raise FileNotFoundError(f"output directory {dst_dir!r} does not exist")
    data = _Sources(_DecodedImages(folder, max_side, exact) if mode == "raw" else folder, folder)
    skipped = write(
        dst,
        data,
        {"image": encoding, "label": "int64", "path": Str()},
        block_bytes=block_bytes,
        parallel=parallel,
        num_threads=num_threads,
        progress=progress,
        on_error=on_error,
        metadata={"classes": folder.classes, "source": os.path.abspath(folder.root)},
        source_field="path",
        storage_options=storage_options,
    )
    return len(folder) - len(skipped), skipped
