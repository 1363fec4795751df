"""Publishing an output folder to the Hugging Face Hub: write access (checked before any work), the model card, and
the upload.

The token comes from the environment (HF_TOKEN) or the stored login, through huggingface_hub; it is never taken on
the command line and never printed.
"""

from __future__ import annotations

from pathlib import Path

from converter import __version__, hub
from converter.errors import OutputError, UsageError
from converter.output import read_output
from converter.registry import FAMILIES
from converter.targets import TARGETS


def check_write_access(repo_id: str):
    """Before any work: a token exists, may write, and belongs to the repo's owner (user or org)."""
    from huggingface_hub import HfApi, errors

    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise UsageError(f"the Hub repo to publish to must be ORG/NAME, got {repo_id!r}")

    def whoami() -> dict:
        try:
            return HfApi().whoami()
        except errors.LocalTokenNotFoundError:
            raise OutputError("publishing needs a Hugging Face token: set HF_TOKEN or run `hf auth login`") from None
        except errors.HfHubHTTPError as e:
            raise OutputError(f"the Hub rejected the token ({str(e).splitlines()[0]})") from None

    me = hub.call(whoami, repo_id, "main", error=OutputError)
    role = me.get("auth", {}).get("accessToken", {}).get("role")
    if role == "read":
        raise OutputError(f"the token of {me.get('name')} is read-only; publishing to {repo_id} needs write access")
    owner = repo_id.split("/")[0]
    allowed = {me.get("name")} | {org.get("name") for org in me.get("orgs", [])}
    if owner not in allowed:
        raise OutputError(
            f"the token of {me.get('name')} cannot write to {owner}/ (it can write to: "
            f"{', '.join(sorted(n for n in allowed if n))})"
        )


def original_repo(source: dict) -> str | None:
    """The Hub repo the weights first came from, when they came from one (through an export too)."""
    if "revision" in source:
        return source["origin"]
    earlier = source.get("flax_output", {}).get("source")
    return original_repo(earlier) if earlier else None


def _number(value, spec: str) -> str:
    return "not finite" if value is None else format(value, spec)


def model_card(manifest: dict, repo_id: str) -> str:
    from huggingface_hub import ModelCard, ModelCardData

    target, fmt, family = manifest["target"], manifest["format"], manifest["family"]
    source = manifest["source"]
    data = ModelCardData(
        base_model=original_repo(source),
        library_name=TARGETS[target].library_name,
        tags=[
            "jax",
            target,
            fmt,
            family,
            *([manifest["model"]] if manifest.get("model") else []),
            "vae",
            "vae-convert",
        ],
        license=None,
    )
    checks = manifest.get("validation", {}).get("checks", [])
    rows = "\n".join(
        f"| {c['output']} | {'x'.join(map(str, c['shape']))} | {_number(c['max_abs'], '.2e')} "
        f"| {_number(c['mean_abs'], '.2e')} | {_number(c['tol'], '.1e')} | {'✓' if c['ok'] else '✗'} |"
        for c in checks
    )
    validation = (
        f"| output | shape | max abs diff | mean abs diff | tolerance | |\n|---|---|---|---|---|---|\n{rows}"
        if checks
        else "Not validated (converted with --no-validate)."
    )
    picture = manifest.get("validation", {}).get("preview")
    if picture:
        validation += (
            f"\n\n![A test clip encoded and decoded, and the validation latent decoded, by the converted model and the "
            f"reference, with heat maps of their difference]({picture['file']})"
        )
    revision = source.get("revision") or ", ".join(f"{k} sha256 {v}" for k, v in source.get("sha256", {}).items())
    usage = TARGETS[target].usage
    mapping = manifest.get("mapping")
    mapping_row = f"| mapping | `{mapping['file']}` (sha256 `{mapping['sha256'][:16]}…`) |\n" if mapping else ""
    body = f"""
# {repo_id}

{FAMILIES[family].class_name} weights converted by [vae-convert](https://pypi.org/project/vae-convert/) from
`{source["origin"]}` for the **{target}** target ({fmt}, {manifest["dtype"]}).

## Provenance

| | |
|---|---|
| source | `{source["origin"]}` |
| source revision | `{revision}` |
| tool | vae-convert {manifest["version"]} |
| dtype | {manifest["dtype"]} |
{mapping_row}
## Validation

Decode and encode of fixed inputs with the written weights, against the model they were made from: the reference
PyTorch implementation on the source weights, or for an export the Flax model (both in float32 on the output-dtype
weights).

{validation}

## Usage

```python
from huggingface_hub import snapshot_download
import converter  # pip install vae-convert

path = snapshot_download("{repo_id}")
{usage}
```
"""
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n{body}"))


def publish(
    out_dir: Path, repo_id: str, private: bool, revision: str | None, create_pr: bool, commit_message: str | None
) -> str:
    """Uploads a converted output folder with a generated model card; returns the commit (or PR) URL. A failure leaves
    the local folder as it was and nothing half-committed: a commit is one atomic call on the Hub's side."""
    from huggingface_hub import CommitOperationAdd, HfApi

    manifest = read_output(out_dir).manifest
    api = HfApi()
    message = (
        commit_message
        or f"Upload {manifest.get('model') or manifest['family']} VAE for {manifest['target']} "
        f"(vae-convert {__version__})"
    )
    operations = [
        CommitOperationAdd(path_in_repo=str(p.relative_to(out_dir)), path_or_fileobj=str(p))
        for p in sorted(out_dir.rglob("*"))
        if p.is_file()
    ]
    operations.append(CommitOperationAdd("README.md", model_card(manifest, repo_id).encode()))

    def upload() -> str:
        hub.retrying(lambda: api.create_repo(repo_id, private=private, exist_ok=True))
        if revision and not create_pr:
            hub.retrying(lambda: api.create_branch(repo_id, branch=revision, exist_ok=True))
        return _commit(api, repo_id, operations, message, revision, create_pr)

    return hub.call(upload, repo_id, revision or "main", error=OutputError)


def _commit(api, repo_id: str, operations: list, message: str, revision: str | None, create_pr: bool) -> str:
    """One commit (or pull request), retried after a transient failure without ever landing twice: a branch commit
    names its parent, and before each retry the branch's head is read, so an attempt that failed on the way back but
    landed is taken as done. A pull request has no such check: an attempt whose fate is unknown is not repeated."""
    branch = revision or "main"
    parent = None if create_pr else api.repo_info(repo_id, revision=branch).sha
    backoff = hub.Backoff(hub.install())
    while True:
        try:
            commit = api.create_commit(
                repo_id, operations, commit_message=message, revision=revision, create_pr=create_pr,
                parent_commit=parent,
            )  # fmt: skip
            return commit.pr_url or commit.commit_url
        except Exception as e:
            if create_pr or not hub.transient(e):
                raise
            landed = _landed(api, repo_id, branch, parent, message)
            if landed is not None:
                return landed
            if not backoff.wait():
                raise


def _landed(api, repo_id: str, branch: str, parent: str, message: str) -> str | None:
    """The URL of our commit when the branch's head moved past `parent` by a commit with our message, else None."""
    head = api.list_repo_commits(repo_id, revision=branch)[0]
    if head.commit_id != parent and head.title == message.splitlines()[0]:
        return f"{api.endpoint}/{repo_id}/commit/{head.commit_id}"
    return None
