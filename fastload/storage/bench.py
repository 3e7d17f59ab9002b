"""``python -m fastload bench FILE``: images/s of the standard training pipeline on a file."""
import time

from fastload.loader import DataLoader
from fastload.storage.reader import open as open_dataset
from fastload.transforms import Compose, DecodeImage, RandomHorizontalFlip, RandomResizedCrop
from fastload.views import mapobs

__all__ = ["bench_file"]

ENCODED = ("jpeg", "qoi")


def _image_and_label(ds):
    """The names of the first image field and the first integer field of ``ds``."""
    image = next((k for k, e in ds.encodings.items() if e in ENCODED + ("smart", "ndarray")),
                 None)
    if image is None:
        raise ValueError(f"no image field in {sorted(ds.encodings)} (encodings "
                         f"{sorted(set(ds.encodings.values()))})")
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
    return {"field": image, "encoding": column.encoding, "batches": count, "images": loaded,
            "first_batch_s": first or 0.0,
            "images_per_s": loaded / elapsed if elapsed > 0 else 0.0}
