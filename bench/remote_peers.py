"""The peers of ``remote.py --peers``: Mosaic Streaming and LitData write the dataset's JPEG
bytes (as fastload stores them: not decoded, not encoded again) with its labels into files
of their own formats, and read them back from the S3 server through the proxy.

It runs in ``bench/.venv-peers`` (made by ``bench/peers_env.sh``: the two libraries beside a
CPU torch), where fastload is not installed; ``remote.py`` runs it in child processes:

  write PEER SAMPLES OUT --file-mb MB
      the (JPEG bytes, label) pairs pickled in SAMPLES as PEER's files of about MB
      megabytes in the folder OUT: Mosaic's MDS shards (``MDSWriter``, no compression),
      LitData's chunks (``litdata.optimize``); each sample also keeps its position, so
      that a read can show that it loaded every image once.
  read PEER URL --endpoint URL --n N
      one epoch of the files at ``s3://`` URL, in a fresh cache folder, through
      ``DataLoader(num_workers=2, batch_size=256)`` (LitData's ``StreamingDataLoader``, a
      torch ``DataLoader`` for Mosaic) with ``shuffle=True``; each item decoded by PIL, then
      RandomResizedCrop(224) and a flip (``pipelines.pil_crop_flip``). Prints a JSON line:
      images/s from the first batch to the end, seconds from the dataset's construction to
      the first batch, the peaks of the summed RSS and PSS of this process and its workers
      (MB), and the MB left in the cache folder at the end. Raises RuntimeError unless the
      epoch loaded each of the N images once.

The S3 credentials and Mosaic's endpoint come from the environment (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``, Mosaic's ``S3_ENDPOINT_URL``); LitData
takes the endpoint in ``storage_options``.
"""

import argparse
import io
import json
import os
import pickle
import shutil
import sys
import tempfile
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np
from common import TreeMemory, touch
from PIL import Image
from pipelines import pil_crop_flip

BATCH = 256
WORKERS = 2
PEERS = ("mosaic", "litdata")


def import_streaming():
    """Mosaic Streaming without its dataset-specific subpackages (``vision``, ``text``,
    ``multimodal``), which the package imports at its own import and which need
    torchvision: no torchvision build loads against a CPU torch here (PyPI's need CUDA's
    ``libc10_cuda.so``). This bench uses none of them."""
    for name in ("vision", "text", "multimodal"):
        sys.modules.setdefault(f"streaming.{name}", types.ModuleType(f"streaming.{name}"))
    import streaming

    return streaming


def train_item(jpeg, label, index):
    """The pipeline of an item: (224x224x3 uint8 array, label, position)."""
    with Image.open(io.BytesIO(jpeg)) as f:
        img = f.convert("RGB")
    return np.asarray(pil_crop_flip(img)), label, index


def litdata_item(sample):
    return train_item(sample["image"], sample["label"], sample["index"])


def litdata_sample(numbered):
    index, (jpeg, label) = numbered
    return {"image": jpeg, "label": label, "index": index}


def write(peer, samples, out, file_bytes):
    if peer == "mosaic":
        columns = {"image": "bytes", "label": "int", "index": "int"}
        with import_streaming().MDSWriter(out=out, columns=columns, size_limit=file_bytes) as w:
            for index, (jpeg, label) in enumerate(samples):
                w.write({"image": jpeg, "label": label, "index": index})
    else:
        import litdata

        litdata.optimize(
            fn=litdata_sample,
            inputs=list(enumerate(samples)),
            output_dir=out,
            chunk_bytes=file_bytes,
            num_workers=1,
        )


def mosaic_loader(url, cache):
    import torch.utils.data as tud

    streaming = import_streaming()

    class Images(streaming.StreamingDataset):
        def get_item(self, idx):
            sample = super().get_item(idx)
            return train_item(sample["image"], sample["label"], sample["index"])

    data = Images(remote=url, local=cache, shuffle=True, batch_size=BATCH)
    return tud.DataLoader(data, batch_size=BATCH, num_workers=WORKERS)


def litdata_loader(url, cache, endpoint):
    import litdata
    import litdata.streaming.downloader as downloader

    # Its workers fetch chunks through obstore, whose client options LitData fixes, without
    # allow_http (obstore then ignores AWS_ALLOW_HTTP): the store here speaks plain HTTP.
    downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": True}
    data = litdata.StreamingDataset(
        url,
        cache_dir=cache,
        shuffle=True,
        storage_options={"endpoint_url": endpoint},
        transform=litdata_item,
    )
    return litdata.StreamingDataLoader(data, batch_size=BATCH, num_workers=WORKERS)


def folder_bytes(root):
    return sum(
        os.path.getsize(os.path.join(folder, name))
        for folder, _, names in os.walk(root)
        for name in names
    )


def epoch(peer, url, endpoint, cache):
    """One epoch: (seconds to the first batch, seconds from it to the end, positions loaded
    in batches after the first, positions of the first batch)."""
    start = time.perf_counter()
    loader = mosaic_loader(url, cache) if peer == "mosaic" else litdata_loader(url, cache, endpoint)
    batches = iter(loader)
    first_batch = next(batches)
    first = time.perf_counter()
    rest = []
    for batch in batches:
        touch(batch)
        rest.append(np.asarray(batch[2]))
    end = time.perf_counter()
    return first - start, end - first, rest, np.asarray(first_batch[2])


def read(peer, url, endpoint, n):
    cache = tempfile.mkdtemp(prefix=f"{peer}-cache-")
    try:
        with TreeMemory() as memory:
            first_s, rest_s, rest, first = epoch(peer, url, endpoint, cache)
        disk = folder_bytes(cache)
    finally:
        shutil.rmtree(cache)
    loaded = np.concatenate([first, *rest])
    if len(loaded) != n or len(np.unique(loaded)) != n:
        raise RuntimeError(
            f"{peer} loaded {len(loaded)} images, {len(np.unique(loaded))} distinct, of {n}"
        )
    images = len(loaded) - len(first)
    result = {
        "rate": images / rest_s,
        "first_s": first_s,
        "rss_mb": memory.rss / 2**20,
        "pss_mb": memory.pss / 2**20,
        "unreclaimable_mb": memory.unreclaimable / 2**20,
        "disk_mb": disk / 1e6,
    }
    print(json.dumps(result))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    writer = commands.add_parser("write")
    writer.add_argument("peer", choices=PEERS)
    writer.add_argument("samples")
    writer.add_argument("out")
    writer.add_argument("--file-mb", type=float, default=4.0)
    reader = commands.add_parser("read")
    reader.add_argument("peer", choices=PEERS)
    reader.add_argument("url")
    reader.add_argument("--endpoint", required=True)
    reader.add_argument("--n", type=int, required=True)
    args = parser.parse_args()
    if args.command == "write":
        with open(args.samples, "rb") as f:
            samples = pickle.load(f)
        write(args.peer, samples, args.out, int(args.file_mb * 2**20))
    else:
        read(args.peer, args.url, args.endpoint, args.n)


if __name__ == "__main__":
    main()
