#include "mapguard.h"

#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "status.h"

/* As many ranges as the kernel allows maps by default (vm.max_map_count). */
#define FL_GUARD_SLOTS 65536

/* A slot is free when `hi` is 0. The handler reads slots without a lock: `add` writes
 * `lo` before `hi`, `remove` clears `hi` first (atomically, release/acquire). */
typedef struct {
    uintptr_t lo, hi;
    uint64_t faults;
} guard_slot;

static guard_slot slots[FL_GUARD_SLOTS];
static int slots_used; /* slots below this index may be in use (atomic) */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct sigaction previous;
static uint64_t *shared_faults; /* a MAP_SHARED page, inherited by forked processes */
static uint64_t local_faults;   /* until the shared page exists */

static uintptr_t page_size; /* set at install: sysconf is not async-signal-safe */

static uintptr_t page_floor(uintptr_t a) { return a & ~(page_size - 1); }

static uintptr_t page_ceil(uintptr_t a) { return (a + page_size - 1) & ~(page_size - 1); }

/* The slot holding `addr`, or -1. Async-signal-safe. */
static int slot_of(uintptr_t addr) {
    int used = __atomic_load_n(&slots_used, __ATOMIC_ACQUIRE);
    for (int k = 0; k < used; k++) {
        uintptr_t hi = __atomic_load_n(&slots[k].hi, __ATOMIC_ACQUIRE);
        uintptr_t lo = __atomic_load_n(&slots[k].lo, __ATOMIC_RELAXED);
        if (hi != 0 && lo <= addr && addr < hi) return k;
    }
    return -1;
}

/* Hands the signal to the handler installed before ours, as if ours had never been: a
 * fault repeats when the handler returns, a signal sent by kill() is sent again. */
static void pass_on(int sig, siginfo_t *info) {
    sigaction(SIGBUS, &previous, NULL);
    if (info == NULL || info->si_code <= 0) raise(sig);
}

static void on_sigbus(int sig, siginfo_t *info, void *context) {
    (void)context;
    int k = -1;
    if (info != NULL && info->si_code > 0) k = slot_of((uintptr_t)info->si_addr);
    if (k < 0) {
        pass_on(sig, info);
        return;
    }
    /* Every page from the faulting one to the end of the range lies past the file's new
     * end: one map of zero pages covers them (one map, whatever the size of the cut). */
    uintptr_t from = page_floor((uintptr_t)info->si_addr);
    uintptr_t to = page_ceil(__atomic_load_n(&slots[k].hi, __ATOMIC_ACQUIRE));
    /* Counted before the zeros appear: another thread may read them as soon as they are
     * mapped (without a fault of its own), and finds the count when it looks. */
    __atomic_add_fetch(&slots[k].faults, 1, __ATOMIC_RELEASE);
    __atomic_add_fetch(shared_faults != NULL ? shared_faults : &local_faults, 1, __ATOMIC_RELEASE);
    void *zeros =
        mmap((void *)from, to - from, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (zeros == MAP_FAILED) pass_on(sig, info);
}

int fl_guard_install(void) {
    struct sigaction now, ours;
    int status = FL_OK;
    pthread_mutex_lock(&lock);
    if (page_size == 0) page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
    if (shared_faults == NULL) {
        void *page = mmap(NULL, (size_t)page_size, PROT_READ | PROT_WRITE,
                          MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (page != MAP_FAILED) {
            shared_faults = page;
            *shared_faults = local_faults;
        }
    }
    if (sigaction(SIGBUS, NULL, &now) != 0) {
        status = FL_EFAILED;
    } else if (!((now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_sigbus)) {
        memset(&ours, 0, sizeof ours);
        ours.sa_sigaction = on_sigbus;
        ours.sa_flags = SA_SIGINFO | SA_RESTART;
        sigemptyset(&ours.sa_mask);
        if (sigaction(SIGBUS, &ours, &previous) != 0) status = FL_EFAILED;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

int fl_guard_add(const void *start, size_t size) {
    if (start == NULL || size == 0) return FL_EINVAL;
    int found = FL_ELIMIT;
    pthread_mutex_lock(&lock);
    for (int k = 0; k < FL_GUARD_SLOTS; k++) {
        if (slots[k].hi != 0) continue;
        slots[k].faults = 0;
        __atomic_store_n(&slots[k].lo, (uintptr_t)start, __ATOMIC_RELAXED);
        __atomic_store_n(&slots[k].hi, (uintptr_t)start + size, __ATOMIC_RELEASE);
        if (k >= slots_used) __atomic_store_n(&slots_used, k + 1, __ATOMIC_RELEASE);
        found = k;
        break;
    }
    pthread_mutex_unlock(&lock);
    return found;
}

void fl_guard_remove(int id) {
    if (id < 0 || id >= FL_GUARD_SLOTS) return;
    pthread_mutex_lock(&lock);
    __atomic_store_n(&slots[id].hi, 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&lock);
}

uint64_t fl_guard_faults(int id) {
    if (id < 0 || id >= FL_GUARD_SLOTS) return 0;
    return __atomic_load_n(&slots[id].faults, __ATOMIC_ACQUIRE);
}

uint64_t fl_guard_all_faults(void) {
    return __atomic_load_n(shared_faults != NULL ? shared_faults : &local_faults, __ATOMIC_ACQUIRE);
}
