# The declarations of rng.h that the binding uses.
from libc.stdint cimport uint64_t

cdef extern from "rng.h" nogil:
    ctypedef struct fl_rng:
        pass
    fl_rng fl_rng_for(uint64_t seed, uint64_t epoch, uint64_t index, uint64_t op)
    uint64_t fl_rng_next(fl_rng *r)
    double fl_rng_uniform(fl_rng *r)
