"""Where the source checkpoint comes from: a local diffusers folder (repo root or its `vae/`), a single
.safetensors file, a sharded checkpoint with its index, a release that keeps each of an autoencoder's parts in a file
of its own, or a Hub repo fetched through the standard HF cache."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from converter import hub, untrusted
from converter.errors import InputError
from converter.output import size_text
from converter.registry import ModelEntry
from converter.safetensors_io import SafetensorsFile

WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"
PICKLE_WEIGHTS_NAME = "diffusion_pytorch_model.bin"
INDEX_NAME = WEIGHTS_NAME + ".index.json"
REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+(@[\w./-]+)?$")


PICKLE_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt")
# A release may keep each part of an autoencoder in a file of its own, `<stem>_<part><suffix>` (TAESD's
# taesd_encoder.pth and taesd_decoder.pth): its keys are read under `<part>.`, where they would otherwise collide
SPLIT_PARTS = ("encoder", "decoder")


@dataclasses.dataclass
class SourceWeights:
    """Every tensor of a checkpoint (safetensors, possibly sharded, or a PyTorch pickle), read lazily."""

    specs: dict[str, tuple[tuple[int, ...], np.dtype]]
    _read: dict[str, Callable[[], np.ndarray]]
    _origin: dict[str, str]  # key -> file name
    _release: dict[str, Callable[[], None]]
    wrapper: str | None = None  # the key of the dict a pickle keeps its tensors under (`state_dict`), if any
    metadata: dict = dataclasses.field(default_factory=dict)  # a safetensors file's header metadata (the first's)

    @classmethod
    def open(cls, paths: list[Path], parts: dict[str, str] | None = None) -> SourceWeights:
        """The tensors of `paths`; a file that `parts` names (by file name) holds one part of a split release, its
        keys read under the part's name."""
        specs, read, origin, release, wrappers, metadata = {}, {}, {}, {}, set(), {}
        for path in paths:
            if path.suffix in PICKLE_SUFFIXES:
                tensors, wrapper = _pickle_tensors(path)
                wrappers.add(wrapper)
            else:
                tensors, file_metadata = _safetensors_tensors(path)
                metadata = metadata or file_metadata
            if parts and path.name in parts:
                tensors = {f"{parts[path.name]}.{key}": value for key, value in tensors.items()}
            for key, (spec, reader, releaser) in tensors.items():
                if key in origin:
                    raise InputError(f"tensor {key!r} is in both {origin[key]} and {path.name}")
                specs[key], read[key], origin[key], release[key] = spec, reader, path.name, releaser
        return cls(specs, read, origin, release, wrappers.pop() if len(wrappers) == 1 else None, metadata)

    def __getitem__(self, key: str) -> np.ndarray:
        return self._read[key]()

    def release(self, key: str):
        """Done with this tensor: let its memory go (memory-mapped pages are dropped from the resident set)."""
        self._release[key]()

    def file_of(self, key: str) -> str:
        return self._origin[key]

    def floating_dtypes(self) -> set[np.dtype]:
        return {dtype for _, dtype in self.specs.values() if dtype.kind == "f" or dtype.name == "bfloat16"}


def ensure_weights_or_counts(weights, keys):
    """The tensors a conversion reads (`keys`) hold weights (floating point) or counts (signed integers): any other
    dtype would change what it says when cast. Tensors it drops may be of any dtype (a whole checkpoint's fp8
    transformer)."""
    for key in keys:
        dtype = np.dtype(weights.specs[key][1])
        if not (dtype.kind in "fi" or dtype.name == "bfloat16"):
            raise InputError(
                f"tensor {key!r} holds {dtype.name} values: neither weights (floating point) nor a count (signed "
                "integers), and casting them would change what they say"
            )


def _safetensors_tensors(path: Path) -> tuple[dict, dict]:
    f = SafetensorsFile(path, copy_on_write=True)  # writable views: validation's reference uses them in place
    tensors = {
        key: (f.specs[key], functools.partial(f.__getitem__, key), functools.partial(f.release, key))
        for key in f.keys()
    }
    return tensors, f.metadata


def _pickle_tensors(path: Path) -> tuple[dict, str | None]:
    """A PyTorch state_dict pickle, loaded with weights_only=True (a pickle that needs code is refused, never run) and
    memory-mapped where torch can (zip pickles: every torch.save since 1.6). The tensors are the top-level dict's, or
    those of the one dict inside it that holds only tensors (the wrapper, whose key is returned: source formats
    declare theirs)."""
    import pickle

    import torch

    os.close(untrusted.open_regular(path))  # a FIFO would make torch.load wait for a writer
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=_is_zip(path))
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(
            f"{path}: refused: this pickle needs code to load, and only plain tensors are loaded "
            f"(weights_only=True); nothing of it was executed ({first[:160]})"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise InputError(f"{path}: not a readable PyTorch checkpoint ({str(e).splitlines()[0][:160]})") from None

    def all_tensors(d) -> bool:
        return isinstance(d, dict) and bool(d) and all(isinstance(v, torch.Tensor) for v in d.values())

    wrapper = None
    if isinstance(state, dict) and not all_tensors(state):
        inner = [k for k, v in state.items() if all_tensors(v)]
        wrapper = inner[0] if len(inner) == 1 else None
    tensors = state[wrapper] if wrapper is not None else state
    if not all_tensors(tensors):
        raise InputError(f"{path}: not a state_dict (expected a mapping of names to tensors)")
    for key, tensor in tensors.items():
        if not isinstance(key, str):
            raise InputError(f"{path}: key {key!r} is {type(key).__name__}, not a tensor's name")
        problem = _not_plain(tensor)
        if problem:
            raise InputError(f"{path}: tensor {key!r} {problem}")
    # an nn.Parameter (state_dict(keep_vars=True), named_parameters()) is a plain weight
    tensors = {key: tensor.detach() for key, tensor in tensors.items()}
    mapped = _is_zip(path)
    readers = {
        key: (
            (tuple(t.shape), _numpy_dtype(t)),
            functools.partial(_tensor_to_numpy, t),
            functools.partial(_drop_pages, t) if mapped else _keep,
        )
        for key, t in tensors.items()
    }
    return readers, wrapper


def _keep():
    pass


def _not_plain(tensor) -> str | None:
    """What keeps a pickled tensor from being read as an array of weights, or None."""
    import torch

    if tensor.is_quantized:
        return f"is quantized ({tensor.dtype}): dequantize it first"
    if tensor.layout != torch.strided:
        return f"is a {str(tensor.layout).removeprefix('torch.')} tensor, not a dense one"
    if tensor.device.type == "meta":
        return "holds no data (a meta tensor)"
    weights_or_counts = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
    weights_or_counts += (torch.int64, torch.int32, torch.int16, torch.int8)
    if tensor.dtype not in weights_or_counts:
        return f"holds {str(tensor.dtype).removeprefix('torch.')} values: neither weights nor a count this tool reads"
    return None


def _drop_pages(tensor):
    """A memory-mapped tensor's pages leave the resident set (clean file pages: read again from the file if touched),
    as SafetensorsFile.release does, so streaming through a pickle does not grow memory by its size. Linux only.

    The range is the tensor's storage, which lies in the file's mapping, never its logical size: a pickle may hold
    views (an expanded tensor has stride 0) whose logical size is far beyond the bytes behind them. Only pages wholly
    inside the storage are released: its first and last may be shared with data outside it."""
    import ctypes
    import mmap
    import sys

    storage = tensor.untyped_storage()
    if sys.platform != "linux" or not tensor.is_contiguous() or storage.nbytes() != tensor.nbytes:
        return
    begin = -(-storage.data_ptr() // mmap.PAGESIZE) * mmap.PAGESIZE
    end = (storage.data_ptr() + storage.nbytes()) // mmap.PAGESIZE * mmap.PAGESIZE
    if end > begin:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
        madvise(ctypes.c_void_p(begin), ctypes.c_size_t(end - begin), mmap.MADV_DONTNEED)


def _is_zip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"PK\x03\x04"


def _numpy_dtype(tensor) -> np.dtype:
    import ml_dtypes
    import torch

    return np.dtype(ml_dtypes.bfloat16) if tensor.dtype == torch.bfloat16 else tensor.numpy().dtype


def _tensor_to_numpy(tensor) -> np.ndarray:
    import ml_dtypes
    import torch

    if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16: reinterpret the bits
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


@dataclasses.dataclass
class Source:
    weight_files: list[Path]
    config: dict | None
    origin: str  # what the user named: an absolute path or a repo id
    revision: str | None = None  # the resolved Hub commit
    config_file: Path | None = None  # where `config` was read
    snapshot: Path | None = None  # a Hub source's snapshot folder in the Hugging Face cache
    offline: bool = False  # a Hub source read from the cache alone: the Hub is not asked for digests
    parts: dict[str, str] = dataclasses.field(default_factory=dict)  # a split release's file name -> its part

    def open_weights(self) -> SourceWeights:
        return SourceWeights.open(self.weight_files, self.parts)

    @property
    def protected(self) -> list[Path]:
        """What an output must never replace: the source as named and its files."""
        return ([] if self.revision else [Path(self.origin)]) + list(self.weight_files)

    def start_hashing(self) -> Callable[[], dict]:
        """Starts hashing the weight files in a thread (hashlib releases the GIL, so it overlaps the conversion);
        returns a function that waits and gives the provenance record. A Hub file's digest is compared with the
        Hub's there (InputError on a mismatch, its cached copy removed)."""
        import concurrent.futures

        out = {"origin": self.origin, "files": [p.name for p in self.weight_files]}
        if self.revision:
            out["revision"] = self.revision
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        digests = [pool.submit(_sha256, p) for p in self.weight_files]
        pool.shutdown(wait=False)

        @functools.cache
        def result() -> dict:
            out["sha256"] = {p.name: d.result() for p, d in zip(self.weight_files, digests)}
            if self.revision:
                unverified = [p.name for p in self.weight_files if not self._verify(p, out["sha256"][p.name])]
                out["verified"] = (
                    f"no: the cache names no Hub digest for {', '.join(unverified)}, and the run was offline"
                    if unverified
                    else "sha256 equal to the Hub's"
                )
            return out

        return result

    def _verify(self, path: Path, sha256: str) -> bool:
        """Compares a Hub file with the digest the cache names it by; a cache of plain files (copied dereferenced, or
        made where links are unsupported) names none: the Hub is asked, unless offline."""
        expected = hub.hub_digest(path)
        if expected is None and not self.offline:
            expected = hub.asked_digest(self.origin, self.revision, path.relative_to(self.snapshot).as_posix())
        return hub.verify(path, sha256, self.origin, expected)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def hub_location(entry: ModelEntry, source: str | None, revision: str | None) -> tuple[str, str] | None:
    """(repo_id, revision) when the source is a Hub repo, None when it is a local path."""
    if source is None:
        return entry.repo_id, revision or entry.revision
    path = Path(source).expanduser()
    if path.exists():
        return None
    if _looks_local(source):
        raise InputError(f"source {source}: no such file or folder ({path.absolute()})")
    if REPO_ID.match(source):
        repo_id, _, at_revision = source.partition("@")
        return repo_id, revision or at_revision or "main"
    raise InputError(f"source {source!r} is neither an existing path nor a Hub repo id (org/name[@revision])")


def _looks_local(source: str) -> bool:
    """A path, not a repo id: it starts like one, names a checkpoint file, or its first folder exists here."""
    first = source.split("/", 1)[0]
    return (
        source.startswith((".", "/", "~"))
        or source.endswith((".safetensors", ".json", *PICKLE_SUFFIXES))
        or ("/" in source and Path(first).expanduser().is_dir())
    )


def resolve(entry: ModelEntry, source: str | None, revision: str | None, offline: bool) -> Source:
    hub = hub_location(entry, source, revision)
    if hub is not None:
        return _from_hub(*hub, entry.subfolder, offline)
    return _from_path(Path(source).expanduser().absolute(), entry.component)


def read_config(path: Path) -> dict:
    """A JSON object from a file: a config.json, or a shard index."""
    return untrusted.read_json(path, schema=dict)


def _from_path(path: Path, component: str = "vae") -> Source:
    """The checkpoint at `path`: a file, a component's folder, or a pipeline's folder holding `component`/."""
    if path.is_file():
        if path.name.endswith(".index.json"):
            return Source(_shards(path), _config_beside(path), str(path), config_file=_config_path_beside(path))
        if path.suffix != ".safetensors" and path.suffix not in PICKLE_SUFFIXES:
            raise InputError(
                f"{path}: not a checkpoint this tool reads (expected .safetensors, .pth/.pt/.bin/.ckpt, a "
                f"sharded index or a diffusers folder)"
            )
        stem, part = _part_of(path.name) or (None, None)
        parts = _split_release(path.parent, stem, part, path.suffix)
        files = [path.parent / name for name in parts] if parts else [path]
        return Source(files, _config_beside(path), str(path), config_file=_config_path_beside(path), parts=parts)
    folder = path / component if not (path / "config.json").exists() and (path / component).is_dir() else path
    if (folder / INDEX_NAME).exists():
        files = _shards(folder / INDEX_NAME)
    elif (folder / WEIGHTS_NAME).exists():
        files = [folder / WEIGHTS_NAME]
    elif (folder / PICKLE_WEIGHTS_NAME).exists():
        files = [folder / PICKLE_WEIGHTS_NAME]
    elif parts := _split_release_in(path):
        return Source([path / name for name in parts], None, str(path), parts=parts)
    else:
        raise InputError(
            f"{path}: no {WEIGHTS_NAME} (or its index) in this folder or its {component}/ subfolder, nor a release "
            f"split by part (<name>_{'.*, <name>_'.join(SPLIT_PARTS)}.*)"
        )
    if not (folder / "config.json").exists():
        raise InputError(f"{folder}: config.json is missing beside the weights")
    return Source(files, read_config(folder / "config.json"), str(path), config_file=folder / "config.json")


def _part_of(name: str) -> tuple[str, str] | None:
    """(stem, part) of a split release's file name (`taesd_encoder.pth` -> ("taesd", "encoder")), or None."""
    base = name.rsplit(".", 1)[0]
    return next(((base.removesuffix(f"_{part}"), part) for part in SPLIT_PARTS if base.endswith(f"_{part}")), None)


def _split_release(folder: Path, stem: str | None, part: str | None, suffix: str) -> dict[str, str]:
    """{file name: part} of the split release `stem` in `folder` in files of `suffix` ({} where `stem` is None); a
    part missing beside the others is bad input."""
    if stem is None:
        return {}
    names = {f"{stem}_{p}{suffix}": p for p in SPLIT_PARTS}
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        raise InputError(
            f"{folder / f'{stem}_{part}{suffix}'}: one part of a release split by part; {', '.join(missing)} "
            f"is missing beside it"
        )
    return names


def _split_release_in(folder: Path) -> dict[str, str]:
    """The one split release a folder holds (its .safetensors files over its pickles), or {}; two are ambiguous."""
    for suffix in (".safetensors", *PICKLE_SUFFIXES):
        stems = sorted({found[0] for p in folder.glob(f"*{suffix}") if (found := _part_of(p.name))})
        if len(stems) > 1:
            raise InputError(f"{folder}: holds several releases split by part ({', '.join(stems)}); name one file")
        if stems:
            return _split_release(folder, stems[0], SPLIT_PARTS[0], suffix)
    return {}


def _config_path_beside(path: Path) -> Path | None:
    beside = path.parent / "config.json"
    return beside if os.path.lexists(beside) else None


def _config_beside(path: Path) -> dict | None:
    """A lone weights file takes the config.json beside it, if there is one."""
    beside = _config_path_beside(path)
    return read_config(beside) if beside else None


def _shards(index_path: Path) -> list[Path]:
    index = read_config(index_path)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise InputError(f"{index_path}: an index needs a non-empty 'weight_map'")
    untrusted.check(weight_map, {str: str}, str(index_path), at=".weight_map")
    # refused before anything is opened: an index names files beside it, never elsewhere
    outside = sorted({name for name in weight_map.values() if not untrusted.plain_file_name(name)})
    if outside:
        raise InputError(
            f"{index_path}: the index names {outside[0]!r}, not a file name beside the index; shards must lie in "
            f"its folder"
        )
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
        if weights.file_of(key) != name:
            raise InputError(f"{index_path}: index puts {key!r} in {name}, but it is in {weights.file_of(key)}")
    return files


def _from_hub(repo_id: str, revision: str, subfolder: str, offline: bool) -> Source:
    import huggingface_hub

    root = Path(
        hub.call(
            lambda: huggingface_hub.snapshot_download(
                repo_id, revision=revision, allow_patterns=vae_patterns(subfolder), local_files_only=offline or None
            ),
            repo_id,
            revision,
            offline or hub.offline_env(),
        )
    )
    folder = root / subfolder
    if not folder.is_dir():
        raise InputError(f"{repo_id}@{revision} has no VAE weights in {repo_folder(subfolder)}")
    resolved = _from_path(folder)
    return Source(
        resolved.weight_files,
        resolved.config,
        repo_id,
        revision=root.name,
        config_file=resolved.config_file,
        snapshot=root,
        offline=offline or hub.offline_env(),
    )


def vae_patterns(subfolder: str) -> list[str]:
    """Only the VAE's files, never the multi-GB rest of a pipeline repo ("": a repo of the VAE alone, at its root).
    diffusers' weight files are named: a `*` matches across folders, so at the root it would take every file."""
    prefix = f"{subfolder}/" if subfolder else ""
    return [
        f"{prefix}config.json",
        f"{prefix}{WEIGHTS_NAME.removesuffix('.safetensors')}*.safetensors",
        f"{prefix}{INDEX_NAME}",
    ]


def repo_folder(subfolder: str) -> str:
    """Where in a Hub repo the VAE lives, in words."""
    return f"its {subfolder}/ folder" if subfolder else "its top folder"


def planned_files(repo_id: str, subfolder: str, revision: str, offline: bool) -> list[dict]:
    """[{path, size, cached}] of the files a conversion would fetch, asking the Hub (or only the cache, offline)."""
    import fnmatch

    import huggingface_hub

    patterns = vae_patterns(subfolder)
    if offline or hub.offline_env():
        folder = Path(
            hub.call(
                lambda: huggingface_hub.snapshot_download(
                    repo_id, revision=revision, allow_patterns=patterns, local_files_only=True
                ),
                repo_id,
                revision,
                True,
            )
        )
        return [
            {"path": str(p.relative_to(folder)), "size": p.stat().st_size, "cached": True}
            for p in sorted((folder / subfolder).glob("*"))
            if p.is_file()
        ]
    info = hub.call(
        lambda: huggingface_hub.HfApi().model_info(repo_id, revision=revision, files_metadata=True), repo_id, revision
    )
    files = []
    for sibling in info.siblings or []:
        if any(fnmatch.fnmatch(sibling.rfilename, p) for p in patterns):
            cached = huggingface_hub.try_to_load_from_cache(repo_id, sibling.rfilename, revision=info.sha)
            files.append({"path": sibling.rfilename, "size": sibling.size, "cached": isinstance(cached, str)})
    if not files:
        raise InputError(f"{repo_id}@{revision} has no VAE weights in {repo_folder(subfolder)}")
    return files


def describe_files(files: list[dict]) -> str:
    lines = [f"  {'cached ' if f['cached'] else 'fetch  '} {f['path']}  ({size_text(f['size'])})" for f in files]
    total = sum(f["size"] or 0 for f in files if not f["cached"])
    return "\n".join(lines + [f"  to fetch: {size_text(total)}"])


def ensure_weights_fit_config(family, expected: dict[str, tuple], weights, where: str = ""):
    """A diffusers-layout checkpoint (`weights.specs`) against the PyTorch model its config describes (diffusers'
    names and shapes). A mismatch here is bad input (wrong config, damaged checkpoint), told apart from mapping bugs
    found later."""
    unexpected = [k for k in weights.specs if k not in expected]
    missing = [k for k in expected if k not in weights.specs]
    wrong = [k for k in expected if k in weights.specs and tuple(weights.specs[k][0]) != expected[k]]
    problems = []
    if unexpected:
        problems.append(f"{len(unexpected)} key(s) {family.class_name} does not have: {_first(unexpected)}")
    if missing:
        problems.append(f"{len(missing)} key(s) missing from the checkpoint: {_first(missing)}")
    if wrong:
        k = wrong[0]
        problems.append(
            f"the config and the weights disagree on {len(wrong)} shape(s), e.g. {k!r} is "
            f"{list(weights.specs[k][0])} in the checkpoint, the config implies {list(expected[k])}"
        )
    if problems:
        raise InputError(where + "; ".join(problems))


def _first(keys: list[str], n: int = 3) -> str:
    return ", ".join(repr(k) for k in keys[:n]) + (", ..." if len(keys) > n else "")
