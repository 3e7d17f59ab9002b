# cython: language_level=3
"""The binding of fastload's C core (csrc/), one extension module: each C unit is compiled
once, into it. Declarations come from csrc/*.pxd, one per C header; C objects stay opaque
handles owned by the classes here, and addresses never cross into Python.

- the pool, runs of a schedule and the delivery loop (``_engine.pxi``);
- image kernels, batch mixes and compiled pipelines (``_kernels.pxi``);
- the QOI codec (``_qoi.pxi``);
- native image fields: decode and pipeline in C, item by item (``_imagesource.pxi``);
- guarded file maps, which a file shrinking under them cannot crash (``_mapguard.pxi``).
"""
import numpy as np

from fastload.errors import CoreError as _CoreError  # raised with the code of status.h

cimport numpy as cnp

cnp.import_array()

include "_engine.pxi"
include "_kernels.pxi"
include "_qoi.pxi"
include "_imagesource.pxi"
include "_mapguard.pxi"
