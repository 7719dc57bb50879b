"""The export's pure parts (llmtrain_store/export.py, gpt2.py): the transpose of GPT-2's
Conv1D weights for every item size, the model's shape read off its parameters, and the
GPT-2 names both ways."""

from __future__ import annotations

import struct

import pytest
from llmtrain_store.export import ExportError, shape_of, transpose
from llmtrain_store.gpt2 import NotGPT2, gpt2_name, is_gpt2_naming, our_name


@pytest.mark.parametrize("code, size", [("B", 1), ("H", 2), ("I", 4), ("Q", 8)])
def test_a_matrix_is_transposed_whatever_its_item_size(code, size):
    rows, cols = 3, 4
    data = struct.pack(f"<{rows * cols}{code}", *range(rows * cols))
    flipped = struct.unpack(f"<{rows * cols}{code}", transpose(data, (rows, cols), size))
    assert flipped == tuple(r * cols + c for c in range(cols) for r in range(rows))
    with pytest.raises(ExportError, match="not a 5 x 4 matrix"):
        transpose(data, (5, 4), size)


def test_the_shape_is_read_off_the_parameters_and_bad_heads_are_refused():
    shapes = {"wte.weight": (100, 64), "wpe.weight": (32, 64), "blocks.0.ln1.weight": (64,), "blocks.1.ln1.weight": (64,)}
    assert shape_of(shapes, 4) == {"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 100, "block_size": 32}
    with pytest.raises(ExportError, match="3 attention heads do not divide the width 64"):
        shape_of(shapes, 3)
    with pytest.raises(ExportError, match="no GPT embedding"):
        shape_of({"w": (1, 2)}, 4)


def test_gpt2_names_both_ways():
    assert gpt2_name("blocks.3.attn.qkv.weight") == ("transformer.h.3.attn.c_attn.weight", True)
    assert gpt2_name("blocks.3.attn.qkv.bias") == ("transformer.h.3.attn.c_attn.bias", False)
    assert gpt2_name("blocks.0.ln2.weight") == ("transformer.h.0.ln_2.weight", False)
    for name in ("wte.weight", "ln_f.bias", "blocks.1.mlp.0.weight", "blocks.1.mlp.2.bias", "blocks.2.attn.proj.weight"):
        theirs, flip = gpt2_name(name)
        assert our_name(theirs) == (name, flip)
    assert our_name("lm_head.weight") is None and our_name("transformer.h.0.attn.bias") is None
    # The Hub's original gpt2 files name a bare GPT2Model: no "transformer." prefix.
    assert our_name("h.3.attn.c_attn.weight") == ("blocks.3.attn.qkv.weight", True) and our_name("wpe.weight") == ("wpe.weight", False)
    assert is_gpt2_naming(["wte.weight", "h.0.ln_1.weight"]) and not is_gpt2_naming(["wte.weight", "blocks.0.ln1.weight"])
    with pytest.raises(NotGPT2):
        gpt2_name("blocks.0.adapter.weight")
