"""A file server on loopback for the mirror's tests: plain files with Range support, and a
Hugging Face-layout API (list + resolve). It can cut a body short once, ignore Range, and
require a bearer token; it records what each request asked for."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Seen:
    path: str
    range: str | None
    authorization: str | None
    if_range: str | None = None


@dataclass
class FileServer:
    files: dict[str, bytes] = field(default_factory=dict)  # URL path -> content
    hf_repos: dict[str, dict[str, bytes]] = field(default_factory=dict)  # ORG/REPO -> files
    cut_after: int | None = None  # the next file response stops after this many bytes
    ignore_range: bool = False
    token: str | None = None  # required as "Bearer <token>" when set
    etag: str | None = None  # sent with each file, and compared with a request's If-Range
    seen: list[Seen] = field(default_factory=list)
    url: str = ""

    def content(self, path: str) -> bytes | None:
        if path in self.files:
            return self.files[path]
        for repo, files in self.hf_repos.items():
            prefix = f"/{repo}/resolve/"
            if path.startswith(prefix):
                _, _, name = path[len(prefix) :].partition("/")
                return files.get(name)
        return None

    def listing(self, path: str) -> bytes | None:
        for repo, files in self.hf_repos.items():
            if path.startswith(f"/api/models/{repo}/revision/"):
                siblings = [{"rfilename": name} for name in sorted(files)]
                return json.dumps({"sha": COMMIT, "siblings": siblings}).encode()
        return None


def _handler(server: FileServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            auth = self.headers.get("Authorization")
            server.seen.append(
                Seen(self.path, self.headers.get("Range"), auth, self.headers.get("If-Range"))
            )
            if server.token and auth != f"Bearer {server.token}":
                self._plain(401, b"token required")
                return
            listing = server.listing(self.path)
            if listing is not None:
                self._plain(200, listing)
                return
            body = server.content(self.path.partition("?")[0])
            if body is None:
                self._plain(404, b"not found")
                return
            start = 0
            wanted = self.headers.get("Range")
            if_range = self.headers.get("If-Range")
            if if_range is not None and if_range != server.etag:
                wanted = None  # the file changed since the partial began: send it whole
            if wanted and not server.ignore_range:
                start = int(wanted.removeprefix("bytes=").rstrip("-"))
                if start >= len(body):
                    self._plain(416, b"range not satisfiable")
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(len(body) - start))
            if server.etag:
                self.send_header("ETag", server.etag)
            self.send_header("Connection", "close")
            self.end_headers()
            rest = body[start:]
            if server.cut_after is not None:
                rest, server.cut_after = rest[: server.cut_after], None
            self.wfile.write(rest)
            self.wfile.flush()
            self.close_connection = True

        def _plain(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
            self.close_connection = True

    return Handler


@contextmanager
def serving(server: FileServer) -> Iterator[FileServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(server))
    server.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
