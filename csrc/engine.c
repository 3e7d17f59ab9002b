/* Batch jobs on the pool; see engine.h. */
#include "engine.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pool.h"

void *fl_scratch_reserve(fl_scratch *s, size_t bytes) {
    if (s->bytes >= bytes) return s->data;
    void *p = realloc(s->data, bytes);
    if (!p) return NULL;
    s->data = p;
    s->bytes = bytes;
    return p;
}

int fl_group_init(fl_group *g) {
    g->cancel = 0;
    g->head = g->tail = NULL;
    g->tasks = 0;
    g->max_tasks = 1;
    g->generation = fl_pool_generation();
    if (pthread_mutex_init(&g->lock, NULL) != 0) return -1;
    /* Timed waits measure a monotonic clock: a step of the wall clock cannot stretch them. */
    pthread_condattr_t attr;
    int ok = pthread_condattr_init(&attr) == 0;
    ok = ok && pthread_condattr_setclock(&attr, CLOCK_MONOTONIC) == 0;
    ok = ok && pthread_cond_init(&g->done, &attr) == 0;
    pthread_condattr_destroy(&attr);
    if (!ok) {
        pthread_mutex_destroy(&g->lock);
        return -1;
    }
    return 0;
}

int fl_group_orphaned(const fl_group *g) {
    return g->generation != fl_pool_generation();
}

void fl_group_destroy(fl_group *g) {
    fl_group_cancel(g);
    if (fl_group_orphaned(g)) return;   /* its lock may be held by a thread gone with the fork */
    pthread_mutex_lock(&g->lock);
    while (g->tasks > 0) pthread_cond_wait(&g->done, &g->lock);
    pthread_mutex_unlock(&g->lock);
    pthread_cond_destroy(&g->done);
    pthread_mutex_destroy(&g->lock);
}

void fl_group_cancel(fl_group *g) {
    __atomic_store_n(&g->cancel, 1, __ATOMIC_RELEASE);
}

int fl_group_cancelled(const fl_group *g) {
    return __atomic_load_n(&g->cancel, __ATOMIC_ACQUIRE);
}

/* Record the first fatal error of a job, or (with skip_errors, unless `fatal`) mark an
 * item skipped and keep the first skip's message for the report. Called with the group's
 * lock held. */
static void item_failed(fl_job *job, int64_t pos, int field, const char *message, int fatal) {
    int first;
    if (job->skip_errors && !fatal) {
        job->failed_items[pos] = 1;
        first = job->skipped++ == 0;
    } else {
        first = !job->failed;
        __atomic_store_n(&job->failed, 1, __ATOMIC_RELEASE);
    }
    if (first) {
        job->fail_pos = pos;
        job->fail_field = field;
        snprintf(job->message, sizeof job->message, "%s", message);
    }
}

/* Loads items [first, last) of `job`; returns after the first fatal failure. */
static void run_items(fl_job *job, int64_t first, int64_t last, fl_scratch *scratch) {
    char message[FL_MESSAGE_BYTES];
    for (int64_t k = first; k < last; k++) {
        if (__atomic_load_n(&job->failed, __ATOMIC_ACQUIRE)) return;
        if (fl_group_cancelled(job->group)) {
            /* The job will not be complete: it must never pass for a loaded batch. */
            pthread_mutex_lock(&job->group->lock);
            item_failed(job, k, -1, "loading was cancelled", 1);
            pthread_mutex_unlock(&job->group->lock);
            return;
        }
        for (int f = 0; f < job->nfields; f++) {
            const fl_field *field = &job->fields[f];
            message[0] = '\0';
            char *dst = job->dst[f] + k * field->row_bytes;
            if (field->fill(field, job, k, job->idx[k], dst, scratch, message) != 0) {
                pthread_mutex_lock(&job->group->lock);
                item_failed(job, k, f, message, 0);
                pthread_mutex_unlock(&job->group->lock);
                break;
            }
        }
    }
}

/* A pool task working for a group: claims items of the oldest queued job until no job
 * has items left, then exits. */
static void group_task(void *arg) {
    fl_group *g = arg;
    fl_scratch scratch[FL_SCRATCH_REGIONS] = {{NULL, 0}};
    pthread_mutex_lock(&g->lock);
    for (fl_job *job; (job = g->head) != NULL;) {
        int64_t first = job->next;
        int64_t last = first + (job->chunk > 0 ? job->chunk : 1);
        if (last >= job->n) {
            last = job->n;
            g->head = job->queued_next;         /* fully claimed: leaves the queue */
            if (!g->head) g->tail = NULL;
        }
        job->next = last;
        pthread_mutex_unlock(&g->lock);
        run_items(job, first, last, scratch);
        pthread_mutex_lock(&g->lock);
        job->done += last - first;
        if (job->done == job->n) {
            job->finished = 1;
            pthread_cond_broadcast(&g->done);
        }
    }
    g->tasks--;
    pthread_cond_broadcast(&g->done);
    pthread_mutex_unlock(&g->lock);
    for (int r = 0; r < FL_SCRATCH_REGIONS; r++) free(scratch[r].data);
}

int fl_job_submit(fl_job *job, int max_tasks) {
    fl_group *g = job->group;
    if (fl_group_orphaned(g)) {
        job->failed = 1;
        job->finished = 1;
        snprintf(job->message, sizeof job->message,
                 "a loader's iteration cannot go on in a forked child; start a new one");
        return -1;
    }
    job->next = 0;
    job->done = 0;
    job->failed = 0;
    job->fail_pos = -1;
    job->fail_field = -1;
    job->skipped = 0;
    job->message[0] = '\0';
    job->queued_next = NULL;
    if (job->skip_errors) memset(job->failed_items, 0, (size_t)job->n);
    pthread_mutex_lock(&g->lock);
    job->finished = job->n == 0;
    if (job->n > 0) {
        if (g->tail) g->tail->queued_next = job; else g->head = job;
        g->tail = job;
    }
    g->max_tasks = max_tasks > 0 ? max_tasks : 1;
    while (g->tasks < g->max_tasks && g->head) {
        if (fl_pool_submit(group_task, g) != 0) break;
        g->tasks++;
    }
    int rc = 0;
    if (g->tasks == 0 && g->head) {
        /* No thread will ever claim the queued items: fail what is queued. */
        for (fl_job *q = g->head; q; q = q->queued_next) {
            q->failed = 1;
            snprintf(q->message, sizeof q->message, "could not start native threads");
            q->done = q->n;
            q->finished = 1;
        }
        g->head = g->tail = NULL;
        pthread_cond_broadcast(&g->done);
        rc = -1;
    }
    pthread_mutex_unlock(&g->lock);
    return rc;
}

int fl_wait_any(fl_group *g, fl_job *const *jobs, int njobs, double timeout_s) {
    if (fl_group_orphaned(g)) return -2;
    if (!(timeout_s >= 0)) timeout_s = 0;   /* negative or NaN */
    if (timeout_s > 1e6) timeout_s = 1e6;
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    long long whole = (long long)timeout_s;
    long long ns = until.tv_nsec + (long long)((timeout_s - (double)whole) * 1e9);
    until.tv_sec += (time_t)(whole + ns / 1000000000LL);
    until.tv_nsec = (long)(ns % 1000000000LL);
    int found = -1;
    pthread_mutex_lock(&g->lock);
    for (;;) {
        for (int j = 0; j < njobs; j++) {
            if (jobs[j]->finished) { found = j; break; }
        }
        if (found >= 0) break;
        int rc = pthread_cond_timedwait(&g->done, &g->lock, &until);
        if (rc != 0 && rc != EINTR) break;   /* timed out (or cannot wait at all) */
    }
    pthread_mutex_unlock(&g->lock);
    return found;
}

void fl_job_join(fl_job *job) {
    if (fl_group_orphaned(job->group)) return;
    pthread_mutex_lock(&job->group->lock);
    while (!job->finished) pthread_cond_wait(&job->group->done, &job->group->lock);
    pthread_mutex_unlock(&job->group->lock);
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

int fl_fill_gather(const fl_field *field, fl_job *job, int64_t pos, int64_t index,
                   char *dst, fl_scratch *scratch, char *message) {
    (void)job; (void)pos; (void)scratch;
    if (index < 0 || index >= field->count) {
        snprintf(message, FL_MESSAGE_BYTES, "index %lld is out of range for %lld observations",
                 (long long)index, (long long)field->count);
        return -1;
    }
    const char *src = field->src + index * field->strides[0];
    if (field->contiguous)
        memcpy(dst, src, (size_t)field->row_bytes);
    else
        copy_strided(dst, src, field->ndim, field->shape, field->strides + 1, field->itemsize);
    return 0;
}
