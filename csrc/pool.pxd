# The declarations of pool.h that the binding uses.
cdef extern from "pool.h" nogil:
    int fl_pool_size()
    int fl_pool_reserve(int n)
    int fl_pool_default_size()
    void fl_pool_shutdown()
