"""A fake Hugging Face hub on 127.0.0.1: the part of the hub's HTTP API that ``huggingface-hub``
calls to list a repository and download a file, enough to test edgespec's hub references without
the network.

Served: ``GET /api/models/{repo}/tree/{revision}[/{path}]`` (the file listing, with each file's
size and LFS sha256), ``HEAD`` and ``GET /{repo}/resolve/{revision}/{path}`` (the headers
``hf_hub_download`` reads: ``X-Repo-Commit``, ``ETag``, ``Content-Length``; ranges for resumed
downloads), and the hub's error codes (``X-Error-Code: RepoNotFound``, ``EntryNotFound``,
``GatedRepo``). Reach it with ``HF_ENDPOINT=hub.url``.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"
_RANGE_RE = re.compile(r"bytes=(\d+)-(\d*)$")


@dataclass
class FakeFile:
    """A file in a fake repository: its bytes come from ``data`` or from the file at ``path``."""

    data: bytes | None = None
    path: Path | None = None
    sha256: str | None = None  #: the LFS sha256 the listing reports (default: the true one)

    def size(self) -> int:
        return len(self.data) if self.data is not None else self.path.stat().st_size

    def read(self, start: int, end: int) -> bytes:
        if self.data is not None:
            return self.data[start:end]
        with open(self.path, "rb") as fh:
            fh.seek(start)
            return fh.read(end - start)

    def true_sha256(self) -> str:
        h = hashlib.sha256()
        if self.data is not None:
            h.update(self.data)
        else:
            with open(self.path, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    h.update(chunk)
        return h.hexdigest()


@dataclass
class FakeRepo:
    files: dict[str, FakeFile] = field(default_factory=dict)
    gated: bool = False  #: downloads need ``Authorization: Bearer <FakeHub.token>``


class FakeHub:
    """Repositories served over HTTP on 127.0.0.1; a context manager that runs the server."""

    token = "hf_fake_token"

    def __init__(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.requests: list[tuple[str, str, dict[str, str]]] = []  #: (method, path, headers)
        #: ``path -> bytes``: the next GET of that file sends this many bytes, then drops the connection
        self.cut_after: dict[str, int] = {}
        self._sha_cache: dict[int, str] = {}
        self._server: ThreadingHTTPServer | None = None

    def add(self, repo: str, name: str, *, data: bytes | None = None, path: Path | None = None,
            sha256: str | None = None) -> None:
        self.repos.setdefault(repo, FakeRepo()).files[name] = FakeFile(data=data, path=path, sha256=sha256)

    def gate(self, repo: str) -> None:
        self.repos.setdefault(repo, FakeRepo()).gated = True

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def reach(self, monkeypatch, tmp_path: Path) -> None:
        """Point edgespec and huggingface-hub at this hub, with a fresh hub cache and edgespec
        cache under ``tmp_path``, no token, online, and no remembered hub probe."""
        from edgespec.models import hub

        monkeypatch.setenv("HF_ENDPOINT", self.url)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
        monkeypatch.setenv("EDGESPEC_CACHE", str(tmp_path / "edgespec"))
        for var in ("HF_TOKEN", "HF_HUB_OFFLINE", "EDGESPEC_NO_HF", "HF_HOME"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setattr(hub, "_PROBES", {})

    def downloads(self, name: str) -> list[dict[str, str]]:
        """Headers of every GET of a file called ``name``."""
        return [h for m, p, h in self.requests if m == "GET" and "/resolve/" in p and p.endswith("/" + name)]

    def sha256_of(self, f: FakeFile) -> str:
        if f.sha256 is not None:
            return f.sha256
        key = id(f)
        if key not in self._sha_cache:
            self._sha_cache[key] = f.true_sha256()
        return self._sha_cache[key]

    def __enter__(self) -> "FakeHub":
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:  # quiet
        pass

    # ---- routing

    def do_GET(self) -> None:
        self._route(head=False)

    def do_HEAD(self) -> None:
        self._route(head=True)

    def _route(self, *, head: bool) -> None:
        url = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(url.path)
        self.hub.requests.append((self.command, path, {k.lower(): v for k, v in self.headers.items()}))
        m = re.match(r"^/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?$", path)
        if m:
            return self._tree(m.group(1), m.group(3) or "")
        m = re.match(r"^/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?$", path)
        if m:
            return self._info(m.group(1))
        m = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
        if m:
            return self._resolve(m.group(1), m.group(3), head=head)
        self._error(404, "EntryNotFound", "no such route")

    # ---- answers

    def _repo(self, name: str) -> FakeRepo | None:
        repo = self.hub.repos.get(name)
        if repo is None:
            self._error(404, "RepoNotFound", f"Repository Not Found for url: {self.path}.")
        return repo

    def _info(self, name: str) -> None:
        repo = self._repo(name)
        if repo is None:
            return
        siblings = [{"rfilename": fname} for fname in sorted(repo.files)]
        self._json({"id": name, "sha": COMMIT, "private": False, "gated": "auto" if repo.gated else False,
                    "siblings": siblings})

    def _json(self, value: object) -> None:
        body = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _tree(self, name: str, under: str) -> None:
        repo = self._repo(name)
        if repo is None:
            return
        entries = []
        for fname, f in sorted(repo.files.items()):
            if under and not fname.startswith(under.rstrip("/") + "/"):
                continue
            sha = self.hub.sha256_of(f)
            entries.append({
                "type": "file", "oid": hashlib.sha1(sha.encode()).hexdigest(), "size": f.size(),
                "path": fname, "lfs": {"oid": sha, "size": f.size(), "pointerSize": 134},
            })
        self._json(entries)

    def _resolve(self, name: str, fname: str, *, head: bool) -> None:
        repo = self._repo(name)
        if repo is None:
            return
        if repo.gated and self.headers.get("Authorization") != f"Bearer {self.hub.token}":
            return self._error(401, "GatedRepo", f"Access to model {name} is restricted. You must have "
                               "access to it and be authenticated to access it. Please log in.")
        f = repo.files.get(fname)
        if f is None:
            return self._error(404, "EntryNotFound", f"{fname} does not exist on \"main\"")
        size = f.size()
        start, end, status = 0, size, 200
        m = _RANGE_RE.match(self.headers.get("Range", ""))
        if m and not head:
            start = int(m.group(1))
            end = int(m.group(2)) + 1 if m.group(2) else size
            end = min(end, size)
            status = 206
        self.send_response(status)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", f'"{self.hub.sha256_of(f)}"')
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        if head:
            return
        cut = self.hub.cut_after.pop(fname, None)
        pos = start
        while pos < end:
            stop = min(end, pos + (1 << 20))
            if cut is not None and stop - start > cut:
                stop = start + cut
                self.wfile.write(f.read(pos, stop))
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)  # the connection drops mid-file
                return
            self.wfile.write(f.read(pos, stop))
            pos = stop

    def _error(self, status: int, code: str, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
