"""Our safetensors reader and writer (llmtrain_store/safetensors.py, torch-free) against the
reference implementation (the ``safetensors`` package), and every kind of forged header
refused with its reason before a byte is used."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from llmtrain_store import safetensors as st


def _write(path: Path) -> None:
    a = bytes(range(24))  # 6 float32
    b = bytes(4)  # 2 float16 (numpy has no bfloat16; the trainer test reads one with torch)
    st.write(path, [st.Tensor("blocks.0.w", "float32", (2, 3), 24, lambda: a), st.Tensor("b", "float16", (2,), 4, lambda: b)],
             {"llmtrain_step": "7"})


def test_what_we_write_the_reference_reads_and_what_it_writes_we_read(tmp_path):
    from safetensors.numpy import load_file, save_file
    import numpy as np

    ours = tmp_path / "ours.safetensors"
    _write(ours)
    loaded = load_file(str(ours))
    assert loaded["blocks.0.w"].shape == (2, 3) and loaded["blocks.0.w"].tobytes() == bytes(range(24))
    theirs = tmp_path / "theirs.safetensors"
    save_file({"x": np.arange(6, dtype=np.float32).reshape(2, 3), "y": np.ones(3, dtype=np.int64)}, str(theirs), {"k": "v"})
    contents = st.read_header(theirs)
    assert contents.metadata == {"k": "v"} and set(contents.entries) == {"x", "y"}
    assert st.read_tensor(theirs, contents, "x") == np.arange(6, dtype=np.float32).tobytes()
    assert contents.entries["y"].torch_dtype == "int64"


def _forged(tmp_path: Path, header: object, data: bytes = b"", raw: bytes | None = None) -> Path:
    body = raw if raw is not None else json.dumps(header).encode()
    path = tmp_path / "forged.safetensors"
    path.write_bytes(struct.pack("<Q", len(body)) + body + data)
    return path


@pytest.mark.parametrize("header, data, raw, why", [
    ({}, b"", b"\xff\xfe not json", "not JSON"),
    ([1, 2], b"", None, "not a JSON object"),
    ({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, bytes(4), None, "outside the file's 4 bytes"),
    ({"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8), None, "do not hold a F32 tensor of shape [3]"),
    ({"t": {"dtype": "PICKLE", "shape": [1], "data_offsets": [0, 1]}}, bytes(1), None, "dtype 'PICKLE'"),
    ({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, bytes(4), None, "not a list of sizes"),
    ({"t": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, bytes(4), None, "lie outside"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}},
     bytes(8), None, "overlap"),
    ({"__metadata__": {"k": 1}}, b"", None, "__metadata__ must map names to strings"),
])
def test_a_forged_header_is_refused_naming_why(tmp_path, header, data, raw, why):
    with pytest.raises(st.SafetensorsError, match=why.replace("[", r"\[").replace("]", r"\]")):
        st.read_header(_forged(tmp_path, header, data, raw))


def test_a_header_length_beyond_the_file_or_the_bound_is_refused(tmp_path):
    path = tmp_path / "huge.safetensors"
    path.write_bytes(struct.pack("<Q", st.MAX_HEADER + 1) + b"{}")
    with pytest.raises(st.SafetensorsError, match="does not fit"):
        st.read_header(path)
    (tmp_path / "short").write_bytes(b"abc")
    with pytest.raises(st.SafetensorsError, match="too short"):
        st.read_header(tmp_path / "short")


def test_a_tensor_whose_bytes_do_not_match_its_shape_is_never_written(tmp_path):
    with pytest.raises(st.SafetensorsError, match="do not hold"):
        st.write(tmp_path / "x.safetensors", [st.Tensor("t", "float32", (3,), 8, lambda: bytes(8))])
    assert not (tmp_path / "x.safetensors").exists()
