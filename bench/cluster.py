"""Datasets written in parts by a cluster's engine (``fastload.cluster``): 2 workers
against 1 on each engine, converting the same JPEGs to longer side 256 (each task reads
the files, decodes, resizes by area and encodes at quality 90: ``JPEG(max_side=256)``),
committed whole.

For each engine the 1-worker and the 2-worker runs alternate (the order reversed every
other round), the workers up before the clock: Dask starts a local cluster of 1 or 2
worker processes for each run (no idle cluster beside it), its workers with fastload's
writer imported, started with Dask's diagnostics lean (``LEAN_DIAGNOSTICS``: the
workers' statistical profiler off, the event loops' health tick every second; at Dask's
defaults with ``--dask-diagnostics``); Ray runs one ``ray.init(num_cpus=2)``, the map
reading the files and the datasink both at 1 or 2 tasks at a time (fused by Ray into one
task per block), Ray Data's operator reservation off (on 2 CPUs it runs the first task
alone; on with ``--ray-reservation``); Spark (whose local master's cores are fixed at
start) starts ``local[1]`` or ``local[2]`` before each run, its Python workers started
with fastload imported. The time is the write's, from the engine's first task to the
commit. Medians of ``--repeats`` rounds, and the median of the rounds' own ratios; the
target is 2 workers >= 1.8x 1 worker. Each run prints the share of the CPUs' time the
host of a virtual machine took from it (``steal`` in /proc/stat); the host can also
share a CPU's core without it. First, what 2 processes give over 1 at that moment
without an engine, on a pure Python loop and on the writer's own work (the same encode
of 300 of the files in a pool of 2 processes): the ceiling of any engine's figure.

Where the time goes (CPU time per process, on the same machine): each task encodes on
its own thread alone (``write_part`` writes with ``parallel=False``; one worker uses one
core, no encoder threads besides), the 2-worker runs split the work evenly over both
workers, and the driver reads no file (the tasks do). What keeps an engine below the
work's ceiling is its own processes: with 1 worker they run on the second core, with 2
they take from the workers (Dask's scheduler and nannies run in the driver process, whose
CPU per second of a write the bench prints, with what each Dask worker process spends
beside its task thread: its event loop, and its profiler where on; Spark's JVM and Ray's
raylet likewise).

With ``--peers``, LitData and Mosaic Streaming convert the same files with the same work
in each engine's rounds (``cluster_peers.py``, run in ``bench/.venv-peers``, which
``bench/peers_env.sh`` makes): ``litdata.optimize(num_workers=2)``, and Mosaic's
``dataframe_to_mds`` (an ``MDSWriter`` per Spark task, the indexes merged) over a Spark
DataFrame of the same ``--partitions`` on ``local[2]``. Each reads the file, decodes it in
full with Pillow, shrinks it to fastload's size with Pillow's BOX filter (an area filter
that weighs whole pixels, where fastload weighs their overlap), encodes it at fastload's
settings (quality 90, 4:2:0, the same restart markers) and stores it with its label and
path, uncompressed, on the same local disk. The time is the conversion call's: LitData's
includes starting its 2 worker processes (``optimize`` starts them each call); Mosaic's
Spark is started and its Python workers have imported Mosaic's writer (and torch) before
the clock, as for fastload's Spark runs. Printed: each peer's images/s and fastload's
2-worker figure on the engine over it (target >= 1x), with the megabytes each side wrote;
first, the CPU time of each side's work on one image, in one process (where a gap
between the engines' figures and the peers' comes from).

Usage: python bench/cluster.py [--n 4000] [--repeats 3] [--partitions 8]
[--engines dask,ray,spark] [--side 640] [--peers] [--ray-reservation] [--dask-diagnostics]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import simplejpeg

from fastload.cluster.convert import ImageRow
from fastload.storage import JPEG, Str

FIELDS = {"image": JPEG(quality=90, max_side=256), "label": "int64", "path": Str()}
HERE = os.path.dirname(os.path.abspath(__file__))
PEERS_PYTHON = os.path.join(HERE, ".venv-peers", "bin", "python")
PEERS_SCRIPT = os.path.join(HERE, "cluster_peers.py")
PEERS = ("litdata", "mosaic")
PEER_NAMES = {"litdata": "LitData optimize", "mosaic": "Mosaic MDS from Spark"}


def generate(root, n, side):
    """``n`` JPEGs of ``side`` x 3/4 ``side`` pixels (smooth gradients and noise, as a
    photo compresses) in two class folders; returns [(path under root, label)]."""
    rng = np.random.default_rng(0)
    h, w = side * 3 // 4, side
    y, x = np.mgrid[0:h, 0:w]
    items = []
    for i in range(n):
        name = f"c{i % 2}/{i:05d}.jpg"
        os.makedirs(os.path.join(root, f"c{i % 2}"), exist_ok=True)
        base = (x * rng.uniform(0.1, 0.5) + y * rng.uniform(0.1, 0.5))[..., None]
        pixels = (base + rng.integers(0, 40, (h, w, 3))).astype(np.uint8)
        with open(os.path.join(root, name), "wb") as f:
            f.write(simplejpeg.encode_jpeg(pixels, quality=90))
        items.append((name, i % 2))
    return items


def timed(write, out):
    """Seconds of ``write(prefix)`` into a fresh folder under ``out``."""
    prefix = os.path.join(out, "ds")
    shutil.rmtree(prefix, ignore_errors=True)
    start, cpu = time.perf_counter(), time.process_time()
    committed = write(prefix)
    seconds = time.perf_counter() - start
    driver_cpu.append((time.process_time() - cpu) / seconds)
    assert committed.rows == n_rows, committed.rows
    written["fastload"] = folder_bytes(prefix)
    return seconds


def folder_bytes(root):
    return sum(
        os.path.getsize(os.path.join(folder, name))
        for folder, _, names in os.walk(root)
        for name in names
    )


def dask_runs(items, root, out, partitions, repeats, peers):
    import dask.bag as db
    from distributed import Client

    from fastload.cluster import write_dask
    from fastload.cluster.convert import local_dask_cluster

    def run(k):
        # The cluster of k workers alone on the machine (an idle one beside it would take
        # its share of the cores): started, its workers with fastload's writer imported,
        # before the clock, and closed after. The scheduler and the workers take Dask's
        # config when they start (docs/cluster.md, "On a small machine").
        with local_dask_cluster(k, lean=not dask_diagnostics) as cluster, Client(cluster) as client:
            client.run(import_writer, "dask")
            pids = list(client.run(os.getpid).values())
            bag = db.from_sequence(items, npartitions=partitions).map(ImageRow(root))
            before = thread_cpu(pids)
            seconds = timed(lambda p: write_dask(bag, p, FIELDS), out)
            beside = beside_the_task_thread(before, thread_cpu(pids))
            worker_beside_cpu.append(beside / seconds / k)
            return seconds

    return alternate(run, repeats, peers)


def thread_cpu(pids):
    """{pid: {thread id: CPU seconds}} of the processes ``pids`` (psutil, which Dask's
    distributed needs)."""
    import psutil

    return {
        pid: {t.id: t.user_time + t.system_time for t in psutil.Process(pid).threads()}
        for pid in pids
    }


def beside_the_task_thread(before, after):
    """The CPU seconds that each process of ``thread_cpu``'s ``before`` and ``after``
    spent between the two outside its busiest thread (a Dask worker's one task thread),
    summed over the processes: the worker's event loop, its profiler, ..."""
    total = 0.0
    for pid, threads in after.items():
        spent = [cpu - before[pid].get(thread, 0.0) for thread, cpu in threads.items()]
        total += sum(spent) - max(spent)
    return total


def ray_runs(items, root, out, partitions, repeats, peers):
    import ray

    from fastload.cluster import Datasink

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True
    # Ray Data reserves a share of the CPUs for each operator: on 2 CPUs the first write
    # task would run alone until it ends (docs/cluster.md, "On a small machine").
    context.op_resource_reservation_enabled = ray_reservation
    records = [{"path": p, "label": t} for p, t in items]
    try:

        def run(k):
            def write(prefix):
                sink = Datasink(prefix, FIELDS)
                dataset = ray.data.from_items(records, override_num_blocks=partitions)
                dataset.map(
                    ImageRow(root), compute=ray.data.TaskPoolStrategy(size=k)
                ).write_datasink(sink, concurrency=k)
                return sink.committed

            return timed(write, out)

        return alternate(run, repeats, peers)
    finally:
        ray.shutdown()


def import_writer(engine):
    import importlib

    importlib.import_module(f"fastload.cluster.{engine}")


def spark_runs(items, root, out, partitions, repeats, peers):
    from pyspark.sql import SparkSession

    from fastload.cluster import write_spark

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    def run(k):
        spark = (
            SparkSession.builder.master(f"local[{k}]")
            .config("spark.ui.showConsoleProgress", "false")
            .getOrCreate()
        )
        try:
            # The workers started, fastload's writer imported, as Mosaic's in --peers.
            spark.sparkContext.parallelize(["spark"] * k, k).map(import_writer).count()
            rdd = spark.sparkContext.parallelize(items, partitions).map(ImageRow(root))
            return timed(lambda p: write_spark(rdd, p, FIELDS), out)
        finally:
            spark.stop()

    return alternate(run, repeats, peers)


def alternate(run, repeats, peers=None):
    """{workers: [seconds, ...]} of ``run(1)`` and ``run(2)``, and {peer: [seconds, ...]}
    of each of ``peers`` (a peer's name: a function of no argument giving seconds) in
    the same rounds, alternating (the order reversed every other round)."""
    runs = {1: lambda: run(1), 2: lambda: run(2), **(peers or {})}
    samples = {key: [] for key in runs}
    for r in range(repeats):
        for key in runs if r % 2 == 0 else reversed(runs):
            before = cpu_ticks()
            samples[key].append(runs[key]())
            after = cpu_ticks()
            label = f"{key} worker(s)" if isinstance(key, int) else key
            taken = f", the host took {stolen(before, after):.1%}" if before and after else ""
            print(f"    {label}: {samples[key][-1]:.1f} s{taken}", flush=True)
    return samples


def cpu_ticks():
    """The CPUs' time since boot by kind, in ticks (the first line of /proc/stat), or None
    where there is none."""
    try:
        with open("/proc/stat") as f:
            return [int(t) for t in f.readline().split()[1:]]
    except OSError:
        return None


def stolen(before, after):
    """The share of the CPUs' time between two ``cpu_ticks`` that the host of this virtual
    machine ran something else on them (``steal``): a run whose share is above 0 ran
    on less than the CPUs it was given."""
    spent = [now - then for now, then in zip(after, before)]
    return spent[7] / sum(spent) if sum(spent) else 0.0


def peer_runs(names, work, partitions):
    """{peer: a function timing one conversion by it}: ``cluster_peers.py convert`` in
    the peers' environment, on the images under ``work/images`` listed in
    ``work/items.json``, into a fresh folder under ``work``. The seconds are the ones the
    child measured around the conversion call; raises RuntimeError when it fails."""

    def runner(name):
        def run():
            out = os.path.join(work, f"peer-{name}")
            shutil.rmtree(out, ignore_errors=True)
            command = [PEERS_PYTHON, PEERS_SCRIPT, "convert", name]
            command += [os.path.join(work, "images"), os.path.join(work, "items.json"), out]
            command += ["--workers", "2", "--partitions", str(partitions)]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"{name} failed:\n{done.stderr[-4000:]}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            written[name] = result["bytes"]
            shutil.rmtree(out, ignore_errors=True)
            return result["seconds"]

        return run

    return {name: runner(name) for name in names}


def _spin(n):
    total = 0
    for i in range(n):
        total += i
    return total


def machine_ceiling(repeats):
    """What 2 processes give over 1 on this machine now: the same pure-Python loop, once
    in this process and twice on a pool of 2 processes, alternating; medians. On a
    machine shared with other work it is below 2x, and bounds what any engine shows."""
    import multiprocessing

    n, one, two = 10_000_000, [], []
    with multiprocessing.Pool(2) as pool:
        for _ in range(repeats):
            start = time.perf_counter()
            _spin(n)
            one.append(time.perf_counter() - start)
            start = time.perf_counter()
            pool.map(_spin, [n, n])
            two.append(time.perf_counter() - start)
    return 2 * statistics.median(one) / statistics.median(two)


def _encode_files(root, paths):
    field = FIELDS["image"]
    for path in paths:
        with open(os.path.join(root, path), "rb") as f:
            field.encode(f.read())


def work_ceiling(root, items, repeats, n=300):
    """What 2 processes give over 1 on the engines' own work now: fastload's encoding of
    the first ``n`` files (read, decode, shrink, encode), all in one process of a pool
    of 2, then half in each, alternating; medians. No engine in it: what an engine's
    2 workers could reach over 1 at best, on this work and this machine."""
    import functools
    import multiprocessing

    paths = [path for path, _ in items[:n]]
    encode = functools.partial(_encode_files, root)
    one, two = [], []
    with multiprocessing.Pool(2) as pool:
        pool.map(encode, [paths[:20], paths[:20]])  # both processes warm
        for _ in range(repeats):
            start = time.perf_counter()
            pool.apply(encode, (paths,))
            one.append(time.perf_counter() - start)
            start = time.perf_counter()
            pool.map(encode, [paths[: n // 2], paths[n // 2 :]], chunksize=1)
            two.append(time.perf_counter() - start)
    return statistics.median(one) / statistics.median(two)


def work_per_image(root, items, repeats, n=40):
    """CPU milliseconds per image of each side's work on the first ``n`` images in this
    process, alternating, medians of ``repeats``: fastload's field encoding the file's
    bytes (``JPEG(max_side=256).encode``), and the peers' Pillow path
    (``cluster_peers.shrink``, with this environment's Pillow)."""
    sys.path.insert(0, HERE)
    from cluster_peers import shrink

    field, chosen = FIELDS["image"], items[:n]

    def fastload_side():
        for path, _ in chosen:
            with open(os.path.join(root, path), "rb") as f:
                field.encode(f.read())

    def pillow_side():
        for path, label in chosen:
            shrink(root, path, label, 256)

    sides = {"fastload": fastload_side, "Pillow": pillow_side}
    samples = {name: [] for name in sides}
    for _ in range(repeats):
        for name, work in sides.items():
            start = time.process_time()
            work()
            samples[name].append((time.process_time() - start) * 1e3 / len(chosen))
    return {name: statistics.median(ms) for name, ms in samples.items()}


RUNS = {"dask": dask_runs, "ray": ray_runs, "spark": spark_runs}


def report(engine, samples, n):
    """Prints the medians of ``samples`` (as ``alternate`` gives them) in images/s: 2
    workers against 1 (and the median of each round's 1-worker seconds over its 2-worker
    seconds, runs of a round being close in time), and fastload's 2 workers against each
    peer."""
    rate = {key: n / statistics.median(seconds) for key, seconds in samples.items()}
    rounds = statistics.median(one / two for one, two in zip(samples[1], samples[2]))
    print(
        f"  {engine}: 1 worker {rate[1]:,.0f} images/s, 2 workers {rate[2]:,.0f} images/s: "
        f"{rate[2] / rate[1]:.2f}x (target >= 1.8x); the median of the rounds' own "
        f"ratios {rounds:.2f}x",
        flush=True,
    )
    for peer in (key for key in samples if not isinstance(key, int)):
        print(
            f"  {engine} (2 workers) against {PEER_NAMES[peer]}: {rate[peer]:,.0f} images/s, "
            f"fastload {rate[2] / rate[peer]:.2f}x (target >= 1x); "
            f"{written[peer] / 1e6:.1f} MB written against fastload's "
            f"{written['fastload'] / 1e6:.1f} MB",
            flush=True,
        )


def arguments():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--side", type=int, default=640)
    parser.add_argument("--engines", default="dask,ray,spark")
    parser.add_argument(
        "--ray-reservation",
        action="store_true",
        help="keep Ray Data's operator reservation on (its default), which on 2 CPUs runs "
        "the first write task alone",
    )
    parser.add_argument(
        "--dask-diagnostics",
        action="store_true",
        help="start Dask's clusters with its diagnostics at their defaults (the workers' "
        "statistical profiler every 10 ms, the event loops' tick every 20 ms), not lean",
    )
    parser.add_argument(
        "--peers",
        action="store_true",
        help="also LitData's optimize(num_workers=2) and Mosaic's MDS writer from Spark "
        "(local[2]) in each engine's rounds (bench/peers_env.sh first)",
    )
    args = parser.parse_args()
    if args.peers and not os.path.exists(PEERS_PYTHON):
        parser.error(f"--peers runs {PEERS_PYTHON}, which is missing: run bench/peers_env.sh")
    return args


def main():
    global n_rows
    args = arguments()
    work = tempfile.mkdtemp(prefix="fastload-bench-cluster-")
    try:
        root = os.path.join(work, "images")
        items = generate(root, args.n, args.side)
        n_rows = len(items)
        with open(os.path.join(work, "items.json"), "w") as f:
            json.dump(items, f)
        peers = peer_runs(PEERS, work, args.partitions) if args.peers else {}
        print(
            f"{args.n} JPEGs of {args.side}x{args.side * 3 // 4} -> longer side 256, "
            f"{args.partitions} partitions, {os.cpu_count()} CPUs"
        )
        print(f"the machine: 2 processes {machine_ceiling(5):.2f}x 1 (a Python loop)")
        if args.peers:
            ms = work_per_image(root, items, args.repeats)
            print(
                f"the work of an image, one core: fastload {ms['fastload']:.1f} ms of CPU, "
                f"the peers' Pillow {ms['Pillow']:.1f} ms",
                flush=True,
            )
        for engine in args.engines.split(","):
            # The other work on a shared machine comes and goes: the ceiling again, just
            # before each engine's runs.
            print(
                f"{engine}: the machine now {machine_ceiling(3):.2f}x, the work "
                f"{work_ceiling(root, items, 3):.2f}x",
                flush=True,
            )
            global ray_reservation, dask_diagnostics
            ray_reservation, dask_diagnostics = args.ray_reservation, args.dask_diagnostics
            driver_cpu.clear()
            worker_beside_cpu.clear()
            samples = RUNS[engine](items, root, work, args.partitions, args.repeats, peers)
            inside = " (the scheduler and the nannies run in it)" if engine == "dask" else ""
            print(
                f"  the driver process{inside}: "
                f"{statistics.median(driver_cpu):.2f} s of CPU per second of a write",
                flush=True,
            )
            if engine == "dask":
                lean = "at Dask's defaults" if dask_diagnostics else "lean"
                print(
                    f"  each worker process beside its task thread: "
                    f"{statistics.median(worker_beside_cpu):.2f} s of CPU per second of a "
                    f"write (Dask's diagnostics {lean})",
                    flush=True,
                )
            report(engine, samples, args.n)
    finally:
        shutil.rmtree(work, ignore_errors=True)


n_rows = 0
ray_reservation = False  # Ray Data's operator reservation (--ray-reservation)
dask_diagnostics = False  # Dask's diagnostics at its defaults (--dask-diagnostics)
driver_cpu = []  # this process's CPU seconds per second of each write of an engine
worker_beside_cpu = []  # a Dask worker's CPU beside its task thread per second of a write
written = {}  # bytes the last conversion of each side left on disk

if __name__ == "__main__":
    main()
