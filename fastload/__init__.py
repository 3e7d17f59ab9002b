"""fastload: keeps a training loop fed.

A data-container protocol (``numobs``, ``getobs``, ``getobs_into``), lazy views, and a
``DataLoader`` that loads in parallel on a native thread pool into reused batch buffers.
"""
from .codecs import build_info
from .errors import LoadError
from .imagefolder import files
from .loader import DataLoader, eachobs, eachobs_parallel
from .obs import getobs, getobs_into, numobs
from .storage import open, write
from .views import batchview, joinobs, kfolds, mapobs, obsview, randobs, shuffleobs, splitobs

__version__ = "0.1.0"

__all__ = [
    "DataLoader",
    "LoadError",
    "batchview",
    "build_info",
    "eachobs",
    "eachobs_parallel",
    "files",
    "getobs",
    "getobs_into",
    "joinobs",
    "kfolds",
    "mapobs",
    "numobs",
    "obsview",
    "open",
    "randobs",
    "shuffleobs",
    "splitobs",
    "write",
]
assert __all__ == sorted(__all__)
