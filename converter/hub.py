"""Hugging Face Hub: what a dry run would fetch, write access, the model card, and publishing an output folder.

The token comes from the environment (HF_TOKEN) or the stored login, through huggingface_hub; it is never taken on
the command line and never printed.
"""
from __future__ import annotations

from pathlib import Path

from converter import __version__
from converter.errors import InputError, OutputError
from converter.registry import FAMILIES


def vae_patterns(subfolder: str) -> list[str]:
    """Only the VAE's files, never the multi-GB rest of a pipeline repo."""
    return [f"{subfolder}/config.json", f"{subfolder}/*.safetensors", f"{subfolder}/*.safetensors.index.json"]


def planned_files(repo_id: str, subfolder: str, revision: str, offline: bool) -> list[dict]:
    """[{path, size, cached}] of the files a conversion would fetch, asking the Hub (or only the cache, offline)."""
    import fnmatch

    import huggingface_hub

    patterns = vae_patterns(subfolder)
    if offline:
        try:
            folder = Path(huggingface_hub.snapshot_download(repo_id, revision=revision, allow_patterns=patterns,
                                                            local_files_only=True))
        except huggingface_hub.errors.LocalEntryNotFoundError:
            raise InputError(f"{repo_id}@{revision} is not in the local Hugging Face cache and offline mode is on")
        return [{"path": str(p.relative_to(folder)), "size": p.stat().st_size, "cached": True}
                for p in sorted((folder / subfolder).glob("*")) if p.is_file()]
    info = hub_call(lambda: huggingface_hub.HfApi().model_info(repo_id, revision=revision, files_metadata=True),
                     repo_id, revision)
    files = []
    for sibling in info.siblings or []:
        if any(fnmatch.fnmatch(sibling.rfilename, p) for p in patterns):
            cached = huggingface_hub.try_to_load_from_cache(repo_id, sibling.rfilename, revision=info.sha)
            files.append({"path": sibling.rfilename, "size": sibling.size, "cached": isinstance(cached, str)})
    if not files:
        raise InputError(f"{repo_id}@{revision} has no {subfolder}/ folder with VAE weights")
    return files


def hub_call(call, repo_id: str, revision: str, offline: bool = False, error=InputError):
    from huggingface_hub import errors

    try:
        return call()
    except errors.GatedRepoError:
        raise InputError(f"{repo_id} is gated: accept its terms on the Hub and log in (HF_TOKEN or `hf auth login`)")
    except errors.RepositoryNotFoundError:
        raise InputError(f"Hub repo {repo_id} not found (or private without a token)") from None
    except errors.RevisionNotFoundError:
        raise InputError(f"revision {revision!r} not found in {repo_id}") from None
    except errors.LocalEntryNotFoundError as e:
        if offline:
            raise InputError(f"{repo_id}@{revision} is not in the local Hugging Face cache and offline mode is on") \
                from None
        raise InputError(f"cannot fetch {repo_id}@{revision} from the Hub, and it is not cached "
                         f"({str(e).splitlines()[0]})") from None
    except (OSError, errors.HfHubHTTPError) as e:
        raise error(f"the Hub failed for {repo_id}@{revision}: {str(e).splitlines()[0]}") from None


def check_write_access(repo_id: str):
    """Before any conversion work: a token exists, may write, and belongs to the repo's owner (user or org)."""
    from huggingface_hub import HfApi, errors

    if repo_id.count("/") != 1:
        raise InputError(f"--push-to-hub takes ORG/NAME, got {repo_id!r}")
    try:
        me = HfApi().whoami()
    except errors.LocalTokenNotFoundError:
        raise OutputError("publishing needs a Hugging Face token: set HF_TOKEN or run `hf auth login`") from None
    except errors.HfHubHTTPError as e:
        raise OutputError(f"the Hub rejected the token ({str(e).splitlines()[0]})") from None
    role = me.get("auth", {}).get("accessToken", {}).get("role")
    if role == "read":
        raise OutputError(f"the token of {me.get('name')} is read-only; publishing to {repo_id} needs write access")
    owner = repo_id.split("/")[0]
    allowed = {me.get("name")} | {org.get("name") for org in me.get("orgs", [])}
    if owner not in allowed:
        raise OutputError(f"the token of {me.get('name')} cannot write to {owner}/ (it can write to: "
                          f"{', '.join(sorted(n for n in allowed if n))})")


def model_card(manifest: dict, repo_id: str) -> str:
    from huggingface_hub import ModelCard, ModelCardData

    target, fmt, family = manifest["target"], manifest["format"], manifest["family"]
    source = manifest["source"]
    data = ModelCardData(
        base_model=source["origin"] if "revision" in source else None,
        library_name="flax" if target == "flax" else "diffusers",
        tags=["jax", "flax" if target == "flax" else "torchax", fmt, family, "vae", "vae-convert"],
        license=None,
    )
    checks = manifest.get("validation", {}).get("checks", [])
    rows = "\n".join(f"| {c['output']} | {'x'.join(map(str, c['shape']))} | {c['max_abs']:.2e} | {c['mean_abs']:.2e} "
                     f"| {c['tol']:.1e} | {'✓' if c['ok'] else '✗'} |" for c in checks)
    validation = (f"| output | shape | max abs diff | mean abs diff | tolerance | |\n|---|---|---|---|---|---|\n{rows}"
                  if checks else "Not validated (converted with --no-validate).")
    revision = source.get("revision") or ", ".join(f"{k} sha256 {v}" for k, v in source.get("sha256", {}).items())
    usage = ("vae = converter.load(path)                     # Flax NNX model, channels-last (B, T, H, W, C)"
             if target == "flax" else
             "vae = converter.load(path)                     # PyTorch model with diffusers' names\n"
             "from converter.torchax_runtime import compile_model\n"
             "vae = compile_model(vae)                       # on JAX through torchax, steps jitted")
    body = f"""
# {repo_id}

{FAMILIES[family].class_name} weights converted by [vae-convert](https://pypi.org/project/vae-convert/) from
`{source['origin']}` for the **{target}** target ({fmt}, {manifest['dtype']}).

## Provenance

| | |
|---|---|
| source | `{source['origin']}` |
| source revision | `{revision}` |
| tool | vae-convert {manifest['version']} |
| dtype | {manifest['dtype']} |
| mapping | `{manifest['mapping']['file']}` (sha256 `{manifest['mapping']['sha256'][:16]}…`) |

## Validation

Decode and encode of fixed inputs with the converted weights, against the reference PyTorch implementation on the
source weights (both in float32 on the output-dtype weights).

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


def publish(out_dir: Path, repo_id: str, private: bool, revision: str | None, create_pr: bool,
            commit_message: str | None) -> str:
    """Uploads a converted output folder with a generated model card; returns the commit (or PR) URL."""
    from huggingface_hub import CommitOperationAdd, HfApi

    from converter.output import read_manifest

    manifest = read_manifest(out_dir)
    api = HfApi()
    message = commit_message or f"Upload {manifest['model']} VAE for {manifest['target']} (vae-convert {__version__})"
    operations = [CommitOperationAdd(path_in_repo=str(p.relative_to(out_dir)), path_or_fileobj=str(p))
                  for p in sorted(out_dir.rglob("*")) if p.is_file()]
    operations.append(CommitOperationAdd("README.md", model_card(manifest, repo_id).encode()))

    def upload():
        api.create_repo(repo_id, private=private, exist_ok=True)
        if revision and not create_pr:
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        return api.create_commit(repo_id, operations, commit_message=message, revision=revision, create_pr=create_pr)

    commit = hub_call(upload, repo_id, revision or "main", error=OutputError)
    return commit.pr_url or commit.commit_url


def describe_plan(files: list[dict]) -> str:
    lines = [f"  {'cached ' if f['cached'] else 'fetch  '} {f['path']}  ({_size(f['size'])})" for f in files]
    total = sum(f["size"] or 0 for f in files if not f["cached"])
    return "\n".join(lines + [f"  to fetch: {_size(total)}"])


def _size(n) -> str:
    if n is None:
        return "size unknown"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
