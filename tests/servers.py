"""Real servers on 127.0.0.1 for the tests of reading from object storage: an S3 server
(moto's, in a subprocess) and an HTTP server with byte ranges (in a thread) whose switches
inject the failures a store shows: a stall, 503s, a connection cut mid-body, an altered
byte, refused credentials, a stop and a restart."""

import hashlib
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from email.utils import formatdate
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """moto's S3 server (``python -m moto.server``, the ``moto_server`` command) on a free
    port, started here and waited for until it answers (up to ``start_s`` seconds).
    ``storage_options`` are s3fs's for it; ``put`` creates a bucket as needed and writes
    an object. moto accepts any credentials."""

    def __init__(self, log_path, start_s=30.0):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.storage_options = {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": self.endpoint, "region_name": "eu-west-1"},
        }
        self._log = open(log_path, "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "AWS_EC2_METADATA_DISABLED": "true"},
        )
        self._buckets = set()
        self._wait_until_up(log_path, start_s)

    def _wait_until_up(self, log_path, start_s):
        until = time.monotonic() + start_s
        while True:
            if self.process.poll() is not None:
                self.stop()
                with open(log_path, errors="replace") as f:
                    raise RuntimeError(f"moto's server exited at start:\n{f.read()}")
            try:
                with urllib.request.urlopen(self.endpoint, timeout=2):
                    return
            except OSError as error:
                if time.monotonic() > until:
                    self.stop()
                    raise RuntimeError(
                        f"moto's server did not answer within {start_s} s"
                    ) from error
                time.sleep(0.1)

    def filesystem(self):
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, **self.storage_options)

    def put(self, bucket, key, data):
        """Writes ``data`` to ``s3://bucket/key`` (the bucket created on first use; a name
        of 3 characters or more) and returns that URL."""
        fs = self.filesystem()
        if bucket not in self._buckets:
            fs.mkdir(bucket)
            self._buckets.add(bucket)
        fs.pipe_file(f"{bucket}/{key}", data)
        return f"s3://{bucket}/{key}"

    def stop(self):
        """Ends the server and reaps it (idempotent)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


class RangeServer:
    """A ``ThreadingHTTPServer`` serving ``root`` on 127.0.0.1: GET with byte ranges (206
    Partial Content, Content-Range, 416 past the end), HEAD with Content-Length, an ETag
    (of the file's bytes) honoured in If-Match (412 when it differs), directory listings.

    The switches, set by the tests:
      - ``stall``: accept every request and never answer (until ``stop`` or unset);
      - ``fail_next(n, status=503)``: answer the next n requests with ``status``;
      - ``cut_next(n)``: send half of the next n bodies, then close the connection;
      - ``short_next(n)``: answer the next n ranged requests with a well-formed 206 of
        half the range;
      - ``altered``: serve the byte at this offset altered, under the file's true ETag;
      - ``refuse``: answer every request 403 (refused credentials);
      - ``stop()`` and ``start()``, on the same port.
    ``requests`` counts the requests received.
    """

    def __init__(self, root):
        self.root = str(root)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.stall = False
        self.altered = None
        self.refuse = False
        self.requests = 0
        self._failures = []  # statuses of the next requests to fail
        self._cuts = 0
        self._shorts = 0
        self._lock = threading.Lock()
        self._released = threading.Event()
        self._connections = set()
        self._server = None
        self.start()

    def start(self):
        handler = type("Handler", (_RangeHandler,), {"switches": self})
        self._released.clear()
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self):
        """Stops listening and drops every open connection, stalled ones included, as a
        killed server would (idempotent)."""
        server, self._server = self._server, None
        if server is None:
            return
        self._released.set()
        server.shutdown()
        server.server_close()
        with self._lock:
            connections, self._connections = list(self._connections), set()
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # closed by its handler meanwhile

    def restart_after(self, seconds):
        """Starts the server again ``seconds`` from now, in a thread."""
        timer = threading.Timer(seconds, self.start)
        timer.daemon = True
        timer.start()
        return timer

    def fail_next(self, n, status=503):
        with self._lock:
            self._failures += [status] * n

    def cut_next(self, n):
        with self._lock:
            self._cuts += n

    def short_next(self, n):
        with self._lock:
            self._shorts += n

    def _take(self, connection, ranged):
        """Counts a request and says which fault it gets: a status, "cut", "short" or
        None."""
        with self._lock:
            self.requests += 1
            self._connections.add(connection)
            if self._failures:
                return self._failures.pop(0)
            if self._cuts:
                self._cuts -= 1
                return "cut"
            if self._shorts and ranged:
                self._shorts -= 1
                return "short"
        return None


class _RangeHandler(SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    switches: RangeServer

    def __init__(self, *args, **kwargs):
        super().__init__(*args, directory=self.switches.root, **kwargs)

    def setup(self):
        # Known from its accept on, so that ``stop`` drops a connection that has not sent
        # its first request yet, rather than leave it serving after the server "died".
        super().setup()
        with self.switches._lock:
            self.switches._connections.add(self.connection)

    def handle_one_request(self):
        if self.server is not self.switches._server:  # stopped: a killed server answers nothing
            self.close_connection = True
            return
        super().handle_one_request()

    def log_message(self, format, *args):
        pass  # quiet: the tests say what went wrong

    def do_HEAD(self):
        self._serve(body=False)

    def do_GET(self):
        self._serve(body=True)

    def _serve(self, body):
        s = self.switches
        fault = s._take(self.connection, "Range" in self.headers)
        if s.stall:
            s._released.wait()
            self.close_connection = True
            return
        if isinstance(fault, int):
            return self.send_error(fault, "injected failure")
        if s.refuse:
            return self.send_error(403, "Access Denied: the test server refuses the credentials")
        path = self.translate_path(self.path)
        if os.path.isdir(path):
            return super().do_GET() if body else super().do_HEAD()
        if not os.path.isfile(path):
            return self.send_error(404, "no such file")
        with open(path, "rb") as f:
            data = f.read()
        etag = '"' + hashlib.sha1(data).hexdigest()[:20] + '"'
        match = self.headers.get("If-Match")
        if match is not None and match != etag:
            return self.send_error(412, "Precondition Failed: the ETag differs")
        altered = s.altered  # once: a test may unset it meanwhile
        if altered is not None and altered < len(data):
            data = data[:altered] + bytes([data[altered] ^ 0xFF]) + data[altered + 1 :]
        status, data, extra = self._range(data)
        if status == 416:
            return self._send_status(416, extra)
        if fault == "short" and status == 206:  # well formed, but half the range
            start = int(extra["Content-Range"].split()[1].split("-")[0])
            data = data[: max(1, len(data) // 2)]
            size = extra["Content-Range"].rsplit("/", 1)[1]
            extra = {"Content-Range": f"bytes {start}-{start + len(data) - 1}/{size}"}
        self.send_response(status)
        for key, value in extra.items():
            self.send_header(key, value)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", etag)
        self.send_header("Last-Modified", formatdate(os.path.getmtime(path), usegmt=True))
        self.end_headers()
        if not body:
            return
        if fault == "cut":
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(data)

    def _range(self, data):
        """(status, the bytes to send, extra headers) for the request's Range header."""
        header = self.headers.get("Range")
        if header is None:
            return 200, data, {}
        m = _RANGE.match(header.strip())
        if m is None:
            return 200, data, {}
        start = int(m.group(1))
        end = min(int(m.group(2)) if m.group(2) else len(data) - 1, len(data) - 1)
        if start >= len(data) or start > end:
            return 416, b"", {"Content-Range": f"bytes */{len(data)}"}
        return 206, data[start : end + 1], {"Content-Range": f"bytes {start}-{end}/{len(data)}"}

    def _send_status(self, status, headers):
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", "0")
        self.end_headers()
