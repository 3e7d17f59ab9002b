/* The engine's native half: one iteration ("run") of a schedule into a ring of slots.
 *
 * A schedule is an order of observation indices cut into steps: of `rows` items each (the
 * last one may be shorter), or at the offsets `bounds` (step s is items [bounds[s],
 * bounds[s+1]), at most `rows` of them: batches of different sizes). A run loads steps
 * [first_step, end_step) of it into `nslots` slots of `rows` positions: the items of
 * step s are order[first(s) + pos], and item pos of a step is written at
 * dst[slot][field] + pos * row_bytes for each field.
 *
 *   consumer                        pool tasks (at most `parallel` at once)
 *   --------                        ---------------------------------------
 *   fl_run_next(release=held) ----> claim items in schedule order, `claim_size` at a time;
 *     frees the held slot            a step takes a free slot when its first item is
 *     waits for the next step        claimed; the last item done makes the step ready
 *     returns its slot     <-------- and wakes the consumer if it waits
 *
 * Slot life cycle: FREE -> LOADING (a step took it) -> READY (all its items done) ->
 * HELD (handed to the consumer) -> FREE (released by the next fl_run_next). Only the
 * tasks write into a LOADING slot; only the consumer reads a HELD one; a run is
 * destroyed only after fl_run_join, so no task writes into memory the binding freed.
 *
 * Flags read without the lock (`cancel`, a slot's `failed`) use the GCC/Clang `__atomic`
 * builtins, acquire/release.
 *
 * With `parallel == 0` the run is inline: fl_run_next loads the next step in the
 * caller's thread with the same claim and completion code, and nothing else runs. */
#ifndef FASTLOAD_ENGINE_H
#define FASTLOAD_ENGINE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define FL_MAX_DIMS 16

/* Scratch memory owned by one task while it runs; grown on demand, freed at its end.
 * A fill function gets FL_SCRATCH_REGIONS of them, to grow independently. */
#define FL_SCRATCH_REGIONS 2
typedef struct {
    void *data;
    size_t bytes;
} fl_scratch;

/* Returns scratch memory of at least `bytes`, or NULL when out of memory. */
void *fl_scratch_reserve(fl_scratch *s, size_t bytes);

/* An empty scratch; and freeing one's memory, leaving it empty. */
void fl_scratch_init(fl_scratch *s);
void fl_scratch_release(fl_scratch *s);

struct fl_run;
struct fl_field;

/* The item being loaded: which run (for its seed and epoch), slot and position in the
 * step, and the observation's index in the container. */
typedef struct fl_item {
    const struct fl_run *run;
    int slot;
    int64_t pos;
    int64_t index;
} fl_item;

/* Loads observation item->index of a field into `dst`. Returns FL_OK, or a negative code
 * after writing a message into `message` (FL_MESSAGE_BYTES): FL_EINTERRUPT when the step
 * must fail even where failed items are skipped. Runs without the GIL. */
typedef int (*fl_fill_fn)(const struct fl_field *field, const fl_item *item, char *dst,
                          fl_scratch *scratch, char *message);

/* Asks for the memory that loading observation `index` will read, a few items ahead of
 * loading it (a hint: it neither blocks nor faults). */
typedef void (*fl_prefetch_fn)(const struct fl_field *field, int64_t index);

/* One field of an observation: a member of a tuple/dict, or the whole observation. */
typedef struct fl_field {
    fl_fill_fn fill;
    fl_prefetch_fn prefetch; /* or NULL */
    int64_t row_bytes;       /* bytes between positions in the destination */
    /* Gather from an array: observation `index` is at src + index*strides[0]. */
    const char *src;
    int ndim; /* of one observation */
    int64_t shape[FL_MAX_DIMS];
    int64_t strides[FL_MAX_DIMS + 1];
    int64_t itemsize;
    int contiguous; /* one observation is one C-contiguous block */
    int64_t count;  /* observations in the source, for a final check */
    /* Anything else: the kind's own state. */
    void *state;
    int number; /* the field's position in the observation */
} fl_field;

/* n fields, each loading nothing until one of the setters below makes it load; numbered
 * 0 .. n - 1. NULL when out of memory. Free with fl_fields_destroy. */
fl_field *fl_fields_create(int n);
void fl_fields_destroy(fl_field *fields);

/* Field f gathers from an array: observation i is at src + i * strides[0]; it has `ndim`
 * dimensions `shape`, strides strides[1 .. ndim], and is one C-contiguous block when
 * `contiguous`. The array holds `count` observations. FL_EINVAL for more than FL_MAX_DIMS
 * dimensions. */
int fl_field_set_gather(fl_field *fields, int f, const char *src, int ndim, const int64_t *shape,
                        const int64_t *strides, int64_t itemsize, int64_t count, int contiguous,
                        int64_t row_bytes);

/* Field f loads through `fill` (and `prefetch`, or NULL), with `state` as its state. */
void fl_field_set_fill(fl_field *fields, int f, fl_fill_fn fill, fl_prefetch_fn prefetch,
                       void *state, int64_t row_bytes);

/* The field's position in the observation. */
int fl_field_number(const fl_field *field);

enum { FL_SLOT_FREE, FL_SLOT_LOADING, FL_SLOT_READY, FL_SLOT_HELD };

typedef struct fl_slot {
    char **dst;             /* per field: position 0 of this slot */
    uint8_t *skipped_items; /* `rows` flags, when skip_errors */
    /* Under the run's lock (`failed` is also read without it, atomically). */
    int state;
    int64_t step;
    int64_t rows; /* items of its step */
    int64_t done; /* items processed (or skipped) */
    int failed;   /* a fatal error happened at `fail_pos` */
    int64_t fail_pos;
    int fail_field;
    int fail_code; /* the first failure's code (status.h): FL_EINTERRUPT for Ctrl-C */
    int64_t skipped;
    char message[FL_MESSAGE_BYTES];
} fl_slot;

typedef struct fl_run {
    /* The schedule, the fields and the options: set by fl_run_create, then read only. */
    const int64_t *order;
    const int64_t *bounds; /* the first item of each step (and the end), or NULL */
    int64_t rows, first_step, end_step, end_item;
    uint64_t seed, epoch;
    const fl_field *fields;
    int nfields;
    int nslots;
    fl_slot *slots;
    int parallel;       /* most pool tasks at once; 0: inline */
    int64_t claim_size; /* items claimed at a time */
    int refill;         /* free slots that restart idle tasks */
    int ordered;
    int skip_errors;
    void *ctx;                /* the binding's object, for Python fields */
    unsigned long generation; /* the pool's (fl_pool_generation) when made */
    pthread_mutex_t lock;
    pthread_cond_t ready; /* a step became ready, the run was cancelled */
    pthread_cond_t idle;  /* the last task exited */
    int cancel;           /* set once: stop loading (atomic) */
    const int64_t *watch; /* or NULL: cancelled once *watch != watch_value */
    int64_t watch_value;
    const int64_t *gate; /* or NULL: items from *gate - gate_base on wait (atomic) */
    int64_t gate_base;
    fl_scratch scratch[FL_SCRATCH_REGIONS]; /* the inline run's */
    /* Under `lock`: */
    int64_t claim_item;     /* next item to claim */
    int64_t claim_step;     /* the step of claim_item */
    int claim_slot;         /* the slot of claim_item's step, -1 before it has one */
    int *free_slots, nfree; /* a stack */
    int *ready_queue;       /* completed steps' slots, oldest first (unordered) */
    int ready_head, ready_count;
    int *slot_of;      /* slot of step s at s % nslots (ordered) */
    int64_t next_step; /* the next step to deliver (ordered) */
    int64_t delivered;
    int tasks;
    int waiting; /* the consumer waits on `ready` */
    /* The caller's thread loads the steps now, the tasks claim nothing more
     * (fl_run_go_inline). Written under `lock`, read also without it, atomically. */
    int inline_now;
} fl_run;

/* A run of steps [first_step, end_step) of `order` (end_item items in all) into `nslots`
 * slots whose destinations are dst[slot * nfields + field]. `bounds` (NULL: steps of
 * `rows` items) holds end_step + 1 offsets into `order`, each step 1 to `rows` items.
 * Returns NULL when out of memory or for bounds that do not fit. Nothing starts until
 * the first fl_run_next. `order` and `bounds` are checked here and read until the run is
 * destroyed: they must not change meanwhile (the binding hands C copies of its own). */
fl_run *fl_run_create(const int64_t *order, const int64_t *bounds, int64_t end_item, int64_t rows,
                      int64_t first_step, int64_t end_step, uint64_t seed, uint64_t epoch,
                      const fl_field *fields, int nfields, char *const *dst, int nslots,
                      int parallel, int64_t claim_size, int ordered, int skip_errors, void *ctx);

/* Release slot `release` (-1: none), then wait up to `timeout_s` for the next step to
 * deliver (ordered: the next in order; else the first to finish). Returns its slot, now
 * HELD; FL_DONE when every step was delivered; FL_ETIMEOUT; FL_ECANCELLED; FL_EFORKED
 * when the run was made before this process forked; FL_ETHREADS when no thread could
 * start. Call without the GIL unless the run is inline with no Python field. */
int fl_run_next(fl_run *run, int release, double timeout_s);

/* `on`: from the next fl_run_next on, the caller's thread loads the run's remaining steps
 * itself, and the pool's tasks claim nothing more (what they claimed they finish); not
 * `on`: back to the pool's tasks. Any time, from the caller's thread; does nothing inline.
 * What a caller that measured which of the two costs it less uses. */
void fl_run_go_inline(fl_run *run, int on);

/* Whether the caller's thread loads the run now (inline, or fl_run_go_inline). Lock-free. */
int fl_run_is_inline(const fl_run *run);

/* Start loading on the pool now, without waiting (the first fl_run_next starts it
 * otherwise). Returns FL_OK, or FL_ETHREADS when no thread could start; does nothing
 * inline. */
int fl_run_start(fl_run *run);

/* Stop loading: claimed items finish, nothing new is claimed; wakes a waiting consumer. */
void fl_run_cancel(fl_run *run);
int fl_run_cancelled(const fl_run *run);

/* The run counts as cancelled once the word at `word` no longer holds `value` (read
 * atomically between items): a word in memory shared with another process, which stops
 * a worker process's inline run without a message. Call before the first fl_run_next. */
void fl_run_watch(fl_run *run, const int64_t *word, int64_t value);

/* Items of the run from `*word - base` on are not claimed until the word (read atomically,
 * written by another thread or process) grows past them: what holds a run back while the
 * data of its next items is being fetched. A task or caller that finds the next item
 * behind the gate sleeps a little and looks again (cancelling still stops it). The
 * caller of fl_run_next must not hold what the gate's writer needs (Python's GIL, for a
 * writer in Python). Call before the first fl_run_next. */
void fl_run_gate(fl_run *run, const int64_t *word, int64_t base);

/* Cancel, then wait until every task of the run has exited. Call without the GIL. */
void fl_run_join(fl_run *run);

/* Join, then free the run. */
void fl_run_destroy(fl_run *run);

/* A slot of the run, to read what its step loaded (HELD: handed to the consumer). */
const fl_slot *fl_run_slot(const fl_run *run, int slot);

/* The `ctx` the run was made with. */
void *fl_run_context(const fl_run *run);

/* The gather kind: copies one observation of a strided array, byte for byte. */
int fl_fill_gather(const fl_field *field, const fl_item *item, char *dst, fl_scratch *scratch,
                   char *message);
void fl_prefetch_gather(const fl_field *field, int64_t index);

/* Prefetches the first `bytes` (at most 8 cache lines) at `p`. */
void fl_prefetch_lines(const void *p, int64_t bytes);

#endif
