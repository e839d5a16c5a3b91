"""A tiny Hugging Face Hub on 127.0.0.1 for tests: serves checkpoint folders to the real huggingface_hub code.

    with FakeHub({"org/model": folder}) as hub:      # hub.url -> set HF_ENDPOINT to it
        ...

What huggingface_hub 2.4 requests (read from hf_api.py / file_download.py / utils/_http.py):
    GET  /api/models/{repo}[/revision/{rev}]?blobs=True   model_info: JSON {id, sha, siblings: [{rfilename,
                                                         size, blobId, lfs: {size, sha256, pointerSize}}]}
    HEAD /{repo}/resolve/{rev}/{file}                   get_hf_file_metadata: needs X-Repo-Commit, ETag
                                                         (or X-Linked-Etag) and Content-Length (or X-Linked-Size)
    GET  /{repo}/resolve/{rev}/{file}                   http_get: the bytes; with `Range: bytes=N-` a 206 and
                                                         Content-Range (how it resumes after a dropped connection)
Errors are told apart by the X-Error-Code header (RepoNotFound, GatedRepo, RevisionNotFound, EntryNotFound).

Simulations: `missing` (repo ids answering 404), `gated` (repo ids whose files answer 401/403 GatedRepo),
`drop_after` ({filename: n}: the first GET of that file sends n bytes then closes the connection),
`down_after_drop` (after that drop every request answers 503 until `up()`: a network that stays down,
so the client gives up and must resume on a later call), `rate` (bytes per second for file bodies, to
make downloads observable), `fake_sizes` ({filename: n}: the size model_info reports, e.g. to exceed
the free disk space), `fake_etags` ({filename: etag}: the ETag the file's HEAD answers with, e.g. a hostile
`../../x` one). `requests` records (method, path, range).
"""
import argparse
import hashlib
import json
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

LFS_SUFFIXES = (".safetensors", ".bin", ".gguf")


def _git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class _Repo:
    def __init__(self, repo_id: str, folder: str):
        self.repo_id, self.folder, self.files = repo_id, folder, {}
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            if not os.path.isfile(path):
                continue
            with open(path, "rb") as f:
                data = f.read()
            lfs = name.endswith(LFS_SUFFIXES)
            etag = hashlib.sha256(data).hexdigest() if lfs else _git_blob_sha1(data)
            self.files[name] = {"path": path, "size": len(data), "etag": etag, "lfs": lfs,
                                "blob": _git_blob_sha1(data)}
        digest = hashlib.sha1(repo_id.encode())
        for name, meta in self.files.items():
            digest.update(f"{name}:{meta['etag']}".encode())
        self.sha = digest.hexdigest()


class FakeHub:
    def __init__(self, repos: dict[str, str] | None = None, *, missing=(), gated=(), gated_status: int = 401,
                 drop_after: dict[str, int] | None = None, rate: float | None = None,
                 fake_sizes: dict[str, int] | None = None, down_after_drop: bool = False, port: int = 0,
                 fake_etags: dict[str, str] | None = None):
        self.repos = {rid: _Repo(rid, folder) for rid, folder in (repos or {}).items()}
        self.missing, self.gated, self.gated_status = set(missing), set(gated), gated_status
        self.drop_after = dict(drop_after or {})
        self.rate, self.fake_sizes = rate, dict(fake_sizes or {})
        self.fake_etags = dict(fake_etags or {})
        self.down_after_drop, self.down = down_after_drop, False
        self.requests: list[tuple[str, str, str | None]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", port), _make_handler(self))
        self._server.daemon_threads = True
        self._thread = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> "FakeHub":
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-hub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def record(self, method, path, rng):
        with self._lock:
            self.requests.append((method, path, rng))

    def take_drop(self, filename: str) -> int | None:
        with self._lock:
            n = self.drop_after.pop(filename, None)
            if n is not None and self.down_after_drop:
                self.down = True
            return n

    def up(self) -> None:
        """The network is back (see down_after_drop)."""
        self.down = False

    def model_info(self, repo: _Repo) -> dict:
        siblings = []
        for name, meta in repo.files.items():
            size = self.fake_sizes.get(name, meta["size"])
            entry = {"rfilename": name, "size": size, "blobId": meta["blob"]}
            if meta["lfs"]:
                entry["lfs"] = {"size": size, "sha256": meta["etag"], "pointerSize": 134}
            siblings.append(entry)
        return {"id": repo.repo_id, "modelId": repo.repo_id, "sha": repo.sha, "private": False,
                "gated": "manual" if repo.repo_id in self.gated else False, "disabled": False,
                "tags": ["bitnet", "safetensors"], "siblings": siblings}


def _make_handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # keep test output clean
            pass

        def _send(self, status: int, headers: dict | None = None, body: bytes = b""):
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, str(v))
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _error(self, status: int, code: str, message: str, commit: str | None = None):
            headers = {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json"}
            if commit:
                headers["X-Repo-Commit"] = commit
            self._send(status, headers, json.dumps({"error": message}).encode())

        def do_HEAD(self):
            self._route()

        def do_GET(self):
            self._route()

        def _route(self):
            path = unquote(urlparse(self.path).path)
            hub.record(self.command, path, self.headers.get("Range"))
            if hub.down:
                return self._error(503, "ServiceUnavailable", "Service Unavailable")
            parts = path.strip("/").split("/")
            if len(parts) >= 4 and parts[0] == "api" and parts[1] == "models":
                return self._api_model(parts[2:])
            if len(parts) >= 5 and parts[2] == "resolve":
                return self._resolve("/".join(parts[:2]), parts[3], "/".join(parts[4:]))
            self._error(404, "NotFound", "Not Found")

        def _find_repo(self, repo_id: str):
            if repo_id in hub.missing or repo_id not in hub.repos:
                self._error(404, "RepoNotFound", "Repository not found")
                return None
            return hub.repos[repo_id]

        def _check_revision(self, repo, rev: str) -> bool:
            if rev in ("main", repo.sha):
                return True
            self._error(404, "RevisionNotFound", "Invalid rev id: " + rev)
            return False

        def _api_model(self, parts):
            repo = self._find_repo("/".join(parts[:2]))
            if repo is None:
                return
            if len(parts) >= 4 and parts[2] == "revision" and not self._check_revision(repo, parts[3]):
                return
            self._send(200, {"Content-Type": "application/json"}, json.dumps(hub.model_info(repo)).encode())

        def _resolve(self, repo_id: str, rev: str, filename: str):
            repo = self._find_repo(repo_id)
            if repo is None or not self._check_revision(repo, rev):
                return
            if repo_id in hub.gated:
                return self._error(hub.gated_status, "GatedRepo",
                                   "Access to model " + repo_id + " is restricted. You must be authenticated.")
            meta = repo.files.get(filename)
            if meta is None:
                return self._error(404, "EntryNotFound", "Entry not found", commit=repo.sha)
            size = meta["size"]
            start = 0
            rng = self.headers.get("Range")
            if rng and rng.startswith("bytes="):
                start = int(rng[6:].split("-")[0] or 0)
            etag = hub.fake_etags.get(filename, meta["etag"])
            headers = {"X-Repo-Commit": repo.sha, "ETag": f'"{etag}"', "Accept-Ranges": "bytes",
                       "Content-Type": "application/octet-stream"}
            if meta["lfs"]:
                headers["X-Linked-Etag"] = f'"{etag}"'
                headers["X-Linked-Size"] = size
            status = 206 if start else 200
            if start:
                headers["Content-Range"] = f"bytes {start}-{size - 1}/{size}"
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, str(v))
            self.send_header("Content-Length", str(size - start))
            self.end_headers()
            if self.command == "HEAD":
                return
            drop = hub.take_drop(filename)
            self._stream(meta["path"], start, size, drop)

        def _stream(self, path: str, start: int, end: int, drop: int | None):
            sent, chunk = 0, 256 * 1024
            t0 = time.monotonic()
            with open(path, "rb") as f:
                f.seek(start)
                while start + sent < end:
                    n = min(chunk, end - start - sent)
                    if drop is not None:
                        n = min(n, drop - sent)
                        if n <= 0:  # simulate a dropped connection mid-file
                            self.wfile.flush()
                            self.connection.shutdown(socket.SHUT_RDWR)
                            self.close_connection = True
                            return
                    self.wfile.write(f.read(n))
                    sent += n
                    if hub.rate:
                        lag = sent / hub.rate - (time.monotonic() - t0)
                        if lag > 0:
                            time.sleep(lag)

    return Handler


def main():
    """Serve folders by hand: python tests/fake_hub.py --repo org/name=/path/to/folder [--port 8765]"""
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--repo", action="append", default=[], help="owner/name=folder")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--rate", type=float, default=None, help="bytes per second for file bodies")
    args = ap.parse_args()
    repos = dict(item.split("=", 1) for item in args.repo)
    hub = FakeHub(repos, port=args.port, rate=args.rate).start()
    print(f"HF_ENDPOINT={hub.url}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        hub.stop()


if __name__ == "__main__":
    main()
