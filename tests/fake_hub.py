"""A Hugging Face Hub stand-in on loopback (HF_ENDPOINT points at it), answering the calls huggingface_hub makes:
repo info and file downloads for sources; whoami, repo creation, branches, preupload and commits for publishing.
It records every request, so tests assert what was fetched and what was committed."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

TOKENS = {"write-token": ("me", "write"), "read-token": ("me", "read")}
ORGS = ["my-org"]


@dataclasses.dataclass
class Repo:
    files: dict[str, bytes]
    sha: str = "0123456789abcdef0123456789abcdef01234567"
    gated: bool = False
    branches: tuple[str, ...] = ("main",)


class FakeHub:
    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path)
        self.created: list[dict] = []
        self.commits: list[dict] = []
        self.validated_yaml: list[dict] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()

    def downloads(self) -> list[str]:
        return [path for method, path in self.requests if method == "GET" and "/resolve/" in path]

    def _handler(hub):
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self._serve(head=True)

            def do_GET(self):
                self._serve(head=False)

            def do_POST(self):
                hub.requests.append(("POST", self.path))
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                path = urlparse(self.path).path
                if path == "/api/repos/create":
                    request = json.loads(body)
                    hub.created.append(request)
                    repo_id = f"{request.get('organization') or 'me'}/{request['name']}"
                    hub.repos.setdefault(repo_id, Repo({}))
                    return self._json({"url": f"{hub.url}/{repo_id}"})
                if path == "/api/validate-yaml":  # the model card's metadata, checked before a commit
                    hub.validated_yaml.append(json.loads(body))
                    return self._json({"errors": [], "warnings": []})
                if m := re.fullmatch(r"/api/models/(.+?)/preupload/(.+)", path):
                    files = json.loads(body)["files"]
                    return self._json(
                        {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]}
                    )
                if m := re.fullmatch(r"/api/models/(.+?)/branch/(.+)", path):
                    return self._json({})
                if m := re.fullmatch(r"/api/models/(.+?)/commit/(.+)", path):
                    lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
                    files = {
                        line["value"]["path"]: base64.b64decode(line["value"]["content"])
                        for line in lines
                        if line["key"] == "file"
                    }
                    header = next(line["value"] for line in lines if line["key"] == "header")
                    pr = parse_qs(urlparse(self.path).query).get("create_pr") == ["1"]
                    hub.commits.append(
                        {
                            "repo": m.group(1),
                            "revision": unquote(m.group(2)),
                            "files": files,
                            "summary": header["summary"],
                            "create_pr": pr,
                            "authorization": self.headers.get("Authorization"),
                        }
                    )
                    return self._json(
                        {
                            "commitUrl": f"{hub.url}/{m.group(1)}/commit/abc",
                            "commitOid": "a" * 40,
                            "pullRequestUrl": f"{hub.url}/{m.group(1)}/discussions/1" if pr else None,
                        }
                    )
                self._error(404, "EntryNotFound")

            def _token_user(self):
                auth = self.headers.get("Authorization", "")
                return TOKENS.get(auth.removeprefix("Bearer "))

            def _serve(self, head):
                hub.requests.append(("HEAD" if head else "GET", self.path))
                path = unquote(urlparse(self.path).path)
                if path == "/api/whoami-v2":
                    user = self._token_user()
                    if user is None:
                        return self._error(401, None)
                    return self._json(
                        {
                            "name": user[0],
                            "orgs": [{"name": o} for o in ORGS],
                            "auth": {"accessToken": {"role": user[1]}},
                        }
                    )
                if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/(.+)", path):
                    repo = self._repo(m.group(1))
                    if repo is None:
                        return
                    if m.group(2) not in (*repo.branches, repo.sha):
                        return self._error(404, "RevisionNotFound")
                    return self._json(
                        {
                            "id": m.group(1),
                            "sha": repo.sha,
                            "siblings": [
                                {"rfilename": name, "size": len(data)} for name, data in sorted(repo.files.items())
                            ],
                        }
                    )
                if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(/.*)?", path):
                    repo = self._repo(m.group(1))
                    if repo is None:
                        return
                    return self._json(
                        [
                            {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                            for name, data in sorted(repo.files.items())
                        ]
                    )
                if m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
                    repo = self._repo(m.group(1))
                    if repo is None:
                        return
                    if m.group(2) not in (*repo.branches, repo.sha):
                        return self._error(404, "RevisionNotFound")
                    data = repo.files.get(m.group(3))
                    if data is None:
                        return self._error(404, "EntryNotFound")
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(data)))
                    self.send_header("X-Repo-Commit", repo.sha)
                    self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                    self.end_headers()
                    if not head:
                        self.wfile.write(data)
                    return
                self._error(404, "EntryNotFound")

            def _repo(self, repo_id):
                repo = hub.repos.get(repo_id)
                if repo is None:
                    self._error(404, "RepoNotFound")
                elif repo.gated and self._token_user() is None:
                    self._error(403, "GatedRepo", f"Access to model {repo_id} is restricted.")
                    return None
                return repo

            def _json(self, payload):
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _error(self, status, code, message="not found"):
                data = json.dumps({"error": message}).encode()
                self.send_response(status)
                if code:
                    self.send_header("X-Error-Code", code)
                    self.send_header("X-Error-Message", message)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

        return Handler
