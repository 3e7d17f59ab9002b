"""Shared helpers of the benchmarks: medians of interleaved runs, memory, printing."""

import resource
import statistics
import time


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
