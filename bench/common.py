"""Shared helpers of the benchmarks: medians of interleaved runs, memory, printing."""

import os
import resource
import statistics
import threading
import time

import numpy as np

PAGE = 4096


def peak_rss_mb():
    """Peak resident memory of this process and its waited-for children, in MB."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (own + children) / 1024


def current_rss_mb():
    """Resident memory of this process now, in MB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def rate(run, items):
    """Items per second of one call of ``run`` (which loads ``items`` items)."""
    start = time.perf_counter()
    run()
    return items / (time.perf_counter() - start)


def compare(candidates, repeats, reference, unit="items/s"):
    """Run each candidate ``repeats`` times, interleaved so that machine noise hits all
    alike, in the reverse order every other round so that none is always first; print the
    median rate and its ratio to ``reference``. ``candidates`` maps a name to (run,
    items), where items counts what ``unit`` names (e.g. batches for "batches/s").
    Returns the medians."""
    samples = {name: [] for name in candidates}
    names = list(candidates)
    for round_ in range(repeats):
        for name in names if round_ % 2 == 0 else names[::-1]:
            run, items = candidates[name]
            samples[name].append(rate(run, items))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    width = max(len(name) for name in medians)
    for name, value in medians.items():
        ratio = value / medians[reference]
        print(f"  {name:<{width}}  {value:>12,.0f} {unit}   {ratio:6.2f}x {reference}")
    return medians


def _memory_bytes(pid):
    """(RSS, PSS, unreclaimable PSS) of one process, from /proc: PSS counts a page shared
    by k processes (forked code, a shared-memory ring, tensors in shared memory) as 1/k in
    each; the unreclaimable part is its anonymous and shared-memory pages (``Pss_Anon`` +
    ``Pss_Shmem``), which the kernel cannot drop under memory pressure (without swap), as
    it drops the clean pages of files (``Pss_File``)."""
    rss = pss = unreclaimable = 0
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Rss:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("Pss:"):
                pss = int(line.split()[1]) * 1024
            elif line.startswith(("Pss_Anon:", "Pss_Shmem:")):
                unreclaimable += int(line.split()[1]) * 1024
    return rss, pss, unreclaimable


def minor_faults(pids):
    """The minor page faults of the processes ``pids`` so far, summed (Linux's ``/proc``)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            total += int(f.read().rsplit(")", 1)[1].split()[7])
    return total


def workers_of(pid):
    """The processes under ``pid``."""
    return [p for p in _descendants(pid) if p != pid]


def _descendants(pid):
    """``pid`` and the processes under it."""
    pids = [pid]
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                children = f.read().split()
        except FileNotFoundError:  # a thread that ended since: its children are another's
            continue
        for child in children:
            pids += _descendants(int(child))
    return pids


def _tree_memory_bytes(pid):
    """(RSS, PSS, unreclaimable PSS) of ``pid`` and its descendants, summed; None when the
    tree changed while it was read (a fork between reading the parent and listing its
    children would count the pages they share twice: the parent's whole, the child's
    half)."""
    try:
        pids = _descendants(pid)
        sizes = [_memory_bytes(p) for p in pids]
        if _descendants(pid) != pids:
            return None
    except (FileNotFoundError, ProcessLookupError):
        return None
    return tuple(sum(size[k] for size in sizes) for k in range(3))


class TreeMemory:
    """Peaks of the summed RSS, of the summed PSS and of the summed unreclaimable PSS
    (anonymous and shared-memory pages) of this process and its workers, sampled every
    10 ms. The RSS sum counts a page shared by several processes once per process; the
    PSS sum counts it once in all, which is the tree's real footprint; the unreclaimable
    part is what the kernel cannot take back for others (a mapped file's clean pages it
    can)."""

    def __init__(self):
        self.rss = self.pss = self.unreclaimable = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.01):
            sizes = _tree_memory_bytes(os.getpid())
            if sizes is not None:
                self.rss, self.pss = max(self.rss, sizes[0]), max(self.pss, sizes[1])
                self.unreclaimable = max(self.unreclaimable, sizes[2])

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def touch(batch):
    """Read a byte of every page of the batch's arrays (tensors or numpy), as a training step
    reads its batch (a loop that reads nothing leaves a batch delivered in shared memory
    unmapped in the consumer: its pages would count in no process's memory)."""
    for part in batch:
        flat = np.asarray(part).reshape(-1).view(np.uint8)
        int(flat[::PAGE].sum())
