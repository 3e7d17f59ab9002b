"""Data larger than RAM: a packed file read under a memory limit smaller than the file.

A packed file of ``--rows`` raw 64x64x3 uint8 images and int64 labels (250,000 rows: 3.07
GB) is written from a Python row source whose ``__getitem__`` makes each image (a seeded
random array: GIL-bound Python work per row), then read by
``DataLoader(fastload.open(path), 256, parallel=True, buffer=True)`` one epoch per run:

1. the writer: rows/s of ``fastload.write`` with worker processes (``backend="process"``)
   and with encoder threads, against FFCV's writer (2 workers) when ffcv is installed, else
   against a plain loop that writes each row's bytes to a file; the file read below is
   the one written with threads and ``write``'s other defaults too (blocks of 64 MiB,
   ``--block-mb`` to change them);
2. reading: ``shuffle=False`` (in order: the disk's rate), ``shuffle="quasi"`` and
   ``shuffle=True``, each in a fresh process inside a memory cgroup limited to
   ``--limit-mb`` (so the page cache cannot hold the file), caches dropped before each
   run; then the in-RAM rate (no limit, the file in the page cache). ``shuffle=True`` under
   the limit runs for ``--random-s`` seconds only (a whole epoch would take hours).
   Printed: items/s, the ratio to the in-order rate, the process's peak RSS, the
   cgroup's peak usage (page cache included) and the bytes read from disk (all threads,
   Python's own files included: what passes the file's size by more than that was read
   twice); then the ratio of each quasi run to the
   in-order run of the same round and their median (MEDIAN RATIO). Each run checks that
   every label was seen once.

The memory limit and dropping caches need root on Linux; the script uses cgroup v1 (a
``memory`` hierarchy) or v2 (``memory.max``), whichever the machine has, creating one
cgroup per run under its own. Where it cannot, it says so and runs unconstrained.
The default limit leaves the page cache the same share of the file as the full run does:
256 MB (about what the reading process holds in its cgroup before it reads: Python,
numpy, pyarrow and their files, which do not scale) + 768 MB x rows / 250,000 (at 60,000
rows: 440 MB, for a 0.74 GB file).

Full size (about 3.1 GB of disk for the file; a few minutes)::

    sudo .venv/bin/python bench/larger_than_ram.py --rows 250000 --limit-mb 1024

Quick: ``python bench/larger_than_ram.py --rows 60000``; ``--path FILE`` reads an
existing file of this layout instead of writing one (the writer is not timed then).
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import peak_rss_mb

import fastload
from fastload.storage import Raw

FULL_ROWS = 250_000
FULL_LIMIT_MB = 1024
OWN_MB = 256  # about what the reading process takes itself (Python, libraries)
SIDE = 64
BATCH = 256
DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".cache")


class Rows:
    """The row source: ``rows[i]`` makes image i (seeded random pixels) in Python."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        image = np.random.default_rng(i).integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8)
        return {"image": image, "label": i}


# 1. The writer


def write_fastload(path, rows, block_bytes, backend):
    """``fastload.write`` with its default settings but ``backend`` (and ``block_bytes``
    when not None)."""
    sizing = {} if block_bytes is None else {"block_bytes": block_bytes}
    start = time.perf_counter()
    fastload.write(
        path,
        Rows(rows),
        {"image": Raw(), "label": "int64"},
        progress=False,
        backend=backend,
        **sizing,
    )
    return rows / (time.perf_counter() - start)


def write_plain(path, rows):
    """The floor of a one-process writer: each row made and its bytes written, no format."""
    source = Rows(rows)
    start = time.perf_counter()
    with open(path, "wb") as f:
        for i in range(rows):
            row = source[i]
            f.write(row["image"].tobytes())
            f.write(np.int64(row["label"]).tobytes())
        f.flush()
        os.fsync(f.fileno())
    return rows / (time.perf_counter() - start)


class RowTuples(Rows):
    """The same rows as (image, label) tuples, as FFCV's writer takes them."""

    def __getitem__(self, i):
        row = super().__getitem__(i)
        return row["image"], row["label"]


def write_ffcv(path, rows):
    """FFCV's writer with 2 worker processes on the same rows (ffcv 1.0 API)."""
    from ffcv.fields import IntField, NDArrayField
    from ffcv.writer import DatasetWriter

    writer = DatasetWriter(
        path,
        {"image": NDArrayField(np.dtype("uint8"), (SIDE, SIDE, 3)), "label": IntField()},
        num_workers=2,
    )
    start = time.perf_counter()
    writer.from_indexed_dataset(RowTuples(rows))
    return rows / (time.perf_counter() - start)


def bench_writer(path, rows, block_bytes, out):
    """Prints the writers' rows/s; leaves at ``path`` the file written with threads, as
    ``write`` does by default."""
    try:
        import ffcv  # noqa: F401

        other, run_other = "FFCV DatasetWriter (2 workers)", write_ffcv
        other_path = os.path.join(out, "larger_than_ram.beton")
    except ImportError:
        other, run_other = "plain loop: row bytes to a file", write_plain
        other_path = os.path.join(out, "larger_than_ram.plain")
    blocks = "write's default" if block_bytes is None else f"{block_bytes / 2**20:.1f} MiB"
    print(
        f"1. writing {rows:,} rows of {SIDE}x{SIDE}x3 uint8 + int64 from a Python source "
        f"(the file: {rows * (SIDE * SIDE * 3 + 8) / 1e9:.2f} GB, blocks: {blocks})"
    )
    results = {}
    for name, run in (
        (other, lambda: run_other(other_path, rows)),
        (
            "fastload.write, backend='process'",
            lambda: write_fastload(path, rows, block_bytes, "process"),
        ),
        ("fastload.write, threads", lambda: write_fastload(path, rows, block_bytes, "thread")),
    ):
        results[name] = run()
        if os.path.exists(other_path):
            os.remove(other_path)
    width = max(len(k) for k in results)
    for name, value in results.items():
        print(f"  {name:<{width}}  {value:>10,.0f} rows/s   {value / results[other]:5.2f}x")


# 2. Reading under a memory limit


class Cgroup:
    """A memory cgroup for one run (v1 or v2), or the reason there is none."""

    def __init__(self, limit_bytes):
        self.path = self.why = None
        self.version = None
        if not sys.platform.startswith("linux"):
            self.why = "not Linux"
            return
        if os.geteuid() != 0:
            self.why = "not root"
            return
        try:
            self.version, parent = _own_memory_cgroup()
        except (OSError, LookupError) as exc:
            self.why = f"no memory cgroup found ({exc})"
            return
        path = os.path.join(parent, f"fastload-bench-{os.getpid()}")
        try:
            if self.version == 2:
                _write(os.path.join(parent, "cgroup.subtree_control"), "+memory")
            os.mkdir(path)
            limit_file = "memory.limit_in_bytes" if self.version == 1 else "memory.max"
            _write(os.path.join(path, limit_file), str(limit_bytes))
        except OSError as exc:
            self.why = f"cannot make a cgroup under {parent}: {exc}"
            if os.path.isdir(path):
                os.rmdir(path)
            return
        self.path = path

    def peak_bytes(self):
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        try:
            with open(os.path.join(self.path, name)) as f:
                return int(f.read())
        except (OSError, ValueError):
            return None

    def remove(self):
        if self.path is not None:
            for _ in range(50):  # the last process leaves the cgroup a moment after exit
                try:
                    os.rmdir(self.path)
                    return
                except OSError:
                    time.sleep(0.1)


def _own_memory_cgroup():
    """(version, directory) of this process's memory cgroup."""
    with open("/proc/self/cgroup") as f:
        lines = [line.split(":", 2) for line in f.read().splitlines()]
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split(" - ") for line in f.read().splitlines() if " - " in line]
    for version, hierarchy in (
        (1, lambda h, c: "memory" in c.split(",")),
        (2, lambda h, c: h == "0" and c == ""),
    ):
        for h, controllers, path in lines:
            if not hierarchy(h, controllers):
                continue
            for before, after in mounts:
                kind, _, options = (after.split() + ["", "", ""])[:3]
                fields = before.split()
                if version == 1 and kind == "cgroup" and "memory" in options.split(","):
                    return 1, _under(fields, path)
                if version == 2 and kind == "cgroup2":
                    directory = _under(fields, path)
                    with open(os.path.join(directory, "cgroup.controllers")) as f:
                        if "memory" in f.read().split():
                            return 2, directory
    raise LookupError("no cgroup with a memory controller")


def _under(mount_fields, path):
    root, point = mount_fields[3], mount_fields[4]
    if root != "/" and path.startswith(root):
        path = path[len(root) :]
    return os.path.join(point, path.lstrip("/"))


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def drop_caches():
    """Empty the page cache (root, Linux); returns False when it cannot."""
    os.sync()
    try:
        _write("/proc/sys/vm/drop_caches", "3")
        return True
    except OSError:
        return False


def warm(path):
    """Read the file once so the page cache holds it."""
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def run_child(path, shuffle, seconds, cgroup):
    """One read run in a fresh process (in ``cgroup`` when given); returns its report."""
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        json.dumps(shuffle),
        "--path",
        path,
        "--random-s",
        str(seconds),
    ]
    if cgroup is not None and cgroup.path is not None:
        command += ["--cgroup", cgroup.path]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if cgroup is not None and cgroup.path is not None:
        report["cgroup_peak_mb"] = (cgroup.peak_bytes() or 0) / 2**20
    return report


def child(path, shuffle, seconds, cgroup):
    """Read one epoch (or ``seconds`` of one, for shuffle=True), print a JSON report."""
    if cgroup:
        _write(os.path.join(cgroup, "cgroup.procs"), str(os.getpid()))
    ds = fastload.open(path)
    loader = fastload.DataLoader(ds, BATCH, shuffle=shuffle, parallel=True, buffer=True, seed=0)
    n, total, items = len(ds), 0, 0
    limit = seconds if shuffle is True else float("inf")
    start = time.perf_counter()
    for batch in loader:
        total += int(batch["label"].sum())
        items += len(batch["label"])
        if time.perf_counter() - start > limit:
            break
    elapsed = time.perf_counter() - start
    if items == n and total != n * (n - 1) // 2:
        raise SystemExit("the epoch did not see every label once")
    print(
        json.dumps(
            {
                "items": items,
                "seconds": elapsed,
                "items_per_s": items / elapsed,
                "peak_rss_mb": _peak_rss_mb(),
                "disk_read_mb": _disk_read_bytes() / 2**20,
                "major_faults": resource.getrusage(resource.RUSAGE_SELF).ru_majflt,
            }
        )
    )


def _disk_read_bytes():
    """Bytes this process (all its threads) had read from the disk (Linux; else 0)."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _peak_rss_mb():
    """This process's peak resident memory since it started (VmHWM: unlike ru_maxrss, not
    carried over from the process that forked it)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench_reads(path, limit_mb, seconds, repeats):
    """Runs each read ``repeats`` times, interleaved; prints medians and the peaks."""
    size = os.path.getsize(path)
    probe = Cgroup(limit_mb << 20)
    probe.remove()
    dropped = drop_caches()
    print(
        f"2. reading {path} ({size / 1e9:.2f} GB), batch {BATCH}, parallel=True, "
        f"buffer=True, one epoch per run, median of {repeats} interleaved runs"
    )
    if probe.why is None:
        print(
            f"  each run in a fresh memory cgroup (v{probe.version}) limited to "
            f"{limit_mb:,} MB: the file is {size / (limit_mb << 20):.1f}x the limit"
        )
    else:
        print(f"  NOT limited: {probe.why}; the runs use all the memory there is")
    if not dropped:
        print(
            "  caches NOT dropped between runs (needs root on Linux): reads may come "
            "from the page cache"
        )
    runs = [
        ("shuffle=False (in order)", False, True),
        ("shuffle='quasi'", "quasi", True),
        (f"shuffle=True ({seconds:g} s)", True, True),
        ("in RAM (page cache warm), shuffle=True", True, False),
    ]
    samples = {name: [] for name, _, _ in runs}
    for _ in range(repeats):
        for name, shuffle, limited in runs:
            samples[name].append(_read_run(path, shuffle, seconds, limited, limit_mb, probe))
    reference = _median(samples[runs[0][0]])
    width = max(len(k) for k in samples)
    for name, reports in samples.items():
        errors = [r["error"] for r in reports if "error" in r]
        if errors:
            print(f"  {name:<{width}}  failed: {errors[0]}")
            continue
        rate = _median(reports)
        ratio = f"{rate / reference:6.3f}x in order" if reference else ""
        peak = max(r["peak_rss_mb"] for r in reports)
        cgroup = [r["cgroup_peak_mb"] for r in reports if "cgroup_peak_mb" in r]
        cgroup = f", cgroup peak {max(cgroup):,.0f} MB" if cgroup else ""
        spread = ", ".join(f"{r['items_per_s']:,.0f}" for r in reports)
        disk = sorted(r["disk_read_mb"] for r in reports)[len(reports) // 2]
        print(
            f"  {name:<{width}}  {rate:>10,.0f} items/s  {ratio}   peak RSS "
            f"{peak:,.0f} MB{cgroup}, read from disk {disk:,.0f} MB   (runs: {spread})"
        )
    _print_paired(samples[runs[1][0]], samples[runs[0][0]])
    return samples


def _print_paired(quasi, in_order):
    """The ratio of each quasi run to the in-order run of the same round, and their
    median: the figure that says whether quasi order keeps up with the disk."""
    ratios = sorted(
        q["items_per_s"] / o["items_per_s"]
        for q, o in zip(quasi, in_order)
        if "error" not in q and "error" not in o
    )
    if ratios:
        runs = ", ".join(f"{r:.3f}" for r in ratios)
        median = ratios[len(ratios) // 2]
        print(f"  shuffle='quasi' / in order, run by run: {runs}; MEDIAN RATIO {median:.3f}x")


def _read_run(path, shuffle, seconds, limited, limit_mb, probe):
    if limited:
        drop_caches()
        cgroup = Cgroup(limit_mb << 20) if probe.why is None else None
    else:
        warm(path)
        cgroup = None
    try:
        return run_child(path, shuffle, seconds if limited else 1e9, cgroup)
    finally:
        if cgroup is not None:
            cgroup.remove()


def _median(reports):
    rates = sorted(r["items_per_s"] for r in reports if "error" not in r)
    return rates[len(rates) // 2] if rates else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=FULL_ROWS)
    parser.add_argument("--path", default=None, help="an existing file to read (not written)")
    parser.add_argument(
        "--limit-mb",
        type=int,
        default=None,
        help="memory limit of the read runs (default: 256 + 768 x rows / 250,000)",
    )
    parser.add_argument(
        "--random-s", type=float, default=10.0, help="seconds of shuffle=True under the limit"
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs of each read")
    parser.add_argument(
        "--block-mb",
        type=float,
        default=None,
        help="blocks of the written file (default: write's default, 64 MiB)",
    )
    parser.add_argument("--out", default=DEFAULT_OUT, help="where the file goes")
    parser.add_argument("--keep", action="store_true", help="keep the written file")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--cgroup", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        return child(args.path, json.loads(args.child), args.random_s, args.cgroup)
    if args.rows < 1000 or args.repeats < 1:
        parser.error("--rows must be >= 1000 and --repeats >= 1")
    scale = args.rows / FULL_ROWS
    # What scales is the memory left to the page cache beside the process's own (Python
    # and its libraries, which do not scale).
    limit_mb = args.limit_mb or round(OWN_MB + (FULL_LIMIT_MB - OWN_MB) * scale)
    block_bytes = None if args.block_mb is None else max(1, round(args.block_mb * 2**20))
    path = args.path
    if path is None:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, f"larger_than_ram_{args.rows}.arrow")
        bench_writer(path, args.rows, block_bytes, args.out)
    try:
        bench_reads(path, limit_mb, args.random_s, args.repeats)
    finally:
        if args.path is None and not args.keep:
            os.remove(path)
    print(f"peak RSS of this process and its waited-for children: {peak_rss_mb():,.0f} MB")


if __name__ == "__main__":
    main()
