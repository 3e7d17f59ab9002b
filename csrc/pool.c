/* The process-wide pool; see pool.h.
 *
 * Invariants, all under `lock`: `head..tail` is the FIFO of queued tasks; `nthreads` threads
 * run `worker` while `started`, `running` of them past their start (start and reserve
 * return only once all are: a fork never copies a thread halfway through its start, whose
 * locks, ASan's thread registry for one, the child would inherit held and wait on
 * forever); `stopping` (a shutdown in progress) makes idle workers exit
 * once the queue is empty, and makes submit, reserve and a second shutdown wait for
 * `stopped`. `generation` counts forks, so objects of a parent's pool are known as such
 * in a child. This is the only mutable global state of the native core. */
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct task {
    fl_task_fn fn;
    void *arg;
    struct task *next;
} task;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static pthread_cond_t stopped = PTHREAD_COND_INITIALIZER; /* a shutdown finished */
static pthread_cond_t ready = PTHREAD_COND_INITIALIZER;   /* a worker is running */
static task *head, *tail;
static pthread_t *threads;
static int nthreads, running, started, stopping;
static unsigned long generation; /* forks survived: a child's pool is a new one */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void *worker(void *unused) {
    (void)unused;
    pthread_mutex_lock(&lock);
    running++;
    pthread_cond_broadcast(&ready);
    for (;;) {
        while (!head && !stopping) pthread_cond_wait(&wake, &lock);
        if (!head) break;
        task *t = head;
        head = t->next;
        if (!head) tail = NULL;
        pthread_mutex_unlock(&lock);
        t->fn(t->arg);
        free(t);
        pthread_mutex_lock(&lock);
    }
    pthread_mutex_unlock(&lock);
    return NULL;
}

int fl_pool_default_size(void) {
    const char *env = getenv("FASTLOAD_NUM_THREADS");
    if (env && *env) {
        int n = atoi(env);
        if (n >= 1) return n > 1024 ? 1024 : n;
    }
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n >= 1) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n >= 1 ? (int)n : 1;
}

static void before_fork(void) { pthread_mutex_lock(&lock); }
static void after_fork_parent(void) { pthread_mutex_unlock(&lock); }

/* The child has only the forking thread: the parent's workers and queue are not its own. */
static void after_fork_child(void) {
    generation++;
    pthread_mutex_init(&lock, NULL);
    pthread_cond_init(&wake, NULL);
    pthread_cond_init(&stopped, NULL);
    pthread_cond_init(&ready, NULL);
    while (head) {
        task *t = head;
        head = t->next;
        free(t);
    }
    tail = NULL;
    free(threads);
    threads = NULL;
    nthreads = running = started = stopping = 0;
}

/* Called with `lock` held, after creating threads: waits until each runs `worker`. */
static void await_running(void) {
    while (running < nthreads) pthread_cond_wait(&ready, &lock);
}

static void install_atfork(void) {
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

unsigned long fl_pool_generation(void) { return generation; }

/* Called with `lock` held; waits out a shutdown in progress. */
static int start_locked(void) {
    while (stopping) pthread_cond_wait(&stopped, &lock);
    if (started) return FL_OK;
    int n = fl_pool_default_size();
    threads = calloc((size_t)n, sizeof *threads);
    if (!threads) return FL_ETHREADS;
    for (nthreads = 0; nthreads < n; nthreads++) {
        if (pthread_create(&threads[nthreads], NULL, worker, NULL) != 0) break;
    }
    if (nthreads == 0) {
        free(threads);
        threads = NULL;
        return FL_ETHREADS;
    }
    started = 1; /* before the wait, which lets go of `lock`: no second start meanwhile */
    await_running();
    return FL_OK;
}

int fl_pool_submit(fl_task_fn fn, void *arg) {
    pthread_once(&atfork_once, install_atfork);
    task *t = malloc(sizeof *t);
    if (!t) return FL_ENOMEM;
    t->fn = fn;
    t->arg = arg;
    t->next = NULL;
    pthread_mutex_lock(&lock);
    if (start_locked() != FL_OK) {
        pthread_mutex_unlock(&lock);
        free(t);
        return FL_ETHREADS;
    }
    if (tail)
        tail->next = t;
    else
        head = t;
    tail = t;
    pthread_cond_signal(&wake);
    pthread_mutex_unlock(&lock);
    return FL_OK;
}

int fl_pool_size(void) {
    pthread_once(&atfork_once, install_atfork);
    pthread_mutex_lock(&lock);
    int rc = start_locked();
    int n = rc == FL_OK ? nthreads : 1;
    pthread_mutex_unlock(&lock);
    return n;
}

int fl_pool_reserve(int n) {
    pthread_once(&atfork_once, install_atfork);
    pthread_mutex_lock(&lock);
    if (n > 1024) n = 1024;
    if (start_locked() == FL_OK && n > nthreads) {
        pthread_t *grown = realloc(threads, (size_t)n * sizeof *threads);
        if (grown) {
            threads = grown;
            while (nthreads < n && pthread_create(&threads[nthreads], NULL, worker, NULL) == 0)
                nthreads++;
            await_running();
        }
    }
    int size = started ? nthreads : 1;
    pthread_mutex_unlock(&lock);
    return size;
}

void fl_pool_shutdown(void) {
    pthread_mutex_lock(&lock);
    while (stopping) pthread_cond_wait(&stopped, &lock);
    if (!started) {
        pthread_mutex_unlock(&lock);
        return;
    }
    stopping = 1;
    pthread_cond_broadcast(&wake);
    pthread_t *joining = threads;
    int n = nthreads;
    pthread_mutex_unlock(&lock);
    /* While `stopping`, nobody else changes `threads`: submit and reserve wait. */
    for (int i = 0; i < n; i++) pthread_join(joining[i], NULL);
    pthread_mutex_lock(&lock);
    free(threads);
    threads = NULL;
    nthreads = running = started = stopping = 0;
    pthread_cond_broadcast(&stopped);
    pthread_mutex_unlock(&lock);
}
