"""A packed JPEG dataset read from object storage against the same file read from local
disk, side by side in one run.

The store is moto's S3 server on 127.0.0.1, reached through a proxy of this script that
makes the network look like a cluster's: each request waits ``--latency-ms`` before it
reaches the server, and the answers share a bandwidth of ``--mbps`` megabits per second.

1. The dataset: ``images.py``'s synthetic ImageFolder (``--n`` images, about 450x400)
   converted as FFCV's ImageNet recipe (JPEG quality 90, longer side at most 256) into
   blocks of ``--block-mb`` MB, on local disk and uploaded to the server.
2. Each run is a fresh child process that opens the dataset (the local file, already in
   the page cache; or its URL through the proxy with ``cache_bytes=0``: every block
   fetched, nothing on disk) and loads one epoch of
   ``DataLoader((mapobs(Compose([DecodeImage(), RandomResizedCrop(224),
   RandomHorizontalFlip()]), ds["image"].encoded), ds["label"]), 256, shuffle="quasi",
   parallel=2, buffer=True)``: images/s from the first batch to the end (steady state),
   the time from ``open`` to the first batch, the MB that crossed the proxy, and the
   child's peak resident memory; and the CPU time the store and the proxy took meanwhile
   (this script's threads: the HTTP server, the proxy; moto runs in a process of its own,
   not counted), CPU that a cluster's store does not take from the loader.
3. The two kinds of runs alternate, ``--repeats`` of each; medians.

Usage: python bench/remote.py [--n 4000] [--repeats 5] [--latency-ms 20] [--mbps 1000]
"""

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # servers.py: moto's server

BATCH = 256


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


def child(where, storage_options):
    """One epoch in this process; prints a JSON line of what it measured."""
    from pipelines import train_ops

    import fastload
    from fastload.transforms import Compose

    start = time.perf_counter()
    if "://" in where:
        ds = fastload.open(where, storage_options=storage_options or None, cache_bytes=0)
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
    it = iter(loader)
    next(it)
    first = time.perf_counter()
    rest = sum(1 for _ in it)
    end = time.perf_counter()
    images = min(rest * BATCH, len(ds) - BATCH)
    print(
        json.dumps(
            {
                "rate": images / (end - first),
                "first_s": first - start,
                "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )


def run_child(where, options):
    done = subprocess.run(
        [sys.executable, __file__, "--child", where, "--options", json.dumps(options)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--mbps", type=float, default=1000.0)
    parser.add_argument("--block-mb", type=float, default=4.0)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--options", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        return child(args.child, json.loads(args.options))

    from images import DEFAULT_ROOT, generate
    from servers import S3Server

    import fastload
    from fastload.storage.convert import convert

    root = f"{DEFAULT_ROOT}-{args.n}"
    generate(root, args.n)
    folder = tempfile.mkdtemp(prefix="remote-bench-")
    path = os.path.join(folder, "train.arrow")
    blocks = int(args.block_mb * 2**20)
    convert(root, path, mode="jpeg", quality=90, max_side=256, progress=False, block_bytes=blocks)
    ds = fastload.open(path)
    size = os.path.getsize(path)
    print(
        f"{len(ds)} JPEGs (longer side 256, quality 90), {size / 1e6:.1f} MB in {ds.num_blocks} "
        f"blocks; network: {args.latency_ms:g} ms a request, {args.mbps:g} Mbit/s"
    )
    server = S3Server(os.path.join(folder, "moto.log"))
    files = RangeFiles(folder)
    try:
        server.put("bench", "train.arrow", open(path, "rb").read())
        to_s3 = Proxy(server.port, args.latency_ms / 1e3, args.mbps * 1e6 / 8)
        to_http = Proxy(files.port, args.latency_ms / 1e3, args.mbps * 1e6 / 8)
        options = dict(server.storage_options)
        endpoint = f"http://127.0.0.1:{to_s3.port}"
        options["client_kwargs"] = {**options["client_kwargs"], "endpoint_url": endpoint}
        runs = {
            "local disk": (path, {}, None),
            "HTTP through the proxy": (f"http://127.0.0.1:{to_http.port}/train.arrow", {}, to_http),
            "S3 (moto) through it": ("s3://bench/train.arrow", options, to_s3),
        }
        results = {name: [] for name in runs}
        downloaded = {name: [] for name in runs}
        for r in range(args.repeats):
            for name in list(runs) if r % 2 == 0 else list(runs)[::-1]:
                where, opts, proxy = runs[name]
                before = proxy.received if proxy else 0
                used = resource.getrusage(resource.RUSAGE_SELF)
                results[name].append(run_child(where, opts))
                now = resource.getrusage(resource.RUSAGE_SELF)
                results[name][-1]["store_cpu_s"] = (
                    now.ru_utime + now.ru_stime - used.ru_utime - used.ru_stime
                )
                downloaded[name].append((proxy.received - before) / 1e6 if proxy else 0.0)
    finally:
        server.stop()
        files.stop()
    medians = {
        name: {k: statistics.median(run[k] for run in runs) for k in runs[0]}
        for name, runs in results.items()
    }
    local = medians["local disk"]["rate"]
    for name, m in medians.items():
        print(
            f"  {name:24s} {m['rate']:7,.0f} images/s ({m['rate'] / local:.2f}x local), "
            f"first batch {m['first_s']:.2f} s, peak {m['peak_mb']:.0f} MB, "
            f"{statistics.median(downloaded[name]):.1f} MB downloaded, "
            f"{m['store_cpu_s']:.2f} s of CPU in this machine's store and proxy"
        )
    print(f"  (the file: {size / 1e6:.1f} MB); medians of {args.repeats} runs each, interleaved")


if __name__ == "__main__":
    main()
