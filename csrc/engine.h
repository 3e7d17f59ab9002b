/* Batch jobs: fill the positions of one batch slot on the pool's threads.
 *
 * A job loads observation idx[k] into position k of each field's destination, for
 * k in [0, n). The jobs of one iterator share a group: a FIFO of submitted jobs, one lock
 * and condition, a cancel flag, and at most `max_tasks` pool tasks (the iterator's
 * threads). Each task claims items, `chunk` at a time, from the oldest job that has items
 * left, so one batch spreads over all the group's threads, the next batch starts as soon
 * as threads free up, and no more than `max_tasks` threads ever work for the group. */
#ifndef FASTLOAD_ENGINE_H
#define FASTLOAD_ENGINE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define FL_MAX_DIMS 16
#define FL_MESSAGE_BYTES 512

/* Scratch memory owned by one task while it runs; grown on demand, freed at its end.
 * A fill function gets FL_SCRATCH_REGIONS of them, to grow independently. */
#define FL_SCRATCH_REGIONS 2
typedef struct {
    void *data;
    size_t bytes;
} fl_scratch;

/* Returns scratch memory of at least `bytes`, or NULL when out of memory. */
void *fl_scratch_reserve(fl_scratch *s, size_t bytes);

struct fl_job;
struct fl_field;

/* Loads observation `index` of a field into `dst`. Returns 0, or nonzero after writing a
 * message into `message` (FL_MESSAGE_BYTES). Runs on a pool thread without the GIL. */
typedef int (*fl_fill_fn)(const struct fl_field *field, struct fl_job *job, int64_t pos,
                          int64_t index, char *dst, fl_scratch *scratch, char *message);

/* One field of an observation: a member of a tuple/dict, or the whole observation. */
typedef struct fl_field {
    fl_fill_fn fill;
    int64_t row_bytes;             /* bytes between positions in the destination */
    /* Gather from an array: observation `index` is at src + index*strides[0]. */
    const char *src;
    int ndim;                      /* of one observation */
    int64_t shape[FL_MAX_DIMS];
    int64_t strides[FL_MAX_DIMS + 1];
    int64_t itemsize;
    int contiguous;                /* one observation is one C-contiguous block */
    int64_t count;                 /* observations in the source, for a final check */
    /* Anything else: the kind's own state, and the binding's object for callbacks. */
    void *state;
    void *ctx;
    int number;                    /* the field's position in the observation */
} fl_field;

typedef struct fl_group {
    pthread_mutex_t lock;
    pthread_cond_t done;           /* signalled when a job finishes or a task exits */
    int cancel;                    /* set once: stop loading, skip what is left */
    /* Under `lock`: */
    struct fl_job *head, *tail;    /* jobs with items not yet claimed, oldest first */
    int tasks;                     /* pool tasks running for this group */
    int max_tasks;
    unsigned long generation;      /* the pool's (fl_pool_generation) when made */
} fl_group;

typedef struct fl_job {
    fl_group *group;
    const fl_field *fields;
    int nfields;
    char **dst;                    /* per field: the destination of position 0 */
    const int64_t *idx;
    int64_t n;
    uint64_t seed, epoch;
    int64_t chunk;                 /* items claimed at a time: >1 for cheap items */
    int skip_errors;               /* failed items are marked in `failed_items`, not fatal */
    uint8_t *failed_items;         /* n flags, when skip_errors */
    void *ctx;                     /* the binding's object for this job */
    /* Progress, under group->lock (`failed` is also read without it, atomically). */
    struct fl_job *queued_next;
    int64_t next;                  /* first item not yet claimed */
    int64_t done;                  /* items processed (or skipped) */
    int finished;
    int failed;                    /* a fatal error happened at `fail_pos` */
    int64_t fail_pos;
    int fail_field;
    int64_t skipped;
    char message[FL_MESSAGE_BYTES];
} fl_job;

int fl_group_init(fl_group *g);
/* Waits for the group's tasks to exit, then frees it. Call without the GIL. */
void fl_group_destroy(fl_group *g);
/* True in a forked child for a group made before the fork: its tasks ran on the parent's
 * threads, which do not exist here, so nothing of it may be waited for or locked. */
int fl_group_orphaned(const fl_group *g);
void fl_group_cancel(fl_group *g);
int fl_group_cancelled(const fl_group *g);

/* Reset `job` (whose inputs are set), queue it behind the group's other jobs, and make
 * sure up to `max_tasks` pool tasks work for the group. Returns 0, or -1 if no thread
 * could run it (the job is then finished and failed). */
int fl_job_submit(fl_job *job, int max_tasks);

/* Wait up to `timeout_s` (clamped to [0, 1e6]) for any of `jobs` to finish. Returns the
 * index of the first finished one in `jobs`, -1 on timeout, or -2 when the group is
 * orphaned (see fl_group_orphaned). Call without the GIL. */
int fl_wait_any(fl_group *g, fl_job *const *jobs, int njobs, double timeout_s);

/* Block until the job's tasks have all returned (after a cancel, promptly); returns at
 * once for an orphaned group. */
void fl_job_join(fl_job *job);

/* The gather kind: copies one observation of a strided array, byte for byte. */
int fl_fill_gather(const fl_field *field, fl_job *job, int64_t pos, int64_t index,
                   char *dst, fl_scratch *scratch, char *message);

#endif
