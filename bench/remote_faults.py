"""Memory-bounded epochs over a packed dataset at a URL while faults are injected at
random: every epoch must end whole and right, or in the ``LoadError`` naming the URL;
never an internal error, never a wrong row.

The dataset (1,200 rows in 75 blocks of 16 KB: an array, a label, bytes) is served by the
tests' HTTP range server (``tests/servers.py``) and opened with ``memory_bytes=60_000``,
``cache_bytes=0`` and ``timeout=5``. Epochs take threads, the caller's thread and worker
processes in turn, ``shuffle="quasi"``. A thread injects a fault every 50-300 ms: a 500
or 503 answer, a body cut short, a short 206, or a byte flipped for 3 ms. Each batch's
array and bytes are checked against its labels, and each whole epoch against every row
once. Prints the epochs' outcomes per path and the faults injected.

Usage: python bench/remote_faults.py [--epochs 120]
"""

import argparse
import collections
import pathlib
import random
import sys
import tempfile
import threading
import time
import warnings

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
import numpy as np
from servers import RangeServer

import fastload
from fastload import DataLoader, LoadError
from fastload.storage import Bytes, Raw

N = 1200
PATHS = {
    "threads": {"parallel": 2},
    "caller's thread": {"parallel": False},
    "worker processes": {"parallel": 2, "backend": "process"},
}


def _inject(server, bulk, rng, stop, injected):
    while not stop.wait(rng.uniform(0.05, 0.3)):
        kind = rng.choice(["5xx", "cut", "short", "flip"])
        injected[kind] += 1
        if kind == "5xx":
            server.fail_next(1, rng.choice([500, 503]))
        elif kind == "cut":
            server.cut_next(1)
        elif kind == "short":
            server.short_next(1)
        else:
            start, end = rng.choice(bulk)
            server.altered = rng.randrange(start, end)
            time.sleep(0.003)
            server.altered = None


def _epoch(ds, seed, options):
    seen = []
    for batch in DataLoader(ds, batch_size=16, shuffle="quasi", seed=seed, **options):
        labels = np.asarray(batch["label"])
        if not (np.asarray(batch["x"])[:, 0, 0] == labels % 251).all():
            raise AssertionError("a wrong row: its array is another's")
        if any(bytes(t) != bytes([k % 251]) * 8 for t, k in zip(batch["tag"], labels)):
            raise AssertionError("a wrong row: its bytes are another's")
        seen.extend(labels.tolist())
    if sorted(seen) != list(range(N)):
        raise AssertionError("rows missing or doubled")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=120)
    args = parser.parse_args()
    root = pathlib.Path(tempfile.mkdtemp(prefix="fastload-faults-"))
    rows = [
        {"x": np.full((32, 32), i % 251, np.uint8), "label": i, "tag": bytes([i % 251]) * 8}
        for i in range(N)
    ]
    fields = {"x": Raw((32, 32), "uint8"), "label": "int64", "tag": Bytes()}
    fastload.write(root / "all.arrow", rows, fields, block_bytes=16 << 10, progress=False)
    server = RangeServer(root)
    outcomes, injected, rng = collections.Counter(), collections.Counter(), random.Random(0)
    warnings.simplefilter("ignore")  # the wave over memory_bytes: meant here
    try:
        for e in range(args.epochs):
            name = list(PATHS)[e % len(PATHS)]
            ds = fastload.open(
                f"{server.url}/all.arrow", cache_bytes=0, memory_bytes=60_000, timeout=5
            )
            bulk = [r for block in ds.remote_rows.blocks for r in block.ranges]
            stop = threading.Event()
            faults = threading.Thread(
                target=_inject, args=(server, bulk, rng, stop, injected), daemon=True
            )
            faults.start()
            try:
                _epoch(ds, e, PATHS[name])
                outcomes[name, "whole and right"] += 1
            except LoadError as error:
                outcomes[
                    name,
                    "LoadError naming the URL"
                    if "all.arrow" in str(error)
                    else f"LoadError: {error}",
                ] += 1
            except Exception as error:  # what must never happen: counted, shown
                outcomes[name, f"{type(error).__name__}: {error}"[:200]] += 1
            finally:
                stop.set()
                faults.join()
                server.altered = None
            del ds
    finally:
        server.stop()
    for (name, outcome), count in sorted(outcomes.items()):
        print(f"  {name:17} {count:4} {outcome}")
    print(f"  faults injected: {dict(injected)}")


if __name__ == "__main__":
    main()
