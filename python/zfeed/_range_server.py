"""A static file server that answers HTTP range requests (Python's http.server does not), as
nginx, a cloud bucket's web endpoint or a CDN does, optionally holding each response for a while
to stand in for a remote server's round trip. For zfeed's tests and its remote read benchmark.

    python -m zfeed._range_server DIRECTORY --port 8000 [--latency-ms 20]
"""

from __future__ import annotations

import argparse
import io
import threading
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class RangeHandler(SimpleHTTPRequestHandler):
    latency_s = 0.0
    protocol_version = "HTTP/1.1"  # keep connections open, as real servers do
    # TCP_NODELAY, as nginx and object stores send: with Nagle on, a response's last partial
    # segment waits for the client's delayed ACK (up to 40 ms) once a kept connection has left
    # quick-ACK mode, which made single reads on reused connections stall here.
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    def send_head(self):
        if self.latency_s:
            time.sleep(self.latency_s)
        path = Path(self.translate_path(self.path))
        range_header = self.headers.get("Range")
        if not range_header or not path.is_file():
            return super().send_head()
        data = path.read_bytes()
        first, _, last = range_header.removeprefix("bytes=").partition("-")
        if first == "":
            start, end = max(0, len(data) - int(last)), len(data) - 1
        else:
            start, end = int(first), min(int(last) if last else len(data) - 1, len(data) - 1)
        if start >= len(data):
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{len(data)}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        body = data[start:end + 1]
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        return io.BytesIO(body)


def make_server(directory, port: int = 0, latency_ms: float = 0.0) -> ThreadingHTTPServer:
    handler = type("Handler", (RangeHandler,), {"latency_s": latency_ms / 1000.0})
    server = ThreadingHTTPServer(("127.0.0.1", port), partial(handler, directory=str(directory)))
    server.daemon_threads = True
    return server


def serve_in_thread(directory, latency_ms: float = 0.0):
    """Starts a server on a free port in a daemon thread; returns (server, base URL)."""
    server = make_server(directory, 0, latency_ms)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    args = parser.parse_args()
    make_server(args.directory, args.port, args.latency_ms).serve_forever()


if __name__ == "__main__":
    main()
