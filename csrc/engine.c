/* Runs of a schedule on the pool; see engine.h. */
#include "engine.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pool.h"

/* Steps one claim may span (claims of small steps take several at once). */
#define MAX_CLAIM_STEPS 64

typedef struct {
    int64_t first, last; /* items [first, last) of the schedule */
    int nsteps;
    int slots[MAX_CLAIM_STEPS]; /* the slot of each step the claim touches */
    int64_t counts[MAX_CLAIM_STEPS];
} claim;

void *fl_scratch_reserve(fl_scratch *s, size_t bytes) {
    if (s->bytes >= bytes) return s->data;
    void *p = realloc(s->data, bytes);
    if (!p) return NULL;
    s->data = p;
    s->bytes = bytes;
    return p;
}

static void scratch_free(fl_scratch *scratch) {
    for (int r = 0; r < FL_SCRATCH_REGIONS; r++) {
        free(scratch[r].data);
        scratch[r].data = NULL;
        scratch[r].bytes = 0;
    }
}

static int orphaned(const fl_run *r) { return r->generation != fl_pool_generation(); }

int fl_run_cancelled(const fl_run *r) {
    if (__atomic_load_n(&r->cancel, __ATOMIC_ACQUIRE)) return 1;
    return r->watch && __atomic_load_n(r->watch, __ATOMIC_ACQUIRE) != r->watch_value;
}

void fl_run_watch(fl_run *r, const int64_t *word, int64_t value) {
    r->watch = word;
    r->watch_value = value;
}

void fl_run_gate(fl_run *r, const int64_t *word, int64_t base) {
    r->gate = word;
    r->gate_base = base;
}

/* take_claim's answer when the next item is behind the gate. */
#define GATED         2
#define GATE_SLEEP_NS 200000L

/* The first item that may not be claimed yet (end_item without a gate). */
static int64_t gate_item(const fl_run *r) {
    if (!r->gate) return r->end_item;
    int64_t g = __atomic_load_n(r->gate, __ATOMIC_ACQUIRE) - r->gate_base;
    return g < r->end_item ? g : r->end_item;
}

/* Called under the lock by a thread that found the gate closed: sleep a little without it. */
static void wait_gate(fl_run *r) {
    struct timespec nap = {0, GATE_SLEEP_NS};
    pthread_mutex_unlock(&r->lock);
    nanosleep(&nap, NULL);
    pthread_mutex_lock(&r->lock);
}

/* The first item of step s. */
static inline int64_t step_first(const fl_run *r, int64_t s) {
    return r->bounds ? r->bounds[s] : s * r->rows;
}

/* Items of step s < end_step. Written so that no product passes end_item: `rows` may be
 * any positive int64. */
static int64_t step_rows(const fl_run *r, int64_t s) {
    if (r->bounds) return r->bounds[s + 1] - r->bounds[s];
    int64_t left = r->end_item - s * r->rows;
    return left < r->rows ? left : r->rows;
}

/* Whether `bounds` cuts items [bounds[0], bounds[steps]) into steps of 1 to `rows` items.
 * Any int64 may come in: each difference is taken only once it is known positive. */
static int bounds_fit(const int64_t *bounds, int64_t steps, int64_t rows) {
    if (bounds[0] < 0) return 0;
    for (int64_t s = 0; s < steps; s++)
        if (bounds[s + 1] <= bounds[s] || bounds[s + 1] - bounds[s] > rows) return 0;
    return 1;
}

static int init_sync(fl_run *r) {
    if (pthread_mutex_init(&r->lock, NULL) != 0) return FL_ENOMEM;
    /* Timed waits measure a monotonic clock: a step of the wall clock cannot stretch them. */
    pthread_condattr_t attr;
    int ok = pthread_condattr_init(&attr) == 0;
    ok = ok && pthread_condattr_setclock(&attr, CLOCK_MONOTONIC) == 0;
    int ready = ok && pthread_cond_init(&r->ready, &attr) == 0;
    int idle = ready && pthread_cond_init(&r->idle, NULL) == 0;
    if (ok) pthread_condattr_destroy(&attr);
    if (idle) return FL_OK;
    if (ready) pthread_cond_destroy(&r->ready);
    pthread_mutex_destroy(&r->lock);
    return FL_ENOMEM;
}

static void free_arrays(fl_run *r) {
    if (r->slots) {
        free(r->slots[0].dst);
        free(r->slots[0].skipped_items);
    }
    free(r->slots);
    free(r->free_slots);
    free(r->ready_queue);
    free(r->slot_of);
    free(r);
}

fl_run *fl_run_create(const int64_t *order, const int64_t *bounds, int64_t end_item, int64_t rows,
                      int64_t first_step, int64_t end_step, uint64_t seed, uint64_t epoch,
                      const fl_field *fields, int nfields, char *const *dst, int nslots,
                      int parallel, int64_t claim_size, int ordered, int skip_errors, void *ctx) {
    if (rows < 1 || nslots < 1 || nfields < 1 || first_step < 0 || end_step < 0 || end_item < 0)
        return NULL;
    if (bounds) {
        if (!bounds_fit(bounds, end_step, rows) || bounds[end_step] > end_item) return NULL;
        end_item = bounds[end_step];
    } else {
        /* Steps the order holds, computed so that nothing overflows for any rows. */
        int64_t steps = end_item / rows + (end_item % rows != 0);
        if (end_step >= steps)
            end_step = steps;
        else
            end_item = end_step * rows; /* less than end_item */
    }
    fl_run *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    if (first_step > end_step) first_step = end_step;
    r->order = order;
    r->bounds = bounds;
    r->end_item = end_item;
    r->rows = rows;
    r->first_step = first_step;
    r->end_step = end_step;
    r->seed = seed;
    r->epoch = epoch;
    r->fields = fields;
    r->nfields = nfields;
    r->nslots = nslots;
    r->parallel = parallel > 0 ? parallel : 0;
    /* Inline, one claim is one step; a claim never takes more than the slots it can use. */
    r->claim_size = r->parallel == 0 ? rows : (claim_size > 0 ? claim_size : 1);
    r->refill = r->parallel == 0 ? 1 : (nslots - 1) / 2 > 0 ? (nslots - 1) / 2 : 1;
    r->ordered = ordered;
    r->skip_errors = skip_errors;
    r->ctx = ctx;
    r->generation = fl_pool_generation();
    r->claim_step = first_step;
    r->claim_item = first_step < end_step ? step_first(r, first_step) : end_item;
    r->claim_slot = -1;
    r->next_step = first_step;
    r->slots = calloc((size_t)nslots, sizeof *r->slots);
    r->free_slots = calloc((size_t)nslots, sizeof(int));
    r->ready_queue = calloc((size_t)nslots, sizeof(int));
    r->slot_of = calloc((size_t)nslots, sizeof(int));
    char **dsts = r->slots ? calloc((size_t)nslots * (size_t)nfields, sizeof(char *)) : NULL;
    uint8_t *flags = r->slots && skip_errors ? calloc((size_t)nslots, (size_t)rows) : NULL;
    if (r->slots) r->slots[0].dst = dsts;
    if (r->slots) r->slots[0].skipped_items = flags;
    if (!r->slots || !r->free_slots || !r->ready_queue || !r->slot_of || !dsts ||
        (skip_errors && !flags) || init_sync(r) != FL_OK) {
        free_arrays(r);
        return NULL;
    }
    for (int s = 0; s < nslots; s++) {
        fl_slot *slot = &r->slots[s];
        slot->dst = dsts + (size_t)s * (size_t)nfields;
        memcpy(slot->dst, dst + (size_t)s * (size_t)nfields, (size_t)nfields * sizeof(char *));
        slot->skipped_items = flags ? flags + (size_t)s * (size_t)rows : NULL;
        slot->state = FL_SLOT_FREE;
        slot->step = -1;
        r->free_slots[nslots - 1 - s] = s; /* slot 0 is taken first */
    }
    r->nfree = nslots;
    return r;
}

/* Record the first fatal error of a slot's step, or (with skip_errors, unless `fatal`)
 * mark an item skipped and keep the first skip's message for the report. Called with the
 * run's lock held. */
static void item_failed(fl_slot *slot, int skip_errors, int64_t pos, int field, int code,
                        const char *message) {
    int first, fatal = code == FL_EINTERRUPT || code == FL_ECANCELLED;
    if (skip_errors && !fatal) {
        slot->skipped_items[pos] = 1;
        first = slot->skipped++ == 0;
    } else {
        first = !slot->failed;
        __atomic_store_n(&slot->failed, 1, __ATOMIC_RELEASE);
    }
    if (first) {
        slot->fail_pos = pos;
        slot->fail_field = field;
        slot->fail_code = code;
        snprintf(slot->message, sizeof slot->message, "%s", message);
    }
}

static void fail_item(fl_run *r, fl_slot *slot, int64_t pos, int field, int code,
                      const char *message) {
    pthread_mutex_lock(&r->lock);
    item_failed(slot, r->skip_errors, pos, field, code, message);
    pthread_mutex_unlock(&r->lock);
}

/* Items in random order wait on memory, not on the copy: asking for an item's memory a
 * few items ahead lets those misses overlap (the hardware cannot guess the order). */
#define PREFETCH_AHEAD 6
#define PREFETCH_LINES 8

void fl_prefetch_lines(const void *p, int64_t bytes) {
    int64_t lines = (bytes + 63) / 64;
    if (lines > PREFETCH_LINES) lines = PREFETCH_LINES;
    for (int64_t k = 0; k < lines; k++) __builtin_prefetch((const char *)p + 64 * k, 0, 0);
}

void fl_prefetch_gather(const fl_field *field, int64_t index) {
    if (field->contiguous && index >= 0 && index < field->count)
        fl_prefetch_lines(field->src + index * field->strides[0], field->row_bytes);
}

static void prefetch_item(const fl_run *r, int64_t index) {
    for (int f = 0; f < r->nfields; f++)
        if (r->fields[f].prefetch) r->fields[f].prefetch(&r->fields[f], index);
}

/* Loads positions [first, last) of the step in `slot_index`; returns after the first
 * fatal failure of that step. */
static void run_items(fl_run *r, int slot_index, int64_t first, int64_t last, fl_scratch *scratch) {
    fl_slot *slot = &r->slots[slot_index];
    const int64_t *order = r->order + step_first(r, slot->step);
    char message[FL_MESSAGE_BYTES];
    fl_item item = {r, slot_index, 0, 0};
    for (int64_t pos = first; pos < last; pos++) {
        if (pos + PREFETCH_AHEAD < last) prefetch_item(r, order[pos + PREFETCH_AHEAD]);
        if (__atomic_load_n(&slot->failed, __ATOMIC_ACQUIRE)) return;
        if (fl_run_cancelled(r)) {
            /* The step will not be complete: it must never pass for a loaded one. */
            fail_item(r, slot, pos, -1, FL_ECANCELLED, "loading was cancelled");
            return;
        }
        item.pos = pos;
        item.index = order[pos];
        for (int f = 0; f < r->nfields; f++) {
            const fl_field *field = &r->fields[f];
            message[0] = '\0';
            /* A field loaded by Python code may have no destination array. */
            char *dst = slot->dst[f] ? slot->dst[f] + pos * field->row_bytes : NULL;
            int rc = field->fill(field, &item, dst, scratch, message);
            if (rc != 0) {
                fail_item(r, slot, pos, f, rc, message);
                break;
            }
        }
    }
}

/* Give the next step a free slot; -1 when none is free. Under the lock. */
static int take_slot(fl_run *r, int64_t step) {
    if (r->nfree == 0) return -1;
    int s = r->free_slots[--r->nfree];
    fl_slot *slot = &r->slots[s];
    slot->state = FL_SLOT_LOADING;
    slot->step = step;
    slot->rows = step_rows(r, step);
    slot->done = 0;
    slot->failed = 0;
    slot->fail_pos = -1;
    slot->fail_field = -1;
    slot->skipped = 0;
    slot->message[0] = '\0';
    if (slot->skipped_items) memset(slot->skipped_items, 0, (size_t)r->rows);
    r->slot_of[step % r->nslots] = s;
    return s;
}

/* Claim up to `claim_size` items in schedule order, across steps while slots are free
 * (`task`: for a pool task, which claims nothing once the caller's thread loads; the
 * caller's thread claims the rest of one step), never past the gate. Returns 0 when
 * nothing can be claimed now, GATED when the next item is behind the gate. Under the
 * lock. */
static int take_claim(fl_run *r, claim *c, int task) {
    if (fl_run_cancelled(r) || (task && r->inline_now)) return 0;
    int64_t k = r->claim_item;
    c->first = k;
    c->nsteps = 0;
    if (k >= r->end_item) {
        c->last = k;
        return 0;
    }
    int64_t open = gate_item(r);
    if (k >= open) {
        c->last = k;
        return GATED;
    }
    /* Guided: a claim takes a share of what is left of the step (at least `claim_size`), so
     * a batch costs a few claims, and its last items still spread over the threads. */
    int64_t left = step_first(r, r->claim_step) + step_rows(r, r->claim_step) - k;
    int64_t share = r->parallel > 0 ? left / (2 * (int64_t)r->parallel) : left;
    /* Inline, a claim is the rest of one step. */
    int64_t want = !task ? left : share > r->claim_size ? share : r->claim_size;
    int64_t limit = want < open - k ? k + want : open;
    while (k < limit && c->nsteps < MAX_CLAIM_STEPS) {
        int64_t step = r->claim_step;
        if (r->claim_slot < 0 && (r->claim_slot = take_slot(r, step)) < 0) break;
        int64_t end = step_first(r, step) + r->slots[r->claim_slot].rows;
        int64_t stop = limit < end ? limit : end;
        c->slots[c->nsteps] = r->claim_slot;
        c->counts[c->nsteps++] = stop - k;
        k = stop;
        if (k == end) {
            r->claim_slot = -1;
            r->claim_step++;
        }
    }
    c->last = r->claim_item = k;
    return k > c->first;
}

static void run_claim(fl_run *r, const claim *c, fl_scratch *scratch) {
    int64_t k = c->first;
    for (int j = 0; j < c->nsteps; j++) {
        int64_t start = step_first(r, r->slots[c->slots[j]].step);
        run_items(r, c->slots[j], k - start, k - start + c->counts[j], scratch);
        k += c->counts[j];
    }
}

/* Count a claim's items done; a step whose items are all done is ready. Under the lock. */
static void finish_claim(fl_run *r, const claim *c) {
    int wake = 0;
    for (int j = 0; j < c->nsteps; j++) {
        fl_slot *slot = &r->slots[c->slots[j]];
        slot->done += c->counts[j];
        if (slot->done == slot->rows) {
            slot->state = FL_SLOT_READY;
            if (!r->ordered)
                r->ready_queue[((int64_t)r->ready_head + r->ready_count++) % r->nslots] =
                    c->slots[j];
            wake = 1;
        }
    }
    if (wake && r->waiting) pthread_cond_signal(&r->ready);
}

static void task(void *arg) {
    fl_run *r = arg;
    fl_scratch scratch[FL_SCRATCH_REGIONS] = {{NULL, 0}};
    claim c;
    pthread_mutex_lock(&r->lock);
    int got;
    while ((got = take_claim(r, &c, 1))) {
        if (got == GATED) {
            wait_gate(r);
            continue;
        }
        pthread_mutex_unlock(&r->lock);
        run_claim(r, &c, scratch);
        pthread_mutex_lock(&r->lock);
        finish_claim(r, &c);
    }
    if (--r->tasks == 0) pthread_cond_broadcast(&r->idle);
    pthread_mutex_unlock(&r->lock);
    scratch_free(scratch);
}

/* Items that could be claimed now. Under the lock. */
static int64_t claimable(const fl_run *r) {
    if (fl_run_cancelled(r)) return 0;
    int64_t left = r->end_item - r->claim_item;
    int64_t open = 0;
    if (r->claim_slot >= 0) {
        const fl_slot *s = &r->slots[r->claim_slot];
        open = s->rows - (r->claim_item - step_first(r, s->step));
    }
    /* The free slots' rows, unless they pass what is left (their product may not fit). */
    if (open >= left || (r->nfree > 0 && r->rows > (left - open) / r->nfree)) return left;
    return open + (int64_t)r->nfree * r->rows;
}

/* Start tasks for the claimable items, up to `parallel`. Returns -1 when none runs and
 * none could start although there is work. Under the lock. */
static int start_tasks(fl_run *r) {
    if (r->inline_now) return 0;
    int64_t work = claimable(r);
    int64_t useful = work / r->claim_size + (work % r->claim_size != 0);
    while (r->tasks < r->parallel && r->tasks < useful) {
        if (fl_pool_submit(task, r) != 0) break;
        r->tasks++;
    }
    return r->tasks == 0 && work > 0 ? -1 : 0;
}

static void release_slot(fl_run *r, int s) {
    if (s < 0 || s >= r->nslots || r->slots[s].state != FL_SLOT_HELD) return;
    r->slots[s].state = FL_SLOT_FREE;
    r->free_slots[r->nfree++] = s;
    /* Idle tasks restart once enough slots are free to be worth the wake-up. */
    if (r->parallel > 0 && r->tasks < r->parallel && r->nfree >= r->refill) start_tasks(r);
}

/* The slot of the next step to deliver if it is ready, else -1. Under the lock. */
static int ready_slot(fl_run *r) {
    int s;
    if (r->ordered) {
        if (r->next_step >= r->end_step || r->claim_item <= step_first(r, r->next_step)) return -1;
        s = r->slot_of[r->next_step % r->nslots];
        if (r->slots[s].state != FL_SLOT_READY) return -1;
        r->next_step++;
    } else {
        if (r->ready_count == 0) return -1;
        s = r->ready_queue[r->ready_head];
        r->ready_head = (r->ready_head + 1) % r->nslots;
        r->ready_count--;
    }
    r->slots[s].state = FL_SLOT_HELD;
    r->delivered++;
    return s;
}

static struct timespec deadline_after(double timeout_s) {
    if (!(timeout_s >= 0)) timeout_s = 0; /* negative or NaN */
    if (timeout_s > 1e6) timeout_s = 1e6;
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    long long whole = (long long)timeout_s;
    long long ns = until.tv_nsec + (long long)((timeout_s - (double)whole) * 1e9);
    until.tv_sec += (time_t)(whole + ns / 1000000000LL);
    until.tv_nsec = (long)(ns % 1000000000LL);
    return until;
}

/* The inline run: the caller's thread loads the next step itself. */
static int next_inline(fl_run *r, int release) {
    claim c;
    pthread_mutex_lock(&r->lock);
    release_slot(r, release);
    for (;;) {
        int s = fl_run_cancelled(r) ? FL_ECANCELLED : ready_slot(r);
        int got = s != -1 || r->delivered == r->end_step - r->first_step ? 0 : take_claim(r, &c, 0);
        if (got == GATED) {
            wait_gate(r);
            continue;
        }
        if (!got) {
            pthread_mutex_unlock(&r->lock);
            if (s != -1) return s;
            return r->delivered < r->end_step - r->first_step ? FL_ECANCELLED : FL_DONE;
        }
        pthread_mutex_unlock(&r->lock);
        run_claim(r, &c, r->scratch);
        pthread_mutex_lock(&r->lock);
        finish_claim(r, &c);
    }
}

/* The caller's thread claims and loads the next items itself. Returns 1 when it loaded
 * some, 0 when nothing is left to claim. Under the lock (released while loading). */
static int load_inline(fl_run *r) {
    claim c;
    int got = take_claim(r, &c, 0);
    if (got == GATED) {
        wait_gate(r);
        return 1;
    }
    if (!got) return 0;
    pthread_mutex_unlock(&r->lock);
    run_claim(r, &c, r->scratch);
    pthread_mutex_lock(&r->lock);
    finish_claim(r, &c);
    return 1;
}

int fl_run_next(fl_run *r, int release, double timeout_s) {
    if (orphaned(r)) return FL_EFORKED;
    if (r->parallel == 0) return next_inline(r, release);
    struct timespec until;
    int s = -1, timed = 0;
    pthread_mutex_lock(&r->lock);
    release_slot(r, release);
    for (;;) {
        if (fl_run_cancelled(r)) {
            s = FL_ECANCELLED;
            break;
        }
        if ((s = ready_slot(r)) >= 0) break;
        if (r->delivered == r->end_step - r->first_step) {
            s = FL_DONE;
            break;
        }
        if (r->inline_now) {
            if (load_inline(r)) continue;
            if (r->tasks == 0) { /* nothing to claim, no task to finish a step: stopped */
                s = FL_ECANCELLED;
                break;
            }
        } else if (start_tasks(r) != 0) {
            s = FL_ETHREADS;
            break;
        }
        if (!timed) { /* the deadline counts from the first wait: a step loaded inline is */
            until = deadline_after(timeout_s); /* not waited for */
            timed = 1;
        }
        r->waiting = 1;
        int rc = pthread_cond_timedwait(&r->ready, &r->lock, &until);
        r->waiting = 0;
        if (rc != 0 && rc != EINTR) {
            s = FL_ETIMEOUT;
            break;
        } /* timed out (or cannot wait) */
    }
    pthread_mutex_unlock(&r->lock);
    return s;
}

void fl_run_go_inline(fl_run *r, int on) {
    if (r->parallel == 0 || orphaned(r)) return;
    pthread_mutex_lock(&r->lock);
    __atomic_store_n(&r->inline_now, on != 0, __ATOMIC_RELAXED);
    /* Back on the pool: tasks start for what can be claimed (the next fl_run_next would). */
    if (!on && !fl_run_cancelled(r)) start_tasks(r);
    pthread_mutex_unlock(&r->lock);
}

int fl_run_is_inline(const fl_run *r) {
    return r->parallel == 0 || __atomic_load_n(&r->inline_now, __ATOMIC_RELAXED);
}

int fl_run_start(fl_run *r) {
    if (orphaned(r) || r->parallel == 0) return FL_OK;
    pthread_mutex_lock(&r->lock);
    int rc = fl_run_cancelled(r) ? 0 : start_tasks(r);
    pthread_mutex_unlock(&r->lock);
    return rc != 0 ? FL_ETHREADS : FL_OK;
}

void fl_run_cancel(fl_run *r) {
    __atomic_store_n(&r->cancel, 1, __ATOMIC_RELEASE);
    if (orphaned(r)) return; /* its lock may be held by a thread gone with the fork */
    pthread_mutex_lock(&r->lock);
    pthread_cond_broadcast(&r->ready);
    pthread_mutex_unlock(&r->lock);
}

void fl_run_join(fl_run *r) {
    fl_run_cancel(r);
    if (orphaned(r)) return;
    pthread_mutex_lock(&r->lock);
    while (r->tasks > 0) pthread_cond_wait(&r->idle, &r->lock);
    pthread_mutex_unlock(&r->lock);
}

void fl_run_destroy(fl_run *r) {
    if (!r) return;
    fl_run_join(r);
    if (!orphaned(r)) {
        pthread_cond_destroy(&r->ready);
        pthread_cond_destroy(&r->idle);
        pthread_mutex_destroy(&r->lock);
    }
    scratch_free(r->scratch);
    free_arrays(r);
}

/* Copy the strided n-d block at `src` (dims `shape`, byte strides `strides`) to `dst`,
 * C-contiguous. The innermost dimension is copied with memcpy when it is contiguous. */
static void copy_strided(char *dst, const char *src, int ndim, const int64_t *shape,
                         const int64_t *strides, int64_t itemsize) {
    if (ndim == 0) {
        memcpy(dst, src, (size_t)itemsize);
        return;
    }
    if (ndim == 1) {
        if (strides[0] == itemsize) {
            memcpy(dst, src, (size_t)(shape[0] * itemsize));
        } else {
            for (int64_t i = 0; i < shape[0]; i++)
                memcpy(dst + i * itemsize, src + i * strides[0], (size_t)itemsize);
        }
        return;
    }
    int64_t inner = itemsize;
    for (int d = 1; d < ndim; d++) inner *= shape[d];
    for (int64_t i = 0; i < shape[0]; i++)
        copy_strided(dst + i * inner, src + i * strides[0], ndim - 1, shape + 1, strides + 1,
                     itemsize);
}

void fl_scratch_init(fl_scratch *s) {
    s->data = NULL;
    s->bytes = 0;
}

void fl_scratch_release(fl_scratch *s) {
    free(s->data);
    fl_scratch_init(s);
}

fl_field *fl_fields_create(int n) {
    if (n < 1) return NULL;
    fl_field *fields = calloc((size_t)n, sizeof *fields);
    if (fields)
        for (int f = 0; f < n; f++) fields[f].number = f;
    return fields;
}

void fl_fields_destroy(fl_field *fields) { free(fields); }

int fl_field_set_gather(fl_field *fields, int f, const char *src, int ndim, const int64_t *shape,
                        const int64_t *strides, int64_t itemsize, int64_t count, int contiguous,
                        int64_t row_bytes) {
    if (ndim < 0 || ndim > FL_MAX_DIMS) return FL_EINVAL;
    fl_field *field = &fields[f];
    field->fill = fl_fill_gather;
    field->prefetch = fl_prefetch_gather;
    field->src = src;
    field->ndim = ndim;
    field->itemsize = itemsize;
    field->count = count;
    field->contiguous = contiguous != 0;
    field->row_bytes = row_bytes;
    field->strides[0] = strides[0];
    for (int d = 0; d < ndim; d++) {
        field->shape[d] = shape[d];
        field->strides[d + 1] = strides[d + 1];
    }
    return FL_OK;
}

void fl_field_set_fill(fl_field *fields, int f, fl_fill_fn fill, fl_prefetch_fn prefetch,
                       void *state, int64_t row_bytes) {
    fields[f].fill = fill;
    fields[f].prefetch = prefetch;
    fields[f].state = state;
    fields[f].row_bytes = row_bytes;
}

int fl_field_number(const fl_field *field) { return field->number; }

const fl_slot *fl_run_slot(const fl_run *r, int slot) { return &r->slots[slot]; }

void *fl_run_context(const fl_run *r) { return r->ctx; }

int fl_fill_gather(const fl_field *field, const fl_item *item, char *dst, fl_scratch *scratch,
                   char *message) {
    (void)scratch;
    int64_t index = item->index;
    if (index < 0 || index >= field->count) {
        snprintf(message, FL_MESSAGE_BYTES, "index %lld is out of range for %lld observations",
                 (long long)index, (long long)field->count);
        return FL_EINVAL;
    }
    const char *src = field->src + index * field->strides[0];
    if (field->contiguous)
        memcpy(dst, src, (size_t)field->row_bytes);
    else
        copy_strided(dst, src, field->ndim, field->shape, field->strides + 1, field->itemsize);
    return FL_OK;
}
