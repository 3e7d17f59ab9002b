"""Packed datasets: an Arrow IPC file with fastload's field encodings in its metadata.

``write`` encodes a container to a file, ``open`` maps one (or a directory of files)
back as a container; ``DataLoader(..., shuffle="quasi")`` reads it in a block-local order
(``fastload.order``). pyarrow is imported only when a file is written or opened.
"""

from fastload._storage.fields import JPEG, QOI, Bytes, NDArray, Raw, Scalar, Smart, Str
from fastload.storage.reader import Dataset, open
from fastload.storage.writer import write

__all__ = [
    "Bytes",
    "Dataset",
    "JPEG",
    "NDArray",
    "QOI",
    "Raw",
    "Scalar",
    "Smart",
    "Str",
    "open",
    "write",
]
assert __all__ == sorted(__all__)
