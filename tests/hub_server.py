"""A local HTTP server in the URL layout of the Hugging Face hub, serving model folders as
repositories, so huggingface_hub downloads from it (HF_ENDPOINT pointed at it) as from the hub.

What huggingface_hub asks for: `GET /api/models/ORG/NAME/revision/REV` (the commit and the file
list), `GET /api/models/ORG/NAME/tree/COMMIT?recursive=...` (paths, sizes, blob ids) and
`HEAD`/`GET /ORG/NAME/resolve/REV/PATH` (X-Repo-Commit and ETag headers, then the bytes). Unknown
repositories answer 404 with the hub's X-Error-Code, as the hub does. Every request is logged.
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


class HubServer:
    """`repos`: repo id -> folder. Use as a context manager; `endpoint` is the URL for HF_ENDPOINT."""

    def __init__(self, repos: dict[str, Path]):
        self.repos = {k: Path(v) for k, v in repos.items()}
        self.requests: list[str] = []
        self.commits = {k: hashlib.sha1(k.encode()).hexdigest() for k in self.repos}
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_HEAD(self) -> None:
                server._answer(self, body=False)

            def do_GET(self) -> None:
                server._answer(self, body=True)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> "HubServer":
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def files(self, repo: str) -> list[Path]:
        folder = self.repos[repo]
        return sorted(p for p in folder.rglob("*") if p.is_file())

    def _answer(self, handler: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlparse(handler.path).path)
        self.requests.append(f"{handler.command} {path}")
        api = re.fullmatch(r"/api/models/([^/]+/[^/]+)/(revision|tree)/([^/]+)(/.*)?", path)
        resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        repo = (api or resolve).group(1) if (api or resolve) else None
        if repo not in self.repos:
            return self._send(handler, 404, b'{"error":"Repository not found"}', body,
                              {"X-Error-Code": "RepoNotFound", "Content-Type": "application/json"})
        commit = self.commits[repo]
        folder = self.repos[repo]
        if api and api.group(2) == "revision":
            info = {"id": repo, "modelId": repo, "sha": commit, "private": False,
                    "siblings": [{"rfilename": str(p.relative_to(folder))} for p in self.files(repo)]}
            return self._send(handler, 200, json.dumps(info).encode(), body, {"Content-Type": "application/json"})
        if api:
            tree = [{"type": "file", "path": str(p.relative_to(folder)), "size": p.stat().st_size,
                     "oid": self._etag(p)} for p in self.files(repo)]
            return self._send(handler, 200, json.dumps(tree).encode(), body, {"Content-Type": "application/json"})
        file = folder / resolve.group(3)
        if not file.is_file() or not file.resolve().is_relative_to(folder.resolve()):
            return self._send(handler, 404, b'{"error":"Entry not found"}', body,
                              {"X-Error-Code": "EntryNotFound", "Content-Type": "application/json"})
        data = file.read_bytes()
        self._send(handler, 200, data, body, {"X-Repo-Commit": commit, "ETag": f'"{self._etag(file)}"',
                                              "Content-Type": "application/octet-stream"})

    @staticmethod
    def _etag(path: Path) -> str:
        return hashlib.sha1(path.read_bytes()).hexdigest()

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, data: bytes, body: bool, headers: dict) -> None:
        handler.send_response(status)
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if body:
            handler.wfile.write(data)
