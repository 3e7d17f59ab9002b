"""fastload: keeps a training loop fed.

A data-container protocol (``numobs``, ``getobs``, ``getobs_into``) over arrays, tensors,
tables and any sequence, lazy views and subsets after MLUtils.jl, and a
``DataLoader`` that loads in parallel on a native thread pool into reused batch buffers.
"""

from ._base.arguments import module_getattr
from ._base.version import __version__ as __version__
from ._images.codecs import build_info
from .errors import LoadError
from .imagefolder import files
from .loader import DataLoader, EpochLoader, eachobs, eachobs_parallel
from .mixtures import mix
from .obs import getobs, getobs_into, numobs
from .samplers import BucketBatchSampler, WeightedSampler
from .storage import open, write
from .streams import FileStream
from .subsets import (
    chunk,
    filterobs,
    group_counts,
    groupobs,
    kfolds,
    leavepout,
    oversample,
    splitobs,
    timeseries_kfolds,
    undersample,
)
from .views import batchview, joinobs, mapobs, obsview, randobs, shuffleobs, slidingwindow

__all__ = [
    "BucketBatchSampler",
    "DataLoader",
    "EpochLoader",
    "FileStream",
    "LoadError",
    "WeightedSampler",
    "batchview",
    "build_info",
    "chunk",
    "eachobs",
    "eachobs_parallel",
    "files",
    "filterobs",
    "getobs",
    "getobs_into",
    "group_counts",
    "groupobs",
    "joinobs",
    "kfolds",
    "leavepout",
    "mapobs",
    "mix",
    "numobs",
    "obsview",
    "open",
    "oversample",
    "randobs",
    "shuffleobs",
    "slidingwindow",
    "splitobs",
    "timeseries_kfolds",
    "undersample",
    "write",
]
assert __all__ == sorted(__all__)

# The names of 0.2, with a DeprecationWarning.
__getattr__ = module_getattr("fastload", {"Shards": "FileStream"}, globals())
