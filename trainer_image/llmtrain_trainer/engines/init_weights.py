"""``spec.trainer.builtin.initFrom``: start a job from weights in a safetensors file
instead of the seeded initialisation (a pretrained model, a checkpoint exported with
``llmtrain checkpoints export``).

The file may name the parameters as the built-in model does
(``blocks.0.attn.qkv.weight``: our ``safetensors`` export) or as Hugging Face's GPT-2
does (``transformer.h.0.attn.c_attn.weight``, or ``h.0...`` as the Hub's original
``gpt2`` files: our ``hf-gpt2`` export, or a GPT-2 of the same shape from elsewhere; its
``Conv1D`` weights are transposed back). The Hub's GPT-2 has 50257 tokens where the
presets pad to 50304: refused by shape, naming it. Every parameter of the model must be
in it with its exact shape: a partial or mismatched file is refused (``DataError``, exit
65) naming the tensor, never half-applied. A checkpoint, when one exists, still wins: these weights are only the
starting point of step 0, so a file that cannot be read fails the job only when no
checkpoint is resumed (``deferred``: the model is built, and the file read, before the
restore is agreed, since DeepSpeed copies its master weights from the model).

LoRA adapters (``lora``: ``blocks.N.attn.qkv.lora_a`` ...) are the one exception: a file
of base weights has none, so those the file lacks keep their seeded start (A drawn, B
zero); those it has are loaded like any parameter. A file's adapters for a model without
them are refused: the file is not a plain model (merge them into the weights first).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from llmtrain_contract.config import is_adapter
from llmtrain_store import safetensors as st
from llmtrain_store.gpt2 import is_gpt2_naming, our_name
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
    gpt2 = is_gpt2_naming(contents.entries)
    chosen: dict[str, tuple[str, bool]] = {}
    for name in contents.entries:
        mapped = our_name(name) if gpt2 else (name, False)
        if mapped is None:
            continue  # GPT-2's tied lm_head and attention-mask buffers: nothing of ours
        ours, flip = mapped
        if ours not in params and is_adapter(ours):
            raise DataError(f"initFrom: {path}: tensor {name!r} is a LoRA adapter, which this model does not have "
                            f"(set the same lora, or merge the adapters into the weights first)")
        if ours not in params:
            raise DataError(f"initFrom: {path}: tensor {name!r} is no parameter of the model "
                            f"(a file for another architecture or size?)")
        chosen[ours] = (name, flip)
    missing = sorted(n for n in set(params) - set(chosen) if not is_adapter(n))  # adapters keep their seeded start
    if missing:
        raise DataError(f"initFrom: {path} lacks {len(missing)} of the model's parameters, e.g. {missing[:3]}")
    for ours, (name, flip) in chosen.items():  # every shape from the header alone, before a byte is read
        want = tuple(params[ours].shape)
        if tuple(contents.entries[name].shape) != (want[::-1] if flip else want):
            raise DataError(f"initFrom: {path}: {name!r} has shape {list(contents.entries[name].shape)}, the model's {ours} "
                            f"{list(want)}" + (" (GPT-2 stores it transposed)" if flip else ""))
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
        if not torch.isfinite(tensor).all():
            raise DataError(f"initFrom: {path}: {name!r} holds a NaN or an infinity")
        loaded[ours] = tensor
    with torch.no_grad():  # only once every tensor checked out: never half-applied
        for ours, tensor in loaded.items():
            params[ours].copy_(tensor.to(params[ours].dtype))
    return len(loaded)


_deferred: DataError | None = None
"""Why this process's model did not get the ``initFrom`` weights (None: it did, or none
were asked for). The restore decides whether that matters (``check_deferred``)."""


def load_or_defer(model: nn.Module, path: Path) -> int | None:
    """``load_into``, remembering a failure instead of raising it; the count, or None."""
    global _deferred
    try:
        count = load_into(model, path)
    except DataError as err:
        _deferred = err
        return None
    _deferred = None
    return count


def require_loaded(why: str) -> None:
    """Raise the deferred failure (DATA_ERROR) even for a resume: ``why`` the weights are
    needed all the same."""
    if _deferred is not None:
        raise DataError(f"{_deferred}; {why}")


def check_deferred(resumed_step: int | None) -> None:
    """At the restore: a fresh start needs the weights (the failure is raised: DATA_ERROR);
    a resume does not (it is said, and training goes on from ``resumed_step``)."""
    if _deferred is None:
        return
    if resumed_step is None:
        raise _deferred
    log.warning("%s; not needed: resuming the checkpoint of step %d", _deferred, resumed_step)
