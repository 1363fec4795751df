"""Where the source checkpoint comes from: a local diffusers folder (repo root or its `vae/`), a single
.safetensors file, a sharded checkpoint with its index, or a Hub repo fetched through the standard HF cache."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path

import numpy as np

from converter.errors import InputError
from converter.registry import ModelEntry
from converter.safetensors_io import SafetensorsFile

WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"
INDEX_NAME = WEIGHTS_NAME + ".index.json"
REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+(@[\w./-]+)?$")


@dataclasses.dataclass
class SourceWeights:
    """Every tensor of a (possibly sharded) safetensors checkpoint, read lazily from memory maps."""

    files: list[SafetensorsFile]
    specs: dict[str, tuple[tuple[int, ...], np.dtype]]
    _owner: dict[str, SafetensorsFile]

    @classmethod
    def open(cls, paths: list[Path]) -> "SourceWeights":
        files = [SafetensorsFile(p) for p in paths]
        specs, owner = {}, {}
        for f in files:
            for key in f.keys():
                if key in owner:
                    raise InputError(f"tensor {key!r} is in both {owner[key].path.name} and {f.path.name}")
                specs[key], owner[key] = f.specs[key], f
        return cls(files, specs, owner)

    def __getitem__(self, key: str) -> np.ndarray:
        return self._owner[key][key]

    def floating_dtypes(self) -> set[np.dtype]:
        return {dtype for _, dtype in self.specs.values() if dtype.kind == "f" or dtype.name == "bfloat16"}


@dataclasses.dataclass
class Source:
    weight_files: list[Path]
    config: dict | None
    origin: str  # what the user named: a path or a repo id
    revision: str | None = None  # the resolved Hub commit

    def provenance(self) -> dict:
        out = {"origin": self.origin, "files": [p.name for p in self.weight_files]}
        if self.revision:
            out["revision"] = self.revision
        else:
            out["sha256"] = {p.name: _sha256(p) for p in self.weight_files}
        return out


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def resolve(entry: ModelEntry, source: str | None, revision: str | None, offline: bool) -> Source:
    if source is None:
        return _from_hub(entry, entry.repo_id, entry.subfolder, revision or entry.revision, offline)
    path = Path(source).expanduser()
    if path.exists():
        resolved = _from_path(path)
        if resolved.config is None:  # a lone weights file: the registry model's config
            resolved.config = dict(entry.config)
        return resolved
    if REPO_ID.match(source):
        repo_id, _, at_revision = source.partition("@")
        return _from_hub(entry, repo_id, entry.subfolder, revision or at_revision or "main", offline)
    raise InputError(f"source {source!r} is neither an existing path nor a Hub repo id (org/name[@revision])")


def _read_config(path: Path) -> dict:
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: not a readable JSON config ({e})") from None
    if not isinstance(config, dict):
        raise InputError(f"{path}: a config must be a JSON object")
    return config


def _from_path(path: Path) -> Source:
    if path.is_file():
        if path.name.endswith(".index.json"):
            return Source(_shards(path), _config_beside(path), str(path))
        if path.suffix != ".safetensors":
            raise InputError(f"{path}: not a checkpoint this tool reads (expected .safetensors, a sharded index "
                             f"or a diffusers folder)")
        return Source([path], _config_beside(path), str(path))
    folder = path / "vae" if not (path / "config.json").exists() and (path / "vae").is_dir() else path
    if (folder / INDEX_NAME).exists():
        files = _shards(folder / INDEX_NAME)
    elif (folder / WEIGHTS_NAME).exists():
        files = [folder / WEIGHTS_NAME]
    else:
        raise InputError(f"{path}: no {WEIGHTS_NAME} (or its index) in this folder or its vae/ subfolder")
    if not (folder / "config.json").exists():
        raise InputError(f"{folder}: config.json is missing beside the weights")
    return Source(files, _read_config(folder / "config.json"), str(path))


def _config_beside(path: Path) -> dict | None:
    """A lone weights file takes the config.json beside it, if there is one."""
    beside = path.parent / "config.json"
    return _read_config(beside) if beside.exists() else None


def _shards(index_path: Path) -> list[Path]:
    index = _read_config(index_path)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise InputError(f"{index_path}: an index needs a non-empty 'weight_map'")
    files = [index_path.parent / name for name in sorted(set(weight_map.values()))]
    missing = [p.name for p in files if not p.exists()]
    if missing:
        raise InputError(f"{index_path}: shard(s) named by the index are missing: {', '.join(missing)}")
    weights = SourceWeights.open(files)
    if set(weights.specs) != set(weight_map):
        extra = sorted(set(weights.specs) - set(weight_map))[:3]
        absent = sorted(set(weight_map) - set(weights.specs))[:3]
        raise InputError(f"{index_path}: index and shards disagree (in shards only: {extra}; in index only: {absent})")
    for key, name in weight_map.items():
        if weights._owner[key].path.name != name:
            raise InputError(f"{index_path}: index puts {key!r} in {name}, but it is in {weights._owner[key].path.name}")
    return files


def _from_hub(entry: ModelEntry, repo_id: str, subfolder: str, revision: str, offline: bool) -> Source:
    import huggingface_hub
    from huggingface_hub import errors

    patterns = [f"{subfolder}/config.json", f"{subfolder}/*.safetensors", f"{subfolder}/*.safetensors.index.json"]
    where = f"{repo_id}@{revision}"
    try:
        root = Path(huggingface_hub.snapshot_download(repo_id, revision=revision, allow_patterns=patterns,
                                                      local_files_only=offline or None))
    except errors.GatedRepoError:
        raise InputError(f"{repo_id} is gated: accept its terms on the Hub and log in (HF_TOKEN or `hf auth login`)")
    except errors.RepositoryNotFoundError:
        raise InputError(f"Hub repo {repo_id} not found (or private without a token)") from None
    except errors.RevisionNotFoundError:
        raise InputError(f"revision {revision!r} not found in {repo_id}") from None
    except errors.LocalEntryNotFoundError:
        raise InputError(f"{where} is not in the local Hugging Face cache and offline mode is on") from None
    except (OSError, errors.HfHubHTTPError) as e:
        raise InputError(f"cannot fetch {where}: {str(e).splitlines()[0]}") from None
    folder = root / subfolder
    if not folder.is_dir():
        raise InputError(f"{where} has no {subfolder}/ folder with VAE weights")
    resolved = _from_path(folder)
    return Source(resolved.weight_files, resolved.config, repo_id, revision=root.name)
