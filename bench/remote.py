"""A packed JPEG dataset read from object storage against the same file read from local
disk, side by side in one run; with ``--peers``, Mosaic Streaming and LitData reading the
same images from the same store too.

The store is moto's S3 server on 127.0.0.1, reached through a proxy of this script that
makes the network look like a cluster's: each request waits ``--latency-ms`` before it
reaches the server, and the answers share a bandwidth of ``--mbps`` megabits per second.

1. The dataset: ``images.py``'s synthetic ImageFolder (``--n`` images, about 450x400)
   converted as FFCV's ImageNet recipe (JPEG quality 90, longer side at most 256, no
   restart markers) into blocks of ``--block-mb`` MB, on local disk and uploaded to the
   server. With ``--peers``, the same JPEG bytes and labels also in each peer's files of
   ``--peer-file-mb`` MB (Mosaic's MDS "shards", LitData's "chunks"; by default
   ``--block-mb``, where both libraries' own default is 64 MB), uploaded beside it
   (``remote_peers.py``).
2. Each run is a fresh child process that opens the dataset (the local file, already in
   the page cache; or its URL through the proxy with ``cache_bytes=0``: every block
   fetched, nothing on disk; once more with ``memory_bytes`` at ``--memory-part`` of the
   file, so that its blocks are let go after use) and loads one epoch of
   ``DataLoader((mapobs(Compose([DecodeImage(), RandomResizedCrop(224),
   RandomHorizontalFlip()]), ds["image"].encoded), ds["label"]), 256, shuffle="quasi",
   parallel=2, buffer=True)``. A peer's run (``remote_peers.py read``, in the
   environment that ``bench/peers_env.sh`` makes) streams its files from the same
   server through the same proxy into a fresh cache folder, with ``shuffle=True``, two
   worker processes, batches of 256, each image decoded by PIL, cropped (the same
   RandomResizedCrop(224)) and flipped in a worker.
3. Each run counts the images it loaded (every image once, or the run fails), and
   measures: images/s from the first batch to the end (steady state); the time from
   ``open`` (a peer: its dataset's construction) to the first batch; the MB that crossed
   the proxy; the peak memory of the process and its workers, sampled every 10 ms (the
   sum of their PSS, where a page shared by k processes counts 1/k in each, so that the
   workers' forked pages count once; the part of it in anonymous and shared-memory pages,
   which the kernel cannot reclaim for the training process, as it can a mapped file's
   clean pages; and the sum of their RSS, which counts them in each);
   fastload's child has no worker processes, its threads are in its own memory. Also the
   MB left on local disk (a peer's cache folder at the end; fastload writes nothing), and
   the CPU time the store and the proxy took meanwhile (this script's threads: the HTTP
   server, the proxy; moto runs in a process of its own, not counted), CPU that a
   cluster's store does not take from the loader. Each loop reads a byte of every page of
   each batch, as a training step would. A run with ``memory_bytes`` also reports the
   most bytes of blocks it held (sampled at each batch).
4. The kinds of runs alternate, ``--repeats`` of each; medians.

Usage (fastload built in place; the peers' environment made once):
  bench/peers_env.sh
  python bench/remote.py [--n 4000] [--repeats 5] [--latency-ms 20]
      [--mbps 1000] [--block-mb 4] [--memory-part 0.5] [--peers] [--peer-file-mb MB]
      [--baseline DIR]
"""

import argparse
import asyncio
import json
import os
import pickle
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(sys.path[0]), "tests"))  # servers.py: moto's
from common import TreeMemory, touch

HERE = os.path.dirname(os.path.abspath(__file__))
BATCH = 256
PEERS = {"Mosaic Streaming, S3": "mosaic", "LitData, S3": "litdata"}
PEERS_PYTHON = os.path.join(HERE, ".venv-peers", "bin", "python")
PEERS_SCRIPT = os.path.join(HERE, "remote_peers.py")


class Proxy:
    """A TCP proxy on 127.0.0.1 in a thread: each chunk a client sends reaches
    ``target`` ``latency`` seconds later; what comes back shares ``rate`` bytes/s.
    ``received`` counts the bytes sent back to clients."""

    def __init__(self, target_port, latency, rate):
        self.target_port, self.latency, self.rate = target_port, latency, rate
        self.received = 0
        self._next_free = 0.0  # when the shared link is free again
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        threading.Thread(target=self._serve, args=(started,), daemon=True).start()
        started.wait()

    def _serve(self, started):
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        started.set()
        self.loop.run_forever()

    async def _client(self, reader, writer):
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(
            self._pump(reader, up_writer, delayed=True),
            self._pump(up_reader, writer, delayed=False),
            return_exceptions=True,
        )

    async def _pump(self, reader, writer, delayed):
        try:
            while chunk := await reader.read(1 << 16):
                if delayed:
                    await asyncio.sleep(self.latency)
                else:
                    now = self.loop.time()
                    self._next_free = max(self._next_free, now) + len(chunk) / self.rate
                    await asyncio.sleep(self._next_free - now)
                    self.received += len(chunk)
                writer.write(chunk)
                await writer.drain()
        finally:
            writer.close()


class RangeFiles:
    """An HTTP server of the files in ``root`` on 127.0.0.1, in threads: HEAD, and GET of
    one byte range read with ``os.pread`` (what a store's front end costs, not more),
    with an ETag honoured in If-Match."""

    def __init__(self, root):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self._answer(body=False)

            def do_GET(self):
                self._answer(body=True)

            def _answer(self, body):
                path = os.path.join(root, self.path.lstrip("/"))
                try:
                    fd = os.open(path, os.O_RDONLY)
                except OSError:
                    return self.send_error(404)
                try:
                    st = os.fstat(fd)
                    etag = f'"{st.st_size:x}-{st.st_mtime_ns:x}"'
                    if self.headers.get("If-Match", etag) != etag:
                        return self.send_error(412)
                    start, end, status = 0, st.st_size, 200
                    ranged = self.headers.get("Range", "")
                    if ranged.startswith("bytes="):
                        first, _, last = ranged[6:].partition("-")
                        start, end, status = int(first), min(int(last) + 1, st.st_size), 206
                    self.send_response(status)
                    self.send_header("Content-Length", str(end - start))
                    self.send_header("Accept-Ranges", "bytes")
                    self.send_header("ETag", etag)
                    if status == 206:
                        self.send_header("Content-Range", f"bytes {start}-{end - 1}/{st.st_size}")
                    self.end_headers()
                    if body:
                        self.wfile.write(os.pread(fd, end - start, start))
                finally:
                    os.close(fd)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def child(where, storage_options, memory_bytes):
    """One epoch in this process; prints a JSON line of what it measured."""
    from pipelines import train_ops

    import fastload
    from fastload.transforms import Compose

    with TreeMemory() as memory:
        start = time.perf_counter()
        if "://" in where:
            ds = fastload.open(
                where,
                storage_options=storage_options or None,
                cache_bytes=0,
                memory_bytes=memory_bytes,
            )
        else:
            ds = fastload.open(where)
        loader = fastload.DataLoader(
            (fastload.mapobs(Compose(train_ops(False)), ds["image"].encoded), ds["label"]),
            BATCH,
            shuffle="quasi",
            parallel=2,
            buffer=True,
            seed=0,
        )
        remote = getattr(ds, "remote_rows", None)
        bounded = remote is not None and remote.bounded
        it = iter(loader)
        loaded = first_size = len(next(it)[1])
        first = time.perf_counter()
        held = 0
        for batch in it:
            touch(batch)
            loaded += len(batch[1])
            if bounded:
                held = max(held, remote.held_bytes())
        end = time.perf_counter()
    if loaded != len(ds):
        raise RuntimeError(f"fastload loaded {loaded} images of {len(ds)}")
    result = {"rate": (loaded - first_size) / (end - first), "first_s": first - start}
    result["disk_mb"] = 0.0  # cache_bytes=0: nothing written
    result["held_mb"] = held / 2**20
    result.update(rss_mb=memory.rss / 2**20, pss_mb=memory.pss / 2**20)
    print(json.dumps({**result, "unreclaimable_mb": memory.unreclaimable / 2**20}))


def run_child(argv, env=None):
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def build(args, folder):
    """The dataset in ``folder``, printed; returns its path."""
    from images import DEFAULT_ROOT, generate

    import fastload
    from fastload.storage.convert import convert

    root = f"{DEFAULT_ROOT}-{args.n}"
    generate(root, args.n)
    path = os.path.join(folder, "train.arrow")
    blocks = int(args.block_mb * 2**20)
    # Without restart markers: the files README's figures of this bench were measured on
    # (what markers change in reading is recipe256.py's).
    convert(
        root,
        path,
        mode="jpeg",
        quality=90,
        max_side=256,
        restart_px=None,
        progress=False,
        block_bytes=blocks,
    )
    ds = fastload.open(path)
    size = os.path.getsize(path)
    print(
        f"{len(ds)} JPEGs (longer side 256, quality 90), {size / 1e6:.1f} MB in {ds.num_blocks} "
        f"blocks; network: {args.latency_ms:g} ms a request, {args.mbps:g} Mbit/s"
    )
    return path


def write_peers(folder, path, file_mb):
    """The dataset's JPEG bytes and labels in each peer's files, in ``folder``; returns
    {peer: its folder}."""
    import fastload

    ds = fastload.open(path)
    images, labels = ds["image"].encoded, ds["label"]
    samples = os.path.join(folder, "samples.pickle")
    with open(samples, "wb") as f:
        pickle.dump([(bytes(images[i]), int(labels[i])) for i in range(len(ds))], f)
    outs = {}
    for peer in PEERS.values():
        outs[peer] = os.path.join(folder, peer)
        argv = [PEERS_PYTHON, PEERS_SCRIPT, "write", peer, samples, outs[peer]]
        done = subprocess.run(argv + ["--file-mb", str(file_mb)], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{peer} could not write its files:\n{done.stderr[-3000:]}")
    os.remove(samples)
    for peer, out in outs.items():
        files = sorted(os.listdir(out))
        size = sum(os.path.getsize(os.path.join(out, name)) for name in files)
        print(f"  {peer}: {size / 1e6:.1f} MB in {len(files)} files")
    return outs


def plan(args, server, files, path, peer_folders):
    """{name: (argv, environment or None, the proxy it reads through or None)}."""
    to_s3 = Proxy(server.port, args.latency_ms / 1e3, args.mbps * 1e6 / 8)
    to_http = Proxy(files.port, args.latency_ms / 1e3, args.mbps * 1e6 / 8)
    endpoint = f"http://127.0.0.1:{to_s3.port}"
    options = dict(server.storage_options)
    options["client_kwargs"] = {**options["client_kwargs"], "endpoint_url": endpoint}

    def fastload_child(where, opts, memory=None):
        argv = [sys.executable, __file__, "--child", where, "--options", json.dumps(opts)]
        return argv + (["--memory-bytes", str(memory)] if memory else [])

    budget = int(os.path.getsize(path) * args.memory_part)

    runs = {
        "local disk": (fastload_child(path, {}), None, None),
        "HTTP through the proxy": (
            fastload_child(f"http://127.0.0.1:{to_http.port}/train.arrow", {}),
            None,
            to_http,
        ),
        "S3 (moto) through it": (fastload_child("s3://bench/train.arrow", options), None, to_s3),
        f"HTTP, memory_bytes {budget / 2**20:.0f} MiB": (
            fastload_child(f"http://127.0.0.1:{to_http.port}/train.arrow", {}, budget),
            None,
            to_http,
        ),
    }
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": options["key"],
        "AWS_SECRET_ACCESS_KEY": options["secret"],
        "AWS_DEFAULT_REGION": options["client_kwargs"]["region_name"],
        "AWS_EC2_METADATA_DISABLED": "true",
        "S3_ENDPOINT_URL": endpoint,  # Mosaic's
        "LITDATA_DISABLE_VERSION_CHECK": "1",  # else each run asks PyPI for a newer release
    }
    if args.baseline:  # the same fastload runs with another checkout, interleaved
        baseline = {**os.environ, "PYTHONPATH": os.path.abspath(args.baseline)}
        for name, (argv, _, proxy) in list(runs.items()):
            runs[f"{name}, baseline"] = (argv, baseline, proxy)
    for name, peer in PEERS.items():
        if peer in peer_folders:
            argv = [PEERS_PYTHON, PEERS_SCRIPT, "read", peer, f"s3://bench/{peer}"]
            runs[name] = (argv + ["--endpoint", endpoint, "--n", str(args.n)], env, to_s3)
    return runs


def measure(runs, repeats):
    """{name: [one dict a run]}, the runs interleaved, in the reverse order every other
    round; each dict also holds the MB that crossed the proxy and the CPU seconds this
    process (the HTTP server, the proxies) took meanwhile."""
    results = {name: [] for name in runs}
    for r in range(repeats):
        for name in list(runs) if r % 2 == 0 else list(runs)[::-1]:
            argv, env, proxy = runs[name]
            before = proxy.received if proxy else 0
            used = resource.getrusage(resource.RUSAGE_SELF)
            result = run_child(argv, env)
            now = resource.getrusage(resource.RUSAGE_SELF)
            result["store_cpu_s"] = now.ru_utime + now.ru_stime - used.ru_utime - used.ru_stime
            result["downloaded_mb"] = (proxy.received - before) / 1e6 if proxy else 0.0
            results[name].append(result)
    return results


def report(results, size_mb, repeats):
    medians = {
        name: {k: statistics.median(run[k] for run in runs) for k in runs[0]}
        for name, runs in results.items()
    }
    local = medians["local disk"]["rate"]
    width = max(len(name) for name in medians)
    for name, m in medians.items():
        print(
            f"  {name:{width}s} {m['rate']:7,.0f} images/s ({m['rate'] / local:.2f}x local), "
            f"first batch {m['first_s']:.2f} s, {m['downloaded_mb']:.1f} MB downloaded\n"
            f"  {'':{width}s} peak {m['pss_mb']:,.0f} MB PSS ({m['rss_mb']:,.0f} MB summed RSS; "
            f"{m.get('unreclaimable_mb', 0):,.0f} MB anonymous and shared, which the kernel "
            f"cannot reclaim), "
            f"{m['disk_mb']:.1f} MB on disk at the end, "
            f"{m['store_cpu_s']:.2f} s of CPU in the store and proxy"
            + (f", at most {m['held_mb']:.1f} MiB of blocks held" if m.get("held_mb") else "")
        )
    print(f"  (the file: {size_mb:.1f} MB); medians of {repeats} runs each, interleaved")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--mbps", type=float, default=1000.0)
    parser.add_argument("--block-mb", type=float, default=4.0)
    parser.add_argument(
        "--memory-part", type=float, default=0.5, help="memory_bytes of the bounded run"
    )
    parser.add_argument("--peers", action="store_true", help="also Mosaic Streaming and LitData")
    parser.add_argument("--peer-file-mb", type=float, default=None, help="(--block-mb)")
    parser.add_argument(
        "--baseline",
        default=None,
        metavar="DIR",
        help="also run fastload's runs with the fastload of DIR (another checkout, built in "
        "place), interleaved with these",
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--options", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--memory-bytes", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        return child(args.child, json.loads(args.options), args.memory_bytes)
    if args.peers and not os.path.exists(PEERS_PYTHON):
        parser.error(f"--peers runs {PEERS_PYTHON}, which is missing: run bench/peers_env.sh")

    from servers import S3Server

    folder = tempfile.mkdtemp(prefix="remote-bench-")
    try:
        path = build(args, folder)
        peer_folders = {}
        if args.peers:
            peer_folders = write_peers(folder, path, args.peer_file_mb or args.block_mb)
        server = S3Server(os.path.join(folder, "moto.log"))
        files = RangeFiles(folder)
        try:
            server.put("bench", "train.arrow", open(path, "rb").read())
            for peer, out in peer_folders.items():
                for name in os.listdir(out):
                    with open(os.path.join(out, name), "rb") as f:
                        server.put("bench", f"{peer}/{name}", f.read())
            results = measure(plan(args, server, files, path, peer_folders), args.repeats)
        finally:
            server.stop()
            files.stop()
        report(results, os.path.getsize(path) / 1e6, args.repeats)
    finally:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
