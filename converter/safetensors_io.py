"""safetensors read memory-mapped (one tensor at a time, no copy, bf16 without a float32 detour) and written
streaming (header from known shapes first, then each tensor as it is produced).

The format: 8-byte little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}}, then data.
The reader checks the header fully before any tensor is touched, so a truncated or corrupt file is one clear error.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from converter import untrusted
from converter.errors import InputError


class Dtypes(Mapping):
    """{key: numpy dtype} from {key: the dtype's name}: ml_dtypes' dtypes (bfloat16, the float8s) are made on first
    use, since ml_dtypes' import takes about half a second, which a float32 conversion need not pay."""

    def __init__(self, names: dict[str, str]):
        self.names, self._made = names, {}

    def __getitem__(self, key) -> np.dtype:
        if key not in self._made:
            name = self.names[key]
            if name in ML_DTYPES:
                import ml_dtypes

                self._made[key] = np.dtype(getattr(ml_dtypes, name))
            else:
                self._made[key] = np.dtype(name)
        return self._made[key]

    def __contains__(self, key) -> bool:
        return key in self.names

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


ML_DTYPES = {"bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"}
DTYPES = Dtypes(
    {
        "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32",
        "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
        # the rest of safetensors' dtypes: whole checkpoints keep their other models in them (an fp8 or 8-bit
        # quantized transformer beside a float VAE); read for their shapes, dropped, never converted
        "U16": "uint16", "U32": "uint32", "U64": "uint64", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
        "F8_E8M0": "float8_e8m0fnu",
    }
)  # fmt: skip
CODES = {name: code for code, name in DTYPES.names.items()}  # a dtype's name -> its safetensors code
MAX_HEADER = 100 * 1024 * 1024
ALIGNMENT = 64


def nbytes(shape: tuple[int, ...], dtype) -> int:
    return untrusted.nbytes(shape, np.dtype(dtype).itemsize)


class SafetensorsFile:
    """Tensors of one .safetensors file as numpy views of a memory map: read-only, or with `copy_on_write` writable
    (a write stays in this process; the file is never changed), for models that use the weights in place."""

    def __init__(self, path: str | os.PathLike, copy_on_write: bool = False, shown: str | os.PathLike | None = None):
        self.path = Path(path)
        self.shown = shown or self.path  # what messages call it (a copy is named as its original)
        try:
            with os.fdopen(untrusted.open_regular(self.path, str(self.shown)), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < 8:
                    raise InputError(f"{self.shown}: not a safetensors file ({size} bytes, too short for a header)")
                (header_len,) = struct.unpack("<Q", f.read(8))
                if header_len > min(size - 8, MAX_HEADER):
                    raise InputError(
                        f"{self.shown}: not a safetensors file, or truncated "
                        f"(header claims {header_len} bytes, file has {size})"
                    )
                header_bytes = f.read(header_len)
                access = mmap.ACCESS_COPY if copy_on_write else mmap.ACCESS_READ
                self._map = mmap.mmap(f.fileno(), 0, access=access) if size > 8 + header_len else None
        except OSError as e:
            raise InputError(f"{self.shown}: cannot read ({e.strerror})") from None
        header = untrusted.loads_json(header_bytes, f"{self.shown}: not a safetensors file: its header")
        if not isinstance(header, dict):
            raise InputError(f"{self.shown}: not a safetensors file (its header is not a JSON object)")
        self.metadata = header.pop("__metadata__", None) or {}
        if not isinstance(self.metadata, dict):
            raise InputError(f"{self.shown}: corrupt header: __metadata__ is not an object")
        # the format's metadata maps strings to strings (a config in it is JSON text)
        odd = next((k for k, v in self.metadata.items() if not isinstance(v, str)), None)
        if odd is not None:
            raise InputError(
                f"{self.shown}: corrupt header: __metadata__ {odd!r} is {untrusted.kind(self.metadata[odd])}, "
                "not a string"
            )
        self._data_start = 8 + header_len
        data_size = size - self._data_start
        self.specs: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
        self._offsets: dict[str, tuple[int, int]] = {}
        for name, entry in header.items():
            self._check_entry(name, entry, data_size)
        # Tensors must tile the data area exactly, as the reference implementation requires: no gaps, no overlaps.
        end = 0
        for name, (begin, stop) in sorted(self._offsets.items(), key=lambda item: item[1]):
            if begin != end:
                raise InputError(
                    f"{self.shown}: corrupt header: tensor {name!r} starts at byte {begin}, expected {end}"
                )
            end = stop
        if end != data_size:
            raise InputError(f"{self.shown}: corrupt or truncated: tensors end at byte {end}, the data has {data_size}")

    def _check_entry(self, name, entry, data_size):
        if not (
            isinstance(entry, dict)
            and untrusted.check_value(
                entry, {"dtype": str, "shape": [untrusted.Size], "data_offsets": [untrusted.Size]}
            )
            and entry.get("dtype") in DTYPES
            and isinstance(entry.get("shape"), list)
            and len(entry.get("data_offsets", ())) == 2
        ):
            raise InputError(f"{self.shown}: corrupt header entry for tensor {name!r}")
        dtype, shape = DTYPES[entry["dtype"]], tuple(entry["shape"])
        begin, end = entry["data_offsets"]
        if any(d < 0 for d in shape) or not 0 <= begin <= end:
            raise InputError(f"{self.shown}: corrupt header entry for tensor {name!r}")
        if end > data_size:
            raise InputError(f"{self.shown}: truncated (tensor {name!r} ends at byte {end} of {data_size})")
        if (end - begin) != nbytes(shape, dtype):
            raise InputError(
                f"{self.shown}: corrupt header: tensor {name!r} has {end - begin} bytes for "
                f"shape {list(shape)} {entry['dtype']}"
            )
        self.specs[name] = (shape, dtype)
        self._offsets[name] = (begin, end)

    def keys(self):
        return self.specs.keys()

    def __getitem__(self, name: str) -> np.ndarray:
        shape, dtype = self.specs[name]
        begin, end = self._offsets[name]
        if begin == end:
            return np.zeros(shape, dtype)
        return np.frombuffer(
            self._map, dtype=dtype, count=(end - begin) // dtype.itemsize, offset=self._data_start + begin
        ).reshape(shape)

    def release(self, name: str):
        """Drops the tensor's pages from this process's memory (they stay in the page cache), so that streaming
        through a checkpoint does not grow the resident set by its size."""
        begin, end = self._offsets[name]
        if self._map is None or begin == end:
            return
        start = (self._data_start + begin) // mmap.PAGESIZE * mmap.PAGESIZE
        self._map.madvise(mmap.MADV_DONTNEED, start, self._data_start + end - start)


class SafetensorsWriter:
    """Writes a file whose tensors are all declared up front; `write` then takes them in any order.

    Every tensor whose size is a multiple of 64 bytes (all but a few small ones) starts 64-byte aligned in the file,
    the alignment JAX on CPU needs to use a mapped tensor in place instead of copying it."""

    def __init__(self, path: Path, specs: dict[str, tuple[tuple[int, ...], np.dtype]], metadata: dict[str, str]):
        header, offset = {"__metadata__": metadata}, 0
        # the format allows no gaps between tensors, so the aligned sizes go first, the others after them
        for name, (shape, dtype) in sorted(specs.items(), key=lambda item: nbytes(*item[1]) % ALIGNMENT != 0):
            size = nbytes(shape, dtype)
            header[name] = {
                "dtype": CODES[np.dtype(dtype).name],
                "shape": list(shape),
                "data_offsets": [offset, offset + size],
            }
            offset += size
        encoded = json.dumps(header, separators=(",", ":")).encode()
        encoded += b" " * (-(8 + len(encoded)) % ALIGNMENT)  # trailing spaces, as the format allows
        self._data_start = 8 + len(encoded)
        self._pending = {name: (tuple(shape), np.dtype(dtype)) for name, (shape, dtype) in specs.items()}
        self._offsets = {name: header[name]["data_offsets"][0] for name in specs}
        self._file = open(path, "wb")
        self._file.write(struct.pack("<Q", len(encoded)) + encoded)

    def write(self, name: str, array: np.ndarray):
        shape, dtype = self._pending.pop(name)
        assert array.shape == shape and array.dtype == dtype, (name, array.shape, array.dtype, shape, dtype)
        self._file.seek(self._data_start + self._offsets[name])
        self._file.write(
            np.ascontiguousarray(array).reshape(-1).view(np.uint8).data
        )  # bytes view: bf16 has no buffer code

    def close(self):
        assert not self._pending, f"{len(self._pending)} declared tensors were never written"
        self._file.close()
