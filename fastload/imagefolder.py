"""ImageFolder: a directory of class subfolders as an (images, labels) container."""
import os

import numpy as np

__all__ = ["ImageFolder"]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".webp", ".qoi")


class FileBytes:
    """The files at `paths` as a container: `len()`, and `[i]` reads file i's bytes."""

    def __init__(self, paths):
        self.paths = list(paths)

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with open(self.paths[i], "rb") as f:
            return f.read()

    def __repr__(self):
        return f"FileBytes({len(self.paths)} files)"


class ImageFolder:
    """`root/<class>/<file>` with classes in sorted order, labels 0..n-1 (int64).

    Files are listed recursively under each class folder, sorted, matched on `extensions`
    (case-insensitive). `images[i]` is the encoded bytes of file i (decode them with a
    transform such as `Compose([DecodeJPEG(), ...])`), `labels[i]` its class index, and
    `classes[labels[i]]` its class name. Raises FileNotFoundError when root is missing and
    ValueError when it holds no class folder or no matching file.
    """

    def __init__(self, root, extensions=IMAGE_EXTENSIONS):
        self.root = os.fspath(root)
        if not os.path.isdir(self.root):
            raise FileNotFoundError(f"ImageFolder: no such directory: {self.root!r}")
        extensions = tuple(e.lower() for e in extensions)
        self.classes = sorted(e.name for e in os.scandir(self.root) if e.is_dir())
        if not self.classes:
            raise ValueError(f"ImageFolder: no class subfolders in {self.root!r}")
        paths, labels = [], []
        for label, name in enumerate(self.classes):
            for path in _files_under(os.path.join(self.root, name), extensions):
                paths.append(path)
                labels.append(label)
        if not paths:
            raise ValueError(f"ImageFolder: no files with extensions {extensions} under "
                             f"{self.root!r}")
        self.images = FileBytes(paths)
        self.labels = np.asarray(labels, dtype=np.int64)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        """(bytes, label) of file i."""
        return self.images[i], self.labels[i]

    def __repr__(self):
        return (f"ImageFolder({self.root!r}: {len(self)} images, "
                f"{len(self.classes)} classes)")


def _files_under(folder, extensions):
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        found.extend(os.path.join(dirpath, f) for f in filenames
                     if f.lower().endswith(extensions))
    return sorted(found)
