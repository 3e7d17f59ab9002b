"""ImageFolder: a directory of class subfolders as an (images, labels) container."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence

import numpy as np

from . import limits
from ._base.protocols import FilePaths

__all__ = ["ImageFolder", "files"]

# Exactly the files DecodeImage decodes: JPEG and QOI in C, the others through Pillow.
IMAGE_EXTENSIONS = (
    ".jpg",
    ".jpeg",
    ".png",
    ".bmp",
    ".gif",
    ".webp",
    ".tif",
    ".tiff",
    ".ppm",
    ".pgm",
    ".pbm",
    ".qoi",
)


class FileBytes(FilePaths):
    """The files at `paths` as a container: `len()`, and `[i]` reads file i's bytes."""

    def __init__(self, paths: Iterable[str | os.PathLike[str]]) -> None:
        self.paths = [os.fspath(p) for p in paths]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> bytes:
        return read_file(self.paths[i])

    def __repr__(self) -> str:
        return f"FileBytes({len(self.paths)} files)"


def files(paths: Iterable[str | os.PathLike[str]]) -> FileBytes:
    """The files at ``paths`` (str or ``os.PathLike``) as a container whose observation
    ``i`` is the bytes of file ``i``: what ``mapobs(Compose([DecodeImage(), ...]), ...)``
    decodes, reading each file natively in a loader; errors name the file. Nothing is
    read before an observation is asked for. Example, from a CSV of paths and labels::

        rows = list(csv.reader(open("train.csv")))
        images = fastload.files([path for path, _ in rows])
        labels = np.array([int(label) for _, label in rows])
        loader = DataLoader((mapobs(train, images), labels), 64, shuffle=True)
    """
    return FileBytes(paths)


def read_file(path: str | os.PathLike[str]) -> bytes:
    """The bytes of the regular file at ``path``. Raises ``OSError`` for anything else (a
    FIFO or a device would block or never end: the same rule as the native reader), and
    ``ValueError`` for a file over ``fastload.limits.MAX_FILE_BYTES``."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path}: not a regular file")
        limits.check_file_bytes(info.st_size, path)
        return f.read()


class ImageFolder:
    """`root/<class>/<file>` with classes in sorted order, labels 0..n-1 (int64).

    Files are listed recursively under each class folder, sorted, matched on `extensions`
    (case-insensitive); hidden files and folders (a name starting with ".", such as
    `.ipynb_checkpoints`) are left out. `images[i]` is the encoded bytes of file i
    (decode them with a transform such as `Compose([DecodeImage(), ...])`), `labels[i]`
    its class index, and `classes[labels[i]]` its class name. Raises FileNotFoundError
    when root is missing and ValueError when it holds no class folder, or a class folder
    holds no matching file (naming it: a class without images would shift no label, but
    is most likely a mistake).
    """

    def __init__(
        self, root: str | os.PathLike[str], extensions: Sequence[str] = IMAGE_EXTENSIONS
    ) -> None:
        self.root = os.fspath(root)
        if not os.path.isdir(self.root):
            raise FileNotFoundError(f"ImageFolder: no such directory: {self.root!r}")
        extensions = tuple(e.lower() for e in extensions)
        self.classes = sorted(
            e.name for e in os.scandir(self.root) if e.is_dir() and not e.name.startswith(".")
        )
        if not self.classes:
            raise ValueError(f"ImageFolder: no class subfolders in {self.root!r}")
        paths, labels = [], []
        for label, name in enumerate(self.classes):
            found = _files_under(os.path.join(self.root, name), extensions)
            if not found:
                raise ValueError(
                    f"ImageFolder: class folder {os.path.join(self.root, name)!r}"
                    f" holds no files with extensions {extensions}"
                )
            paths.extend(found)
            labels.extend([label] * len(found))
        self.images = FileBytes(paths)
        self.labels = np.asarray(labels, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def paths(self) -> list[str]:
        """The path of each image, in order (what errors name)."""
        return self.images.paths

    def __getitem__(self, i: int) -> tuple[bytes, np.int64]:
        """(bytes, label) of file i."""
        return self.images[i], self.labels[i]

    def __repr__(self) -> str:
        return f"ImageFolder({self.root!r}: {len(self)} images, {len(self.classes)} classes)"


def _files_under(folder: str, extensions: tuple[str, ...]) -> list[str]:
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found.extend(
            os.path.join(dirpath, f)
            for f in filenames
            if f.lower().endswith(extensions) and not f.startswith(".")
        )
    return sorted(found)
