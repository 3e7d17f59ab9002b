"""The peers of ``cluster.py --peers``: LitData's ``optimize`` and Mosaic Streaming's MDS
writer driven from Spark convert the same JPEG files as fastload's engines do, with the
same work per image: read the file, decode it in full (Pillow, no reduced-scale draft),
shrink it by area averaging (Pillow's BOX filter) to the size fastload gives
(``fit_size``: longer side ``--max-side``, rounded), encode it at fastload's JPEG
settings (quality, chroma subsampling, a restart marker every run of MCUs that
``JPEG(restart_px=32)`` writes), and store it with its label and path, uncompressed,
in the peer's files on local disk.

It runs in ``bench/.venv-peers`` (made by ``bench/peers_env.sh``), where fastload is not
installed; ``cluster.py`` runs it in a child process, one conversion a call:

  convert PEER ROOT ITEMS OUT [--workers 2] [--partitions 8] [--file-mb 64]
      the images listed in the JSON file ITEMS ([[path under ROOT, label], ...]) into
      the folder OUT: ``litdata``: ``litdata.optimize(num_workers=WORKERS)``;
      ``mosaic``: ``streaming.base.converters.dataframe_to_mds`` over a Spark DataFrame
      of PARTITIONS partitions on ``local[WORKERS]`` (Mosaic's documented way from
      Spark: an ``MDSWriter`` per task, the indexes merged by the driver; the
      DataFrame of (path, label) sent to the JVM in Arrow and repartitioned). Prints a
      JSON line: the seconds of the conversion call (LitData's include starting its
      worker processes, which ``optimize`` does each call; Spark is started and its
      Python workers have imported Mosaic's writer before the clock, as ``cluster.py``
      does with fastload's for its Spark runs), the rows and the bytes written. Raises
      RuntimeError unless the peer's index counts as many rows as there are images.
"""

import argparse
import io
import json
import os
import shutil
import sys
import time

from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # remote_peers, for Mosaic's import

PEERS = ("litdata", "mosaic")
# fastload's JPEG field defaults (``fastload.storage.JPEG``): quality 90, 4:2:0, a
# restart marker every run of MCUs at most 32 pixels across that divides the MCU row.
QUALITY = 90
SUBSAMPLING = 2  # Pillow's spelling of 4:2:0
MCU_WIDTH = 16  # pixels across an MCU at 4:2:0
RESTART_PX = 32
COLUMNS = {"image": "bytes", "label": "int64", "path": "str"}


def fit_size(h, w, max_side):
    """(h, w) with the longer side at most ``max_side``, as fastload rounds it."""
    if max(h, w) <= max_side:
        return h, w
    scale = max_side / max(h, w)
    return max(1, round(h * scale)), max(1, round(w * scale))


def restart_blocks(width):
    """MCUs per restart interval where fastload puts its markers for an image ``width``
    pixels across: the longest run of at most RESTART_PX pixels dividing the MCU row."""
    per_row = -(-width // MCU_WIDTH)
    blocks = max(1, RESTART_PX // MCU_WIDTH)
    while per_row % blocks:
        blocks -= 1
    return blocks


def shrink(root, path, label, max_side):
    """The stored row of one image: {"image": JPEG bytes at longer side ``max_side``,
    "label", "path"}, from the file ``root/path``."""
    with open(os.path.join(root, path), "rb") as f:
        data = f.read()
    img = Image.open(io.BytesIO(data))
    if img.mode != "RGB":
        img = img.convert("RGB")
    h, w = fit_size(img.height, img.width, max_side)
    if (h, w) != (img.height, img.width):
        img = img.resize((w, h), Image.Resampling.BOX)
    out = io.BytesIO()
    img.save(
        out,
        "JPEG",
        quality=QUALITY,
        subsampling=SUBSAMPLING,
        restart_marker_blocks=restart_blocks(w),
    )
    return {"image": out.getvalue(), "label": int(label), "path": path}


class Shrink:
    """``shrink`` over (path, label) items under ``root``: LitData's ``fn``."""

    def __init__(self, root, max_side):
        self.root, self.max_side = root, max_side

    def __call__(self, item):
        path, label = item
        return shrink(self.root, path, label, self.max_side)


def litdata_convert(root, items, out, args):
    """Seconds of ``litdata.optimize`` over ``items``; the rows its index lists. Its
    scratch folders (by default under /tmp) go beside ``out``."""
    for name, folder in (("CACHE", "chunks"), ("DATA_CACHE", "data")):
        os.environ[f"DATA_OPTIMIZER_{name}_FOLDER"] = f"{out}-{folder}"
    import litdata

    start = time.perf_counter()
    litdata.optimize(
        fn=Shrink(root, args.max_side),
        inputs=[tuple(item) for item in items],
        output_dir=out,
        chunk_bytes=int(args.file_mb * 2**20),
        num_workers=args.workers,
        verbose=False,
    )
    seconds = time.perf_counter() - start
    for name in ("chunks", "data"):
        shutil.rmtree(f"{out}-{name}", ignore_errors=True)
    with open(os.path.join(out, "index.json")) as f:
        rows = sum(chunk["chunk_size"] for chunk in json.load(f)["chunks"])
    return seconds, rows


def import_mosaic(frames):
    """A ``mapInPandas`` function that imports Mosaic's writer (and with it torch) in the
    worker; yields the rows it is given (Spark did not reuse, for the next job, a worker
    whose task gave no rows: the import fell in the job timed)."""
    import pandas
    from streaming import MDSWriter  # noqa: F401

    for frame in frames:
        yield pandas.DataFrame({"id": frame["id"]})


def spark_session(workers):
    """A local Spark of ``workers`` cores whose Python workers have started and imported
    Mosaic's writer, as a Spark cluster's workers stay up between jobs (``cluster.py``
    warms fastload's Spark workers likewise)."""
    from pyspark.sql import SparkSession

    # The workers run this environment's Python (a parent's PYSPARK_PYTHON, such as
    # cluster.py's own Spark runs set, would lack Mosaic), with the folder whose
    # sitecustomize lets them import Mosaic's package when they unpickle its task.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    site = os.path.join(HERE, "peers_site")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [site, os.environ.get("PYTHONPATH")]))
    spark = (
        SparkSession.builder.master(f"local[{workers}]")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.range(workers, numPartitions=workers).mapInPandas(import_mosaic, "id long").collect()
    return spark


def shrink_frames(frames, root, max_side):
    """Mosaic's ``udf_iterable``: the stored rows of a pandas batch of (path, label)."""
    for path, label in zip(frames["path"], frames["label"], strict=True):
        yield shrink(root, path, label, max_side)


def mosaic_convert(root, items, out, args):
    """Seconds of ``dataframe_to_mds`` over ``items`` on a local Spark; the rows of the
    merged index."""
    import pandas
    from remote_peers import import_streaming

    import_streaming()
    from streaming.base.converters import dataframe_to_mds

    spark = spark_session(args.workers)
    try:
        start = time.perf_counter()
        # A DataFrame held by the JVM (as one read from a table would be), sent there in
        # Arrow: no Python pass over the rows before Mosaic's.
        rows = pandas.DataFrame(items, columns=["path", "label"])
        frame = spark.createDataFrame(rows).repartition(args.partitions)
        dataframe_to_mds(
            frame,
            merge_index=True,
            mds_kwargs={
                "out": out,
                "columns": COLUMNS,
                "compression": None,
                "size_limit": int(args.file_mb * 2**20),
            },
            udf_iterable=shrink_frames,
            udf_kwargs={"root": root, "max_side": args.max_side},
        )
        seconds = time.perf_counter() - start
    finally:
        spark.stop()
    with open(os.path.join(out, "index.json")) as f:
        rows = sum(shard["samples"] for shard in json.load(f)["shards"])
    return seconds, rows


def folder_bytes(root):
    return sum(
        os.path.getsize(os.path.join(folder, name))
        for folder, _, names in os.walk(root)
        for name in names
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    convert = commands.add_parser("convert")
    convert.add_argument("peer", choices=PEERS)
    convert.add_argument("root")
    convert.add_argument("items")
    convert.add_argument("out")
    convert.add_argument("--workers", type=int, default=2)
    convert.add_argument("--partitions", type=int, default=8)
    convert.add_argument("--file-mb", type=float, default=64.0)
    convert.add_argument("--max-side", type=int, default=256)
    args = parser.parse_args()
    with open(args.items) as f:
        items = json.load(f)
    run = litdata_convert if args.peer == "litdata" else mosaic_convert
    seconds, rows = run(args.root, items, args.out, args)
    if rows != len(items):
        raise RuntimeError(f"{args.peer} wrote {rows} rows of {len(items)}")
    print(json.dumps({"seconds": seconds, "rows": rows, "bytes": folder_bytes(args.out)}))


if __name__ == "__main__":
    main()
