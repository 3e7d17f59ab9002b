"""GIL-bound Python loading: 2 threads vs 2 worker processes vs PyTorch's DataLoader.

Each observation tokenizes a ~2 KB string with a pure-Python loop into a fixed-length
int32 array, code that holds the GIL throughout: threads cannot run it in parallel,
processes can.

    python bench/gil.py [--items 4000] [--workers 2] [--repeats 5]
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import compare, peak_rss_mb

from fastload import DataLoader

WORDS = (
    "the quick brown fox jumps over lazy dog data loader keeps training loop fed "
    "with batches of tokens from text that python code splits word by word"
).split()


def make_texts(count, seed=0):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, 380)) for _ in range(count)]


def tokenize(text, length):
    """Token ids of the words of ``text`` (a hash per word, in a Python loop), padded or
    cut to ``length``."""
    ids = []
    word = 0
    for ch in text:
        if ch == " ":
            ids.append(word % 30000)
            word = 0
        else:
            word = (word * 31 + ord(ch)) & 0xFFFFFFFF
    ids.append(word % 30000)
    out = np.zeros(length, np.int32)
    n = min(length, len(ids))
    out[:n] = ids[:n]
    return out


class Tokenized:
    """A container (and a torch map-style dataset) of tokenized texts."""

    def __init__(self, texts, length=512):
        self.texts = texts
        self.length = length

    def __len__(self):
        return len(self.texts)

    def __getitem__(self, i):
        return tokenize(self.texts[i], self.length)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=4000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    data = Tokenized(make_texts(args.items))
    w, bs = args.workers, args.batch_size
    print(
        f"{args.items} items of {len(data.texts[0])} characters, batch {bs}, {w} workers, "
        f"{len(os.sched_getaffinity(0))} CPUs"
    )

    threads = DataLoader(data, bs, parallel=w, buffer=True)
    processes = DataLoader(data, bs, parallel=w, buffer=True, backend="process")
    candidates = {"fastload threads": threads, "fastload processes": processes}
    try:
        import torch.utils.data

        candidates["torch DataLoader"] = torch.utils.data.DataLoader(
            data, batch_size=bs, num_workers=w, persistent_workers=True
        )
    except ImportError:
        print("  (torch is not installed: no PyTorch DataLoader)")

    def epoch(loader):
        return lambda: sum(1 for _ in loader)

    for loader in candidates.values():
        epoch(loader)()  # warm up: start workers, allocate rings
    runs = {name: (epoch(loader), args.items) for name, loader in candidates.items()}
    medians = compare(runs, args.repeats, "fastload threads")
    if "torch DataLoader" in medians:
        ratio = medians["fastload processes"] / medians["torch DataLoader"]
        print(f"  processes / torch DataLoader: {ratio:.2f}x")
    print(f"  peak RSS {peak_rss_mb():.0f} MB (this process and its waited-for children)")
    processes.close()
    threads.close()


if __name__ == "__main__":
    main()
