"""Folding LoRA adapters without numpy or torch (``lora.py``): the product matches a plain
triple loop, in each dtype the trainer writes, rounded as torch rounds."""

from __future__ import annotations

import random
import struct
from array import array

import pytest
from llmtrain_store import lora


def _reference(w, a, b, rows, cols, rank, scale):
    return [w[i * cols + j] + scale * sum(b[i * rank + r] * a[r * cols + j] for r in range(rank))
            for i in range(rows) for j in range(cols)]


def test_the_fold_equals_the_plain_product_in_float32():
    rng = random.Random(0)
    rows, cols, rank = 7, 11, 3
    w, a, b = ([rng.uniform(-1, 1) for _ in range(n)] for n in (rows * cols, rank * cols, rows * rank))
    packed = [array("f", v).tobytes() for v in (w, a, b)]
    out = memoryview(lora.merge(*packed, (rows, cols), rank, "float32", 0.5)).cast("f").tolist()
    ref = array("f", _reference(*(memoryview(p).cast("f").tolist() for p in packed), rows, cols, rank, 0.5)).tolist()
    assert max(abs(x - y) for x, y in zip(out, ref)) < 1e-6


def test_bfloat16_and_float16_round_to_nearest():
    rows, cols, rank = 1, 4, 1
    one = struct.pack("<4e", 1.0, 2.0, -3.0, 0.5)
    out = struct.unpack("<4e", lora.merge(one, struct.pack("<4e", 1, 1, 1, 1), struct.pack("<e", 0.25), (rows, cols), rank,
                                          "float16", 2.0))
    assert out == (1.5, 2.5, -2.5, 1.0)
    bf = lambda v: struct.unpack("<I", struct.pack("<f", v))[0] >> 16  # noqa: E731 - exact for these values
    packed = array("H", [bf(1.0), bf(256.0)]).tobytes()
    out_bits = array("H", lora.merge(packed, array("H", [bf(1.0), bf(1.0)]).tobytes(), array("H", [bf(1.0)]).tobytes(),
                                     (1, 2), 1, "bfloat16", 1.0))
    assert [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in out_bits] == [2.0, 256.0], \
        "256 + 1 rounds to 256 in bfloat16 (8 bits of mantissa), to nearest even"


def test_hostile_records_and_shapes_are_refused_by_name():
    with pytest.raises(ValueError, match="no usable rank and alpha"):
        lora.scale_of({"rank": 0, "alpha": 16})
    with pytest.raises(ValueError, match="not a mapping"):
        lora.scale_of(["rank", 8])
    with pytest.raises(lora.MergeRefused, match="do not make"):
        lora.merge(bytes(16), bytes(8), bytes(8), (2, 2), 2, "float32", 1.0)
    with pytest.raises(lora.MergeRefused, match="dtype 'int8'"):
        lora.merge(b"", b"", b"", (0, 0), 1, "int8", 1.0)
    assert lora.adapted(["x.weight", "x.lora_a", "x.lora_b", "y.lora_a", "z.weight"]) == {"x.weight": ("x.lora_a", "x.lora_b")}
