"""``spec.trainer.builtin.initFrom``: start a job from weights in a safetensors file
instead of the seeded initialisation (a pretrained model, a checkpoint exported with
``llmtrain checkpoints export``).

The file may name the parameters as the built-in model does (``blocks.0.attn.qkv.weight``:
our ``safetensors`` export) or as Hugging Face's GPT-2 does (``transformer.h.0.attn.c_attn.weight``:
our ``hf-gpt2`` export, or a GPT-2 of the same shape from elsewhere; its ``Conv1D``
weights are transposed back). Every parameter of the model must be in it with its exact
shape: a partial or mismatched file is refused (``DataError``, exit 65) naming the tensor,
never half-applied. A checkpoint, when one exists, still wins: these weights are only the
starting point of step 0.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from llmtrain_store import safetensors as st
from llmtrain_store.gpt2 import our_name
from torch import nn

from llmtrain_trainer.engines.data import DataError

log = logging.getLogger("llmtrain.trainer")


def load_into(model: nn.Module, path: Path) -> int:
    """Copy the file's weights into ``model``'s parameters; how many were set."""
    try:
        contents = st.read_header(path)
    except st.SafetensorsError as err:
        raise DataError(f"initFrom: {err}") from None
    params = dict(model.named_parameters())  # a tied weight is listed once (wte, not head)
    gpt2 = any(name.startswith("transformer.") for name in contents.entries)
    chosen: dict[str, tuple[str, bool]] = {}
    for name in contents.entries:
        mapped = our_name(name) if gpt2 else (name, False)
        if mapped is None:
            continue  # GPT-2's tied lm_head and attention-mask buffers: nothing of ours
        ours, flip = mapped
        if ours not in params:
            raise DataError(f"initFrom: {path}: tensor {name!r} is no parameter of the model "
                            f"(a file for another architecture or size?)")
        chosen[ours] = (name, flip)
    missing = sorted(set(params) - set(chosen))
    if missing:
        raise DataError(f"initFrom: {path} lacks {len(missing)} of the model's parameters, e.g. {missing[:3]}")
    loaded: dict[str, torch.Tensor] = {}
    for ours, (name, flip) in chosen.items():
        entry = contents.entries[name]
        try:
            data = st.read_tensor(path, contents, name)
        except (OSError, st.SafetensorsError) as err:
            raise DataError(f"initFrom: {err}") from None
        tensor = torch.frombuffer(bytearray(data), dtype=getattr(torch, entry.torch_dtype)).reshape(entry.shape)
        if flip:
            tensor = tensor.t()
        if tuple(tensor.shape) != tuple(params[ours].shape):
            raise DataError(f"initFrom: {path}: {name!r} has shape {list(tensor.shape)}, the model's {ours} "
                            f"{list(params[ours].shape)}")
        if not torch.isfinite(tensor).all():
            raise DataError(f"initFrom: {path}: {name!r} holds a NaN or an infinity")
        loaded[ours] = tensor
    with torch.no_grad():  # only once every tensor checked out: never half-applied
        for ours, tensor in loaded.items():
            params[ours].copy_(tensor.to(params[ours].dtype))
    return len(loaded)
