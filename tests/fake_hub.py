"""A Hugging Face Hub stand-in on loopback (HF_ENDPOINT points at it), answering the calls huggingface_hub makes:
repo info and file downloads for sources; whoami, repo creation, branches, preupload, commits and the commit log for
publishing. It records every request, so tests assert what was fetched and what was committed, and misbehaves on
request as the real one sometimes does (`fault`): an error status (with Retry-After), a connection cut mid-body,
flipped bytes, a stall."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")  # what the Hub keeps in LFS: its ETag is the sha256
TOKENS = {"write-token": ("me", "write"), "read-token": ("me", "read")}
ORGS = ["my-org"]


@dataclasses.dataclass
class Repo:
    files: dict[str, bytes]
    sha: str = "0123456789abcdef0123456789abcdef01234567"
    gated: bool = False
    branches: tuple[str, ...] = ("main",)
    log: list[dict] = dataclasses.field(default_factory=list)  # commits, newest first


@dataclasses.dataclass
class Fault:
    """Misbehaviour for the next `times` requests whose method and path match: `status` (with `retry_after`), `cut`
    (the body stops a third of the way, the connection closed), `flip` (one byte of the body flipped, same length,
    true digests in the headers), `stall` (the connection accepted and never answered, for `seconds`)."""

    method: str
    path: str  # a regex searched in the request path
    kind: str
    times: int = 1
    status: int = 503
    retry_after: str | None = None
    seconds: float = 30.0


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def is_lfs(name: str) -> bool:
    return name.endswith(LFS_SUFFIXES)


class FakeHub:
    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path)
        self.created: list[dict] = []
        self.commits: list[dict] = []
        self.validated_yaml: list[dict] = []
        self.faults: list[Fault] = []
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()

    def fault(self, method: str, path: str, kind: str, **options) -> Fault:
        fault = Fault(method, path, kind, **options)
        self.faults.append(fault)
        return fault

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.times > 0 and fault.method == method and re.search(fault.path, path):
                    fault.times -= 1
                    return fault
        return None

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
                fault = hub._take_fault("POST", path)
                if fault is not None and fault.kind == "status-after":  # the work is done, the answer is lost
                    self._post(path, body)
                    return self._error(fault.status, None, "upstream timeout")
                if fault is not None and self._misbehave(fault):
                    return
                self._post(path, body)

            def _post(self, path, body):
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
                    repo = hub.repos.setdefault(m.group(1), Repo({}))
                    repo.branches = tuple(dict.fromkeys((*repo.branches, unquote(m.group(2)))))
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
                    repo = hub.repos.setdefault(m.group(1), Repo({}))
                    parent = header.get("parentCommit")
                    if parent is not None and not pr and parent != repo.sha:
                        return self._error(412, None, "the branch moved: parent commit is not the head")
                    commit_id = hashlib.sha1(f"{repo.sha}{len(hub.commits)}".encode()).hexdigest()
                    if not pr:
                        repo.files.update(files)
                        repo.log.insert(0, {"id": commit_id, "title": header["summary"]})
                        repo.sha = commit_id
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
                            "commitUrl": f"{hub.url}/{m.group(1)}/commit/{commit_id}",
                            "commitOid": commit_id,
                            "pullRequestUrl": f"{hub.url}/{m.group(1)}/discussions/1" if pr else None,
                        }
                    )
                self._error(404, "EntryNotFound")

            def _token_user(self):
                auth = self.headers.get("Authorization", "")
                return TOKENS.get(auth.removeprefix("Bearer "))

            def _serve(self, head):
                method = "HEAD" if head else "GET"
                hub.requests.append((method, self.path))
                path = unquote(urlparse(self.path).path)
                fault = hub._take_fault(method, path)
                if fault is not None and fault.kind not in ("cut", "flip") and self._misbehave(fault):
                    return
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
                                {
                                    "rfilename": name,
                                    "size": len(data),
                                    **({"lfs": self._lfs(data)} if is_lfs(name) else {}),
                                }
                                for name, data in sorted(repo.files.items())
                            ],
                        }
                    )
                if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(/.*)?", path):
                    repo = self._repo(m.group(1))
                    if repo is None:
                        return
                    return self._json(
                        [
                            {
                                "type": "file",
                                "path": name,
                                "size": len(data),
                                "oid": git_blob_sha1(data),
                                **({"lfs": self._lfs(data)} if is_lfs(name) else {}),
                            }
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
                    self.send_header("ETag", f'"{git_blob_sha1(data)}"')
                    if is_lfs(m.group(3)):
                        self.send_header("X-Linked-Etag", f'"{hashlib.sha256(data).hexdigest()}"')
                        self.send_header("X-Linked-Size", str(len(data)))
                    self.end_headers()
                    if head:
                        return
                    if fault is not None and fault.kind == "flip":
                        data = bytes([data[0] ^ 0xFF]) + data[1:]
                    if fault is not None and fault.kind == "cut":
                        self.wfile.write(data[: len(data) // 3])
                        self.wfile.flush()
                        self.close_connection = True
                        return
                    self.wfile.write(data)
                    return
                if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/commits/(.+)", path):
                    repo = self._repo(m.group(1))
                    if repo is None:
                        return
                    log = repo.log or [{"id": repo.sha, "title": "initial commit"}]
                    return self._json(
                        [
                            {
                                "id": c["id"],
                                "title": c["title"],
                                "message": "",
                                "authors": [],
                                "date": "2026-01-01T00:00:00.000Z",
                            }
                            for c in log
                        ]
                    )
                self._error(404, "EntryNotFound")

            def _misbehave(self, fault) -> bool:
                """Acts out a fault that replaces the answer; False for those that alter a body (done by the caller)."""
                if fault.kind == "status":
                    data = b'{"error": "injected"}'
                    self.send_response(fault.status)
                    if fault.retry_after is not None:
                        self.send_header("Retry-After", fault.retry_after)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                    return True
                if fault.kind == "stall":
                    time.sleep(fault.seconds)
                    self.close_connection = True
                    return True
                return False

            @staticmethod
            def _lfs(data: bytes) -> dict:
                digest = hashlib.sha256(data).hexdigest()
                return {"oid": digest, "sha256": digest, "size": len(data), "pointerSize": 134}

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
