# The declarations of engine.h that the binding uses. Runs and fields are opaque handles;
# a slot is read, never written.
from libc.stdint cimport int64_t, uint8_t, uint64_t

from status cimport FL_MESSAGE_BYTES

cdef extern from "engine.h" nogil:
    enum: FL_MAX_DIMS
    ctypedef struct fl_scratch:
        void *data
        size_t bytes
    void fl_scratch_init(fl_scratch *s)
    void fl_scratch_release(fl_scratch *s)

    ctypedef struct fl_run:
        pass
    ctypedef struct fl_field:
        pass
    ctypedef struct fl_item:
        const fl_run *run
        int slot
        int64_t pos
        int64_t index
    ctypedef struct fl_slot:
        int64_t step
        int64_t rows
        int failed
        int64_t fail_pos
        int fail_field
        int fail_code
        int64_t skipped
        uint8_t *skipped_items
        char message[FL_MESSAGE_BYTES]
    ctypedef int (*fl_fill_fn)(const fl_field *field, const fl_item *item, char *dst,
                               fl_scratch *scratch, char *message)
    ctypedef void (*fl_prefetch_fn)(const fl_field *field, int64_t index)

    fl_field *fl_fields_create(int n)
    void fl_fields_destroy(fl_field *fields)
    int fl_field_set_gather(fl_field *fields, int f, const char *src, int ndim,
                            const int64_t *shape, const int64_t *strides, int64_t itemsize,
                            int64_t count, int contiguous, int64_t row_bytes)
    int fl_field_number(const fl_field *field)
    void fl_field_set_fill(fl_field *fields, int f, fl_fill_fn fill, fl_prefetch_fn prefetch,
                           void *state, int64_t row_bytes)

    fl_run *fl_run_create(const int64_t *order, const int64_t *bounds, int64_t end_item,
                          int64_t rows, int64_t first_step, int64_t end_step, uint64_t seed,
                          uint64_t epoch, const fl_field *fields, int nfields,
                          char *const *dst, int nslots, int parallel, int64_t claim_size,
                          int ordered, int skip_errors, void *ctx)
    int fl_run_next(fl_run *run, int release, double timeout_s)
    int fl_run_start(fl_run *run)
    void fl_run_go_inline(fl_run *run, int on)
    int fl_run_is_inline(const fl_run *run)
    void fl_run_cancel(fl_run *run)
    void fl_run_watch(fl_run *run, const int64_t *word, int64_t value)
    void fl_run_gate(fl_run *run, const int64_t *word, int64_t base)
    void fl_run_join(fl_run *run)
    void fl_run_destroy(fl_run *run)
    const fl_slot *fl_run_slot(const fl_run *run, int slot)
    void *fl_run_context(const fl_run *run)
