/* Guarded file maps: a read of a memory-mapped file that shrank raises no SIGBUS.
 *
 * A page of a file map past the file's end (the file was truncated while mapped) cannot
 * be read: the kernel sends SIGBUS, which kills the process, whichever thread read it (a
 * pool thread in a kernel, numpy, zlib). A guarded range is a file map registered here:
 * a SIGBUS at an address inside one is answered by mapping zero pages over the rest of
 * the range (the whole part past the new end, in one step) and counting the fault; the
 * read then completes and returns zeros. The caller checks the counts before it trusts
 * what it read (fastload's reader does before it hands out a batch) and raises an error
 * naming the file. A SIGBUS anywhere else goes to the handler installed before, or
 * kills the process as it would have.
 *
 *     mapped range   [lo ..................... end of file' ............ hi)
 *     after a fault  [lo ... file pages ......)[ zero pages, read-only ...)
 *
 * Counts: `fl_guard_faults(id)` counts the faults of one range in this process;
 * `fl_guard_all_faults()` counts every fault in this process and in the processes forked
 * from it after the first `fl_guard_install` (a shared page), so a parent learns of a
 * fault in a worker process that reads the same file. */
#ifndef FASTLOAD_MAPGUARD_H
#define FASTLOAD_MAPGUARD_H

#include <stddef.h>
#include <stdint.h>

/* Installs the SIGBUS handler unless it is installed (again, when another handler
 * replaced it since). FL_OK, or FL_EFAILED when the system refuses. */
int fl_guard_install(void);

/* Guards [start, start + size): returns its id (>= 0), FL_EINVAL, or FL_ELIMIT when
 * every slot is in use. */
int fl_guard_add(const void *start, size_t size);

/* Stops guarding range `id` (before it is unmapped). */
void fl_guard_remove(int id);

/* Faults answered in range `id`, in this process. */
uint64_t fl_guard_faults(int id);

/* Faults answered in any range, in this process and the processes forked from it. */
uint64_t fl_guard_all_faults(void);

#endif
