"""The built-in model under Hugging Face's GPT-2 names: the same architecture (pre-LayerNorm
blocks, tanh GELU, tied embeddings), so a renaming, plus a transpose of the linear layers'
weights (GPT-2 stores them as ``Conv1D``: input by output). Used by the export
(``export.py``) and by ``initFrom`` (the trainer's ``engines/init_weights.py``)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any


class NotGPT2(ValueError):
    """A parameter name with no GPT-2 counterpart."""


_BLOCK = re.compile(r"blocks\.(\d+)\.(ln1|ln2|attn\.qkv|attn\.proj|mlp\.0|mlp\.2)\.(weight|bias)")
_GPT2_PART = {"ln1": "ln_1", "ln2": "ln_2", "attn.qkv": "attn.c_attn", "attn.proj": "attn.c_proj",
              "mlp.0": "mlp.c_fc", "mlp.2": "mlp.c_proj"}
_GPT2_FIXED = {"wte.weight": "transformer.wte.weight", "wpe.weight": "transformer.wpe.weight",
               "ln_f.weight": "transformer.ln_f.weight", "ln_f.bias": "transformer.ln_f.bias"}
_OURS_PART = {v: k for k, v in _GPT2_PART.items()}
_OURS_FIXED = {v: k for k, v in _GPT2_FIXED.items()}
_HF_BLOCK = re.compile(r"h\.(\d+)\.(ln_1|ln_2|attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.(weight|bias)")
HF_PREFIX = "transformer."
"""``GPT2LMHeadModel``'s prefix; a bare ``GPT2Model`` (the Hub's original ``gpt2`` files) has none."""


def gpt2_name(name: str) -> tuple[str, bool]:
    """GPT-2's name for one of the built-in model's parameters, and whether its data is
    transposed there (a linear layer's weight: GPT-2's ``Conv1D`` is input by output)."""
    if name in _GPT2_FIXED:
        return _GPT2_FIXED[name], False
    m = _BLOCK.fullmatch(name)
    if m is None:
        raise NotGPT2(f"parameter {name!r} has no GPT-2 counterpart")
    layer, part, kind = m.groups()
    return f"{HF_PREFIX}h.{layer}.{_GPT2_PART[part]}.{kind}", kind == "weight" and part.startswith(("attn", "mlp"))


def our_name(name: str) -> tuple[str, bool] | None:
    """The inverse of ``gpt2_name``, with or without ``GPT2LMHeadModel``'s ``transformer.``
    prefix; None for a GPT-2 name the built-in model has no parameter for
    (``lm_head.weight``: tied to the embedding; attention masks)."""
    if name in _OURS_FIXED:
        return _OURS_FIXED[name], False
    bare = name.removeprefix(HF_PREFIX)
    if HF_PREFIX + bare in _OURS_FIXED:
        return _OURS_FIXED[HF_PREFIX + bare], False
    m = _HF_BLOCK.fullmatch(bare)
    if m is None:
        return None
    layer, part, kind = m.groups()
    ours = _OURS_PART[part]
    return f"blocks.{layer}.{ours}.{kind}", kind == "weight" and ours.startswith(("attn", "mlp"))


def gpt2_config(model: dict[str, Any], dtype: str) -> dict[str, Any]:
    """transformers' ``GPT2Config`` of the built-in model's shape (``ModelShape``)."""
    vocab = int(model["vocab_size"])
    token = 50256 if vocab > 50256 else None  # GPT-2's <|endoftext|>, when the vocabulary has it
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "n_layer": int(model["n_layer"]), "n_head": int(model["n_head"]), "n_embd": int(model["n_embd"]),
        "vocab_size": vocab, "n_positions": int(model["block_size"]), "n_ctx": int(model["block_size"]),
        "activation_function": "gelu_new",  # the built-in model's GELU(approximate="tanh")
        "layer_norm_epsilon": 1e-5,  # torch's LayerNorm default, which the built-in model keeps
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "tie_word_embeddings": True,
        "bos_token_id": token, "eos_token_id": token, "torch_dtype": dtype,
    }


def is_gpt2_naming(names: Iterable[str]) -> bool:
    """Whether a file's tensor names are GPT-2's (prefixed or bare), not the built-in model's."""
    return any(n.startswith(HF_PREFIX) or _HF_BLOCK.fullmatch(n) for n in names)
