"""The Hugging Face Hub as it really behaves: every request bounded in time, transient failures retried with backoff,
fetched weights checked against the Hub's own digests, and every failure one line.

All of huggingface_hub's HTTP goes through one shared client; `install()` gives it a transport of ours that bounds
each wait (many of huggingface_hub's calls pass no timeout at all) and retries, inside the transport, what is safe to
repeat: GET and HEAD on 408, 429 (after its Retry-After), 5xx, and connection or protocol errors; any request that
never reached the server (a refused connection) or was refused as rate-limited. A commit is retried a level up, in
publish, where it can first check whether the failed attempt landed.

The knobs (environment variables; docs/usage.md, The Hub):
  VAE_CONVERT_HUB_TIMEOUT        seconds to connect, and between bytes of an answer (default 15)
  VAE_CONVERT_HUB_RETRIES        retries of one request (default 5)
  VAE_CONVERT_HUB_RETRY_SECONDS  how long a streak of failures may last before giving up (default 40)
  VAE_CONVERT_HUB_BACKOFF        the first backoff in seconds, doubled each retry, with jitter (default 1)
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import random
import threading
import time
from pathlib import Path

from converter.errors import InputError, UsageError

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
SAFE_METHODS = frozenset({"GET", "HEAD"})
MAX_BACKOFF = 16.0


@dataclasses.dataclass(frozen=True)
class Policy:
    timeout: float = 15.0
    retries: int = 5
    retry_seconds: float = 40.0
    backoff: float = 1.0

    @classmethod
    def from_env(cls) -> Policy:
        defaults = cls()
        values = {}
        for field, name in (
            ("timeout", "VAE_CONVERT_HUB_TIMEOUT"),
            ("retries", "VAE_CONVERT_HUB_RETRIES"),
            ("retry_seconds", "VAE_CONVERT_HUB_RETRY_SECONDS"),
            ("backoff", "VAE_CONVERT_HUB_BACKOFF"),
        ):
            text = os.environ.get(name)
            if not text:
                continue
            kind = type(getattr(defaults, field))
            try:
                value = kind(text)
            except ValueError:
                value = -1
            # every knob bounds a wait: NaN and infinity bound nothing
            if not math.isfinite(value) or value < 0 or (field == "timeout" and value == 0):
                sign = "positive" if field == "timeout" else "non-negative"
                raise UsageError(f"{name}={text!r}: expected a finite {sign} {'whole ' if kind is int else ''}number")
            values[field] = value
        return cls(**values)


class _Streak:
    """When the current run of failed requests began (shared by every request: a retry inside huggingface_hub's own
    retry loop, or a second file after a first that failed, counts against the same bound); a success ends it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._since: float | None = None

    def failed(self, attempted: float) -> float:
        """Seconds since the streak began: with this failure, when the failed request was sent, unless earlier."""
        with self._lock:
            if self._since is None:
                self._since = attempted
            return time.monotonic() - self._since

    def succeeded(self):
        with self._lock:
            self._since = None


def _retry_after(response) -> float | None:
    value = response.headers.get("Retry-After", "").strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def _make_transport(policy: Policy):
    import httpx2

    class BoundedRetryingTransport(httpx2.BaseTransport):
        def __init__(self):
            self.inner = httpx2.HTTPTransport()
            self.streak = _Streak()

        def handle_request(self, request):
            request.extensions["timeout"] = _bounded(request.extensions.get("timeout", {}), policy.timeout)
            safe = request.method in SAFE_METHODS
            attempt = 0
            while True:
                attempt += 1
                attempted = time.monotonic()
                try:
                    response = self.inner.handle_request(request)
                except httpx2.TransportError as e:
                    # a refused connection never reached the server: safe to repeat for any method
                    if not (safe or isinstance(e, httpx2.ConnectError)) or not self._wait(attempt, attempted, None):
                        raise
                    continue
                if response.status_code not in RETRY_STATUS or not (safe or response.status_code == 429):
                    if response.status_code < 500:
                        self.streak.succeeded()
                    return response
                asked = _retry_after(response) if response.status_code == 429 else None
                if not self._wait(attempt, attempted, asked):
                    return response
                response.close()

        def _wait(self, attempt: int, attempted: float, asked: float | None) -> bool:
            """Sleeps before the next attempt; False when the policy says stop (the caller gives up)."""
            return attempt <= policy.retries and _pause(policy, attempt, self.streak.failed(attempted), asked)

        def close(self):
            self.inner.close()

    return BoundedRetryingTransport()


def _pause(policy: Policy, attempt: int, elapsed: float, asked: float | None = None) -> bool:
    """Sleeps the backoff of this attempt (or what the Hub asked for) unless that would take the streak of failures
    past the policy's bound; says whether it slept."""
    if asked is None:
        asked = min(MAX_BACKOFF, policy.backoff * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
    if elapsed + asked > policy.retry_seconds:
        return False
    time.sleep(asked)
    return True


class Backoff:
    """Retries of a whole call (a commit), on the same policy as the transport's retries of a request."""

    def __init__(self, policy: Policy):
        self.policy, self.attempt, self.started = policy, 0, time.monotonic()

    def wait(self) -> bool:
        self.attempt += 1
        return self.attempt <= self.policy.retries and _pause(
            self.policy, self.attempt, time.monotonic() - self.started
        )


def retrying(action):
    """Runs an idempotent call (creating a repo or a branch that may exist), again after each transient failure, on
    the policy's backoff."""
    backoff = Backoff(install())
    while True:
        try:
            return action()
        except Exception as e:
            if not transient(e) or not backoff.wait():
                raise


def transient(e: BaseException) -> bool:
    """A failure that may pass: a 408/429/5xx answer, or a connection that broke or went silent."""
    import httpx2

    status = getattr(getattr(e, "response", None), "status_code", None)
    return status in RETRY_STATUS or isinstance(e, httpx2.TransportError)


def _bounded(timeout: dict, seconds: float) -> dict:
    """Each of connect/read/write/pool at most `seconds` (unset means unbounded to httpx: bounded here)."""
    keys = ("connect", "read", "write", "pool")
    return {k: seconds if timeout.get(k) is None else min(timeout[k], seconds) for k in keys}


_installed: Policy | None = None


def install() -> Policy:
    """Points huggingface_hub's shared HTTP client at the bounded, retrying transport (once a process, or again when
    the knobs changed: tests set them per case)."""
    global _installed
    import httpx2
    from huggingface_hub.utils import _http, set_client_factory

    policy = Policy.from_env()
    if policy != _installed:

        def client():
            return httpx2.Client(
                event_hooks={"request": [_http.hf_request_event_hook]},
                follow_redirects=True,
                timeout=None,  # the transport bounds every request
                transport=_make_transport(policy),
            )

        set_client_factory(client)
        _installed = policy
    return policy


def offline_env() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def call(action, repo_id: str, revision: str, offline: bool = False, error=InputError):
    """Runs a huggingface_hub call through the bounded transport; its failures become one-line errors (`error`,
    InputError by default)."""
    import httpx2  # huggingface_hub's HTTP client
    from huggingface_hub import errors

    policy = install()
    try:
        return action()
    except errors.GatedRepoError:
        raise error(
            f"{repo_id} is gated: accept its terms on the Hub and log in (HF_TOKEN or `hf auth login`)"
        ) from None
    except errors.RepositoryNotFoundError:
        raise error(f"Hub repo {repo_id} not found (or private without a token)") from None
    except errors.RevisionNotFoundError:
        raise error(f"revision {revision!r} not found in {repo_id}") from None
    except errors.HFValidationError as e:
        raise error(f"{repo_id!r} is not a valid Hub repo id ({str(e).splitlines()[0]})") from None
    except errors.OfflineModeIsEnabled:
        raise error(f"{repo_id}@{revision}: the Hub is needed but offline mode is on (HF_HUB_OFFLINE)") from None
    except errors.LocalEntryNotFoundError as e:
        if offline or offline_env():
            raise error(f"{repo_id}@{revision} is not in the local Hugging Face cache and offline mode is on") from None
        cause = e.__cause__ or e.__context__
        if cause is not None:
            raise error(_failure_line(cause, repo_id, revision, policy, error)) from None
        raise error(f"cannot fetch {repo_id}@{revision} from the Hub, and it is not cached") from None
    except (OSError, httpx2.HTTPError, errors.HfHubHTTPError) as e:
        raise error(_failure_line(e, repo_id, revision, policy, error)) from None


def _failure_line(e: BaseException, repo_id: str, revision: str, policy: Policy, error) -> str:
    import httpx2

    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    gave_up = f" (gave up after retries within VAE_CONVERT_HUB_RETRY_SECONDS={policy.retry_seconds:g})"
    if isinstance(e, httpx2.TimeoutException) or isinstance(e.__context__, httpx2.TimeoutException):
        return (
            f"the Hub did not answer for {repo_id}@{revision} within {policy.timeout:g} s "
            f"(VAE_CONVERT_HUB_TIMEOUT){gave_up}"
        )
    if isinstance(e, httpx2.TransportError) or isinstance(e.__context__, httpx2.TransportError):
        # no network: say what works without one (fetching only; publishing needs the Hub)
        hint = "; with the VAE in the Hugging Face cache add --offline, or give --source PATH" * (error is InputError)
        return f"cannot reach the Hub for {repo_id}@{revision} ({reason}){gave_up}{hint}"
    status = getattr(getattr(e, "response", None), "status_code", None)
    if status in RETRY_STATUS:
        return f"the Hub failed for {repo_id}@{revision}: {reason}{gave_up}"
    return f"the Hub failed for {repo_id}@{revision}: {reason}"


# Integrity: the Hugging Face cache names each blob by the ETag the Hub served for it, which for an LFS file is the
# sha256 of its bytes and for a file kept in git is git's blob sha1.


def hub_digest(cached_file: Path) -> tuple[str, str] | None:
    """(algorithm, digest) the Hub gave for a file in the Hugging Face cache, from its blob's name; None when the name
    is not a digest (a cache laid out some other way)."""
    name = cached_file.resolve().name
    if len(name) == 64 and all(c in "0123456789abcdef" for c in name):
        return "sha256", name
    if len(name) == 40 and all(c in "0123456789abcdef" for c in name):
        return "git-sha1", name
    return None


def git_blob_sha1(path: Path) -> str:
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode(), usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def asked_digest(repo_id: str, revision: str, path_in_repo: str) -> tuple[str, str] | None:
    """(algorithm, digest) the Hub lists for a file of a commit: the LFS sha256, else git's blob sha1; None when it
    lists neither."""
    import huggingface_hub

    info = call(
        lambda: huggingface_hub.HfApi().model_info(repo_id, revision=revision, files_metadata=True), repo_id, revision
    )
    sibling = next((s for s in info.siblings or [] if s.rfilename == path_in_repo), None)
    if sibling is None:
        raise InputError(f"{repo_id}@{revision}: the Hub lists no {path_in_repo}, which the cache holds")
    if sibling.lfs is not None:
        return "sha256", sibling.lfs.sha256
    return ("git-sha1", sibling.blob_id) if sibling.blob_id else None


def verify(cached_file: Path, sha256: str, repo_id: str, expected: tuple[str, str] | None) -> bool:
    """Refuses a cached Hub file whose bytes are not the ones the Hub named (`expected`: see hub_digest and
    asked_digest), and removes it from the cache so the next run downloads it again; False when there was no digest
    to compare. `sha256` is the file's, computed for the manifest."""
    if expected is None:
        return False
    algorithm, digest = expected
    actual = sha256 if algorithm == "sha256" else git_blob_sha1(cached_file)
    if actual == digest:
        return True
    blob = cached_file.resolve()
    for path in (cached_file, blob):
        path.unlink(missing_ok=True)
    raise InputError(
        f"{repo_id}: {cached_file.name} is corrupt: its {algorithm} is {actual}, the Hub's is {digest} (a damaged "
        f"download or cache); the cached copy was removed: run again to download it anew"
    )
