/* The process-wide pool of native worker threads.
 *
 * Started on first use, sized to the CPUs this process may run on (sched_getaffinity) or
 * to FASTLOAD_NUM_THREADS. Safe across fork: the child forgets the parent's threads and
 * queue, and starts a pool of its own on first use. Tasks run in submission order. */
#ifndef FASTLOAD_POOL_H
#define FASTLOAD_POOL_H

#include "status.h"

typedef void (*fl_task_fn)(void *arg);

/* Queue fn(arg) to run on a pool thread. Returns FL_OK, FL_ETHREADS when no thread could
 * start, or FL_ENOMEM. */
int fl_pool_submit(fl_task_fn fn, void *arg);

/* Number of threads the pool runs (starting it if needed); at least 1. */
int fl_pool_size(void);

/* Grow the pool to at least `n` threads (a loader asked for that many). Returns the size. */
int fl_pool_reserve(int n);

/* Threads the pool would start with: FASTLOAD_NUM_THREADS, else the affinity mask. */
int fl_pool_default_size(void);

/* How many forks this process is from the one that first used the pool: a pool object of
 * an older generation belongs to a parent, whose threads do not exist here. */
unsigned long fl_pool_generation(void);

/* Let queued tasks finish, then join every thread. The pool restarts on the next submit;
 * a submit, reserve or shutdown meanwhile waits for this one to finish. */
void fl_pool_shutdown(void);

#endif
