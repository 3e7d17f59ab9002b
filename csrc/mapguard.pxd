# The declarations of mapguard.h that the binding uses.
from libc.stdint cimport uint64_t


cdef extern from "mapguard.h" nogil:
    int fl_guard_install()
    int fl_guard_add(const void *start, size_t size)
    void fl_guard_remove(int id)
    uint64_t fl_guard_faults(int id)
    uint64_t fl_guard_all_faults()
