"""Command line: ``python -m fastload <command> ...``; ``--help`` lists the commands.

Each command is an entry of COMMANDS: name -> (help line, function adding its arguments to
an argparse parser, function running it with the parsed arguments and returning an exit
code). A failure the user can fix (a missing path, a corrupt file) prints one line and
exits with status 2.
"""

import argparse
import json
import sys
import time

from fastload import __version__
from fastload._images.codecs import build_info
from fastload._storage.fields import SUBSAMPLINGS
from fastload._storage.remote import is_url
from fastload.cluster.convert import ENGINES, convert_parts
from fastload.demo import run_image_demo, run_tensor_demo
from fastload.errors import LoadError
from fastload.loader import DataLoader
from fastload.storage.convert import DEFAULT_SMART_THRESHOLD, MODES, convert, image_encoding
from fastload.storage.info import describe
from fastload.storage.parts import clean
from fastload.storage.reader import open as open_dataset
from fastload.transforms import Compose, DecodeImage, RandomHorizontalFlip, RandomResizedCrop
from fastload.views import mapobs


def _add_convert_args(p):
    p.add_argument(
        "src",
        help="folder with one subfolder of image files per class "
        "(labels: sorted class names -> 0, 1, ...)",
    )
    p.add_argument("dst", help="output file, e.g. train.arrow, or a URL: s3://bucket/train.arrow")
    _add_storage_options(p)
    p.add_argument(
        "--mode",
        choices=MODES,
        default="jpeg",
        help="how images are stored: jpeg (lossy; JPEG files kept as they are "
        "unless resized), raw (decoded pixels), qoi (lossless), smart "
        "(raw when small, else jpeg); default: %(default)s",
    )
    p.add_argument(
        "--quality",
        type=int,
        default=90,
        metavar="Q",
        help="JPEG quality 1..100 for jpeg and smart; default: %(default)s",
    )
    p.add_argument(
        "--subsampling",
        choices=SUBSAMPLINGS,
        default="420",
        help="JPEG chroma subsampling for jpeg and smart: 444 (full colour), 422 or 420 "
        "(as Pillow, OpenCV and FFCV write); default: %(default)s",
    )
    p.add_argument(
        "--restart-px",
        type=int,
        default=32,
        metavar="PX",
        help="JPEG restart markers for jpeg and smart: one after every run of MCUs at most "
        "PX pixels across, so that crops decode only their part, added losslessly to JPEG "
        "files kept at their size too; 0: none; default: %(default)s",
    )
    p.add_argument(
        "--keep-given",
        action="store_true",
        help="store JPEG files that need no resize byte for byte, without restart markers",
    )
    p.add_argument(
        "--max-side",
        type=int,
        default=None,
        metavar="PX",
        help="shrink images whose longer side exceeds PX pixels",
    )
    p.add_argument(
        "--threshold",
        type=int,
        default=None,
        metavar="BYTES",
        help="smart mode: images of at most BYTES decoded bytes are stored raw; default: 64*64*3",
    )
    _add_parallel_args(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_block_bytes(p)
    p.add_argument(
        "--no-check",
        action="store_true",
        help="store JPEG (and QOI) files as they are without decoding them first: faster, "
        "but a file that cannot be decoded is then found in training, not here",
    )
    p.add_argument(
        "--on-error",
        choices=("raise", "skip"),
        default="raise",
        help="a file that cannot be read, decoded or encoded stops the conversion "
        "(raise) or is left out and listed at the end (skip); "
        "default: %(default)s",
    )
    _add_engine_args(p)


def _add_engine_args(p):
    p.add_argument(
        "--engine",
        choices=ENGINES,
        default=None,
        help="pack on a cluster's engine, one task per partition, into DST as a dataset "
        "written in parts and committed whole (docs/cluster.md); default: this machine's "
        "threads, into one file",
    )
    p.add_argument(
        "--address",
        default=None,
        help="with --engine: the cluster to run on (Ray's address, Dask's scheduler, Spark's "
        "master URL); default: a local one of --workers processes, started here",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="with --engine: the local cluster's worker processes, one core each; default: 2",
    )
    p.add_argument("--partitions", type=int, default=None, help="with --engine: tasks")
    p.add_argument(
        "--overwrite", action="store_true", help="with --engine: replace a dataset at DST"
    )


def _add_parallel_args(p):
    """``--parallel N``, and ``--threads N``, its old spelling (one or the other)."""
    workers = p.add_mutually_exclusive_group()
    workers.add_argument(
        "--parallel",
        type=int,
        default=None,
        metavar="N",
        help="encoder threads (convert's parallel=); default: one per CPU",
    )
    workers.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="deprecated: the old spelling of --parallel N (removed in 0.4)",
    )


def _add_block_bytes(p):
    p.add_argument(
        "--block-bytes",
        type=int,
        default=None,
        metavar="N",
        help="encoded bytes per block, the unit of quasi-random order and, at a URL, of a "
        "request; default: 64 MiB for a local file, 4 MiB at a URL",
    )


def _add_storage_options(p):
    p.add_argument(
        "--storage-options",
        type=_json_object,
        default=None,
        metavar="JSON",
        help="for a URL: fsspec's storage options as a JSON object, e.g. "
        '\'{"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}\'; '
        "credentials otherwise come from the store's usual places (environment, files)",
    )


def _json_object(text):
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("storage options must be a JSON object")
    return value


def _opened(args):
    """The dataset at ``args.path``; at a URL with the storage options given, and no
    cache on disk (a command reads each block once)."""
    if is_url(args.path):
        return open_dataset(args.path, storage_options=args.storage_options, cache_bytes=0)
    return open_dataset(args.path, storage_options=args.storage_options)


def _convert_parallel(args):
    """``parallel=`` of ``convert``: ``--parallel N``, or the old ``--threads N``, which
    still works in this release and says so on stderr."""
    if args.threads is None:
        return True if args.parallel is None else args.parallel
    print(
        f"DeprecationWarning: --threads {args.threads} is deprecated: write --parallel "
        f"{args.threads} (--threads goes in fastload 0.4)",
        file=sys.stderr,
    )
    return args.threads


def _run_convert(args):
    _check_engine_args(args)
    if args.engine is not None:
        return _run_engine_convert(args)
    n, skipped = convert(
        args.src,
        args.dst,
        mode=args.mode,
        quality=args.quality,
        subsampling=args.subsampling,
        restart_px=args.restart_px or None,
        keep_given=args.keep_given,
        max_side=args.max_side,
        threshold_bytes=args.threshold if args.threshold is not None else DEFAULT_SMART_THRESHOLD,
        parallel=_convert_parallel(args),
        progress=not args.no_progress,
        on_error=args.on_error,
        check=not args.no_check,
        storage_options=args.storage_options,
        block_bytes=args.block_bytes,
    )
    print(f"wrote {n} images to {args.dst}")
    if skipped:
        print(f"skipped {len(skipped)} files that could not be read or encoded:")
        for error in skipped:
            print(f"  {error}")
    return 0


def _check_engine_args(args):
    """Raises ValueError for options that the chosen path would ignore: encoder threads
    with an engine (its workers are processes), an engine's options without one."""
    if args.engine is not None:
        threads = [o for o in ("parallel", "threads") if getattr(args, o, None) is not None]
        if threads:
            raise ValueError(
                f"--{threads[0]} does not apply with --engine: --workers sets the engine's "
                "processes (one encoder thread each)"
            )
    else:
        given = [f"--{o}" for o in ("workers", "partitions", "address") if getattr(args, o)]
        given += ["--overwrite"] if args.overwrite else []
        if given:
            raise ValueError(f"{', '.join(given)} apply only with --engine ray|dask|spark")
    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")


def _run_engine_convert(args):
    encoding = image_encoding(
        args.mode,
        args.quality,
        args.max_side,
        args.threshold if args.threshold is not None else DEFAULT_SMART_THRESHOLD,
        not args.no_check,
        args.subsampling,
        restart_px=args.restart_px or None,
        keep_given=args.keep_given,
    )
    committed = convert_parts(
        args.src,
        args.dst,
        encoding,
        args.engine,
        address=args.address,
        workers=2 if args.workers is None else args.workers,
        partitions=args.partitions,
        storage_options=args.storage_options,
        on_error=args.on_error,
        progress=not args.no_progress,
        overwrite=args.overwrite,
        block_bytes=getattr(args, "block_bytes", None),  # None: the prefix's default
    )
    print(f"wrote {committed.rows} images to {args.dst} in {len(committed.files)} parts")
    if committed.skipped:
        print(f"skipped {len(committed.skipped)} files that could not be read or encoded:")
        for error in committed.skipped:
            print(f"  {error}")
    return 0


def _add_info_args(p):
    p.add_argument(
        "path",
        nargs="?",
        help="a dataset file, a directory of files, or a "
        "glob (or the same at a URL); without it: what this build decodes with",
    )
    _add_storage_options(p)


def _run_info(args):
    if args.path is None:
        for key, value in build_info().items():
            print(f"{key}: {value}")
        return 0
    print("\n".join(describe(_opened(args))))
    return 0


# ---- bench: images/s of the standard training pipeline on a dataset file ----------

ENCODED = ("jpeg", "qoi")


def _image_and_label(ds):
    """The names of the first image field and the first integer field of ``ds``."""
    image = next((k for k, e in ds.encodings.items() if e in ENCODED + ("smart", "ndarray")), None)
    if image is None:
        raise ValueError(
            f"no image field in {sorted(ds.encodings)} (encodings "
            f"{sorted(set(ds.encodings.values()))})"
        )
    label = next((k for k in ds.keys() if k != image and ds.encodings[k] == "scalar"), None)
    return image, label


def bench_file(path, *, batches=20, batch_size=256, size=224, parallel=True):
    """Load ``batches`` batches (or the whole epoch, when it has fewer) of
    RandomResizedCrop(size) + flip (uint8) from the dataset at ``path`` and return
    {"images_per_s", "first_batch_s", "batches", "images", "field", "encoding"}.

    Images/s is what a plain timing loop around the iteration gives: the images actually
    loaded (a partial last batch counts its own length) over the time from the start of
    the iteration to the last batch, first batch included; ``first_batch_s`` also counts
    opening the file."""
    start = time.perf_counter()
    ds = open_dataset(path)
    image, label = _image_and_label(ds)
    column = ds[image]
    if column.encoding in ENCODED:
        source, ops = column.encoded, [DecodeImage()]
    else:
        source, ops = column, []
    pipeline = Compose(ops + [RandomResizedCrop(size), RandomHorizontalFlip()])
    data = mapobs(pipeline, source)
    if label is not None:
        data = (data, ds[label])
    loader = DataLoader(data, batch_size, shuffle=True, seed=0, parallel=parallel, buffer=True)
    first = None
    count = loaded = 0
    iterating = time.perf_counter()
    for batch in loader:
        first = time.perf_counter() - start if first is None else first
        count += 1
        loaded += len(batch[0] if isinstance(batch, tuple) else batch)
        if count >= batches:
            break
    elapsed = time.perf_counter() - iterating
    loader.close()
    return {
        "field": image,
        "encoding": column.encoding,
        "batches": count,
        "images": loaded,
        "first_batch_s": first or 0.0,
        "images_per_s": loaded / elapsed if elapsed > 0 else 0.0,
    }


def _add_bench_args(p):
    p.add_argument("path", help="a dataset file (from convert), a directory of files, or a glob")
    p.add_argument("--batches", type=int, default=20, help="batches to load; default: %(default)s")
    p.add_argument("--batch-size", type=int, default=256, help="default: %(default)s")
    p.add_argument("--size", type=int, default=224, help="crop size; default: %(default)s")


def _run_bench(args):
    r = bench_file(args.path, batches=args.batches, batch_size=args.batch_size, size=args.size)
    print(
        f"{r['field']} ({r['encoding']}): RandomResizedCrop({args.size}) + flip, batch "
        f"{args.batch_size}: {r['images_per_s']:,.0f} images/s over {r['batches']} batches "
        f"({r['images']:,} images, first batch included); "
        f"first batch after {r['first_batch_s']:.2f} s (open included)"
    )
    return 0


def _add_verify_args(p):
    p.add_argument("path", help="a dataset file, a directory of files, or a glob, or a URL")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_storage_options(p)


def _run_verify(args):
    result = _opened(args).verify(progress=not args.no_progress)
    print(
        f"{args.path}: {result['blocks']} blocks of {result['files']} file(s) match their checksums"
    )
    for path in result["unverified"]:
        print(f"  {path}: no checksums (written by an older fastload): not verified")
    return 0


def _add_clean_args(p):
    p.add_argument("prefix", help="the directory or URL prefix of a dataset written in parts")
    _add_storage_options(p)


def _run_clean(args):
    removed = clean(args.prefix, args.storage_options)
    print(f"{args.prefix}: removed {len(removed)} files that no manifest lists")
    return 0


def _add_demo_args(p):
    pass


def _run_demo(args):
    run_tensor_demo()
    print()
    run_image_demo()
    return 0


COMMANDS = {
    "convert": (
        "pack a folder of class subfolders of images into a dataset file",
        _add_convert_args,
        _run_convert,
    ),
    "info": (
        "show the fields, encodings, rows, blocks and sizes of a dataset, or without "
        "one, what this build of fastload decodes with",
        _add_info_args,
        _run_info,
    ),
    "bench": (
        "images/s of the standard training pipeline (RandomResizedCrop + flip) on a dataset",
        _add_bench_args,
        _run_bench,
    ),
    "verify": (
        "check every block of a dataset against the checksums its writer stored",
        _add_verify_args,
        _run_verify,
    ),
    "clean": (
        "remove the part files of a dataset written in parts that its manifest does not "
        "list (failed or duplicate attempts; every part of a write that was not committed)",
        _add_clean_args,
        _run_clean,
    ),
    "demo": (
        "load generated tensors and images, and print items/s against a plain loop",
        _add_demo_args,
        _run_demo,
    ),
}


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m fastload", description="fastload command line tools"
    )
    parser.add_argument("--version", action="version", version=f"fastload {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="command")
    for name, (help_line, add_args, _) in COMMANDS.items():
        add_args(sub.add_parser(name, help=help_line, description=help_line))
    return parser


def main(argv=None):
    """Run the command line; returns the exit status (0 ok, 2 usage or input error)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return COMMANDS[args.command][2](args)
    except (OSError, ValueError, LoadError) as exc:
        print(f"python -m fastload {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
