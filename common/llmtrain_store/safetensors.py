"""The safetensors format, read and written without torch or the ``safetensors`` package:

    header length (8 bytes, little endian) | header JSON | the tensors' bytes

The header maps each tensor's name to its dtype, shape and ``data_offsets`` (begin, end)
in the byte buffer after the header, plus an optional ``__metadata__`` of strings. It is
Hugging Face's format for weights: transformers, diffusers, vLLM and DCP's converters
read it. Like our archive it holds no code, so reading one never runs any.

A file from elsewhere (``spec.trainer.builtin.initFrom``) is untrusted: every offset,
length and dtype is checked before a byte is used, and a problem raises
``SafetensorsError`` naming it.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

MAX_HEADER = 100 << 20
"""The ``safetensors`` package's own bound on a header; a larger one is refused."""

DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64", "int64": "I64", "int32": "I32",
          "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}
"""Torch dtype names (as our archive records them) -> safetensors' names."""
ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
TORCH_NAMES = {v: k for k, v in DTYPES.items()}


class SafetensorsError(Exception):
    """A file is not a usable safetensors file; the message says why."""


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: str
    """safetensors' dtype name (``F32``, ``BF16`` ...)."""
    shape: tuple[int, ...]
    begin: int
    """From the start of the byte buffer (after the header)."""
    end: int

    @property
    def torch_dtype(self) -> str:
        return TORCH_NAMES[self.dtype]


@dataclass(frozen=True)
class Contents:
    metadata: dict[str, str]
    entries: dict[str, Entry]
    data_start: int
    """Where the byte buffer starts in the file."""


@dataclass(frozen=True)
class Tensor:
    """One tensor to write: ``read`` returns its bytes (called once, when it is written)."""

    name: str
    dtype: str
    """A torch dtype name (``float32``), as our archive records it."""
    shape: tuple[int, ...]
    nbytes: int
    read: Callable[[], bytes]


def write(path: Path, tensors: Iterable[Tensor], metadata: dict[str, str] | None = None) -> int:
    """Write ``tensors`` in order into a new file at ``path`` (replaced atomically); its size."""
    tensors = list(tensors)
    header: dict[str, object] = {"__metadata__": {str(k): str(v) for k, v in (metadata or {}).items()}}
    offset = 0
    for t in tensors:
        if t.dtype not in DTYPES:
            raise SafetensorsError(f"{t.name}: dtype {t.dtype} has no safetensors name")
        if t.nbytes != math.prod(t.shape) * ITEMSIZE[DTYPES[t.dtype]]:
            raise SafetensorsError(f"{t.name}: {t.nbytes} bytes do not hold a {t.dtype} tensor of shape {list(t.shape)}")
        header[t.name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)  # the buffer starts 8-byte aligned, as the format's writer does
    tmp = path.with_name(path.name + ".partial")
    try:
        with open(tmp, "wb") as out:
            out.write(struct.pack("<Q", len(body)) + body)
            for t in tensors:
                data = t.read()
                if len(data) != t.nbytes:
                    raise SafetensorsError(f"{t.name}: read {len(data)} bytes, expected {t.nbytes}")
                out.write(data)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # nothing half-written is left beside the output
        raise
    return 8 + len(body) + offset


def read_header(path: Path) -> Contents:
    """The header of the file at ``path``, every entry checked against the file."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise SafetensorsError(f"{path}: {size} bytes, too short for a safetensors file")
            (length,) = struct.unpack("<Q", prefix)
            if length > MAX_HEADER or 8 + length > size:
                raise SafetensorsError(f"{path}: header length {length} does not fit the file ({size} bytes)")
            raw = f.read(length)
    except OSError as err:
        raise SafetensorsError(f"{path}: cannot be read: {err.strerror or err}") from None
    try:
        doc = json.loads(raw)
    except ValueError as err:
        raise SafetensorsError(f"{path}: the header is not JSON ({err})") from None
    if not isinstance(doc, dict):
        raise SafetensorsError(f"{path}: the header is not a JSON object")
    metadata = doc.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise SafetensorsError(f"{path}: __metadata__ must map names to strings")
    data_start, buffer = 8 + length, size - 8 - length
    entries: dict[str, Entry] = {}
    for name, spec in doc.items():
        entries[name] = _entry(path, name, spec, buffer)
    spans = sorted((e.begin, e.end, e.name) for e in entries.values() if e.end > e.begin)
    for (_, end, a), (begin, _, b) in zip(spans, spans[1:]):
        if begin < end:
            raise SafetensorsError(f"{path}: tensors {a!r} and {b!r} overlap")
    return Contents(metadata, entries, data_start)


def _entry(path: Path, name: str, spec: object, buffer: int) -> Entry:
    where = f"{path}: tensor {name!r}"
    if not isinstance(spec, dict):
        raise SafetensorsError(f"{where}: not an object")
    dtype, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
    if dtype not in ITEMSIZE:
        raise SafetensorsError(f"{where}: dtype {dtype!r} is not one of {sorted(ITEMSIZE)}")
    if not (isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise SafetensorsError(f"{where}: shape {shape!r} is not a list of sizes")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
        raise SafetensorsError(f"{where}: data_offsets {offsets!r} is not [begin, end]")
    begin, end = offsets
    if not 0 <= begin <= end <= buffer:
        raise SafetensorsError(f"{where}: bytes {begin}..{end} lie outside the file's {buffer} bytes of data")
    if end - begin != math.prod(shape) * ITEMSIZE[dtype]:
        raise SafetensorsError(f"{where}: {end - begin} bytes do not hold a {dtype} tensor of shape {shape}")
    return Entry(name, dtype, tuple(shape), begin, end)


def read_tensor(path: Path, contents: Contents, name: str) -> bytes:
    entry = contents.entries[name]
    with open(path, "rb") as f:
        f.seek(contents.data_start + entry.begin)
        data = f.read(entry.end - entry.begin)
    if len(data) != entry.end - entry.begin:
        raise SafetensorsError(f"{path}: tensor {name!r} is truncated")
    return data
