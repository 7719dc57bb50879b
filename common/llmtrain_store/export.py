"""A checkpoint's weights out of our format, for every other tool: ``llmtrain checkpoints
export``.

- ``safetensors``: the model's parameters as the built-in trainer names them
  (``blocks.0.attn.qkv.weight``), one ``model.safetensors``; ``initFrom`` reads it back.
- ``hf-gpt2``: a folder that Hugging Face transformers loads with
  ``GPT2LMHeadModel.from_pretrained``: ``config.json`` and ``model.safetensors`` under
  GPT-2's names. The built-in model is GPT-2's architecture (pre-LayerNorm blocks, tanh
  GELU, tied embeddings), so the mapping is a renaming, plus a transpose of the linear
  layers' weights (GPT-2 stores them as ``Conv1D``: input by output). No tokenizer goes
  with it: the built-in data are token ids, whose vocabulary is the job's own.

A fine-tune's frozen weights leave with the trained ones. Its LoRA adapters stay apart
under our names (``<layer>.lora_a``, ``.lora_b``: a LoRA job's ``initFrom`` reads them), and
are folded into the weights they adapt for ``hf-gpt2`` (``lora.py``).

Only the weights leave; the optimizer state stays (resume needs our format). Read from a
verified copy: the step's files are fetched and every piece checked against the manifest,
as a restore does, before a byte is exported. DDP checkpoints only: DeepSpeed's ZeRO
shards need its own ``zero_to_fp32.py`` to be gathered first.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from . import archive, lora
from . import manifest as mf
from . import safetensors as st
from .gpt2 import NotGPT2, gpt2_config, gpt2_name
from .survey import Found
from .tier import Committed

FORMATS = ("safetensors", "hf-gpt2")
STATE = "state.llmt"
PARAM = "param/"
"""The archive's prefix of the model's trained parameters (the optimizer's moments have their own)."""
FROZEN = "frozen/"
"""The archive's prefix of the parameters a fine-tune does not train (``freeze``, ``lora``)."""

class ExportError(Exception):
    """The checkpoint cannot be exported as asked; the message says why."""


def transpose(data: bytes, shape: tuple[int, ...], itemsize: int) -> bytes:
    """A 2-D tensor's bytes, transposed (any dtype: only the item size matters). Without
    numpy (the operator image has none): each column is one strided slice, copied in C."""
    rows, cols = shape
    code: Literal["B", "H", "I", "Q"] = {1: "B", 2: "H", 4: "I", 8: "Q"}[itemsize]  # type: ignore[assignment]  # a dict of literals
    flat = memoryview(data).cast(code)
    if len(flat) != rows * cols:
        raise ExportError(f"{len(data)} bytes are not a {rows} x {cols} matrix of {itemsize}-byte items")
    return b"".join(flat[j::cols].tobytes() for j in range(cols))


def shape_of(shapes: dict[str, tuple[int, ...]], n_head: int) -> dict[str, int]:
    """The model's dimensions, read off its parameters' shapes (the heads are not: a
    width splits into heads any way that divides it)."""
    try:
        vocab, width = shapes["wte.weight"]
        positions = shapes["wpe.weight"][0]
    except (KeyError, ValueError):
        raise ExportError("the state holds no GPT embedding (wte.weight, wpe.weight): not the built-in model") from None
    layers = len({name.split(".")[1] for name in shapes if name.startswith("blocks.")})
    if n_head < 1 or width % n_head:
        raise ExportError(f"{n_head} attention heads do not divide the width {width}")
    return {"n_layer": layers, "n_head": n_head, "n_embd": width, "vocab_size": vocab, "block_size": positions}


@dataclass(frozen=True)
class Exported:
    step: int
    tier: str
    files: list[Path]
    tensors: int
    nbytes: int


def pick(found: list[Found], step: int | None) -> tuple[Found, Committed]:
    """The tier copy to export: ``step`` (default: the newest any tier holds with the
    model's state), from the first tier, in the order given, that holds it."""
    held = [(committed.step, -i, tier, committed) for i, tier in enumerate(found) for committed in tier.tier.list()]
    wanted = [h for h in held if step is None or h[0] == step]
    deepspeed = [h for h in wanted if h[3].manifest.get("strategy") != "ddp"]
    usable = [h for h in wanted if h not in deepspeed and STATE in (h[3].manifest.get("files") or {})]
    if not usable:
        if deepspeed:
            raise ExportError(f"step {max(deepspeed, key=lambda h: h[0])[0]} was saved by "
                              f"{deepspeed[0][3].manifest.get('strategy')!r}: export reads DDP checkpoints (gather "
                              "DeepSpeed's ZeRO shards with its zero_to_fp32.py first)")
        what = f"step {step}" if step is not None else "any step"
        have = ", ".join(str(s) for s in sorted({h[0] for h in held}, reverse=True)) or "none"
        raise ExportError(f"no tier holds {what} with the model's state (committed steps: {have})")
    _, _, tier, committed = max(usable, key=lambda h: (h[0], h[1]))
    return tier, committed


def export(tier: Found, committed: Committed, fmt: str, out: Path, n_head: int | None = None,
           progress: Callable[[int], None] = lambda n: None) -> Exported:
    """Write ``committed``'s weights into the folder ``out`` in ``fmt`` (see the module)."""
    if fmt not in FORMATS:
        raise ExportError(f"format {fmt!r}: use one of {', '.join(FORMATS)}")
    man = committed.manifest
    model = dict(man.get("model") or {})
    if fmt == "hf-gpt2":
        if n_head is not None:
            model["n_head"] = n_head
        if "n_head" not in model:
            raise ExportError(f"step {committed.step}'s manifest does not record the model's shape (a checkpoint from before "
                              "the shape was recorded): give --n-head")
        if not isinstance(model["n_head"], int) or isinstance(model["n_head"], bool):
            raise ExportError(f"step {committed.step}'s manifest records n_head {model['n_head']!r}, not a count: give --n-head")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".llmtrain-export-", dir=out) as scratch:
        # Fetched and verified piece by piece, as a restore reads it: a tampered or
        # truncated copy fails here, naming the piece, and nothing is written.
        tier.tier.fetch(committed, [STATE], Path(scratch), mf.ENGINE_FILES["ddp"])
        path = Path(scratch) / STATE
        try:
            with open(path, "rb") as f:
                head = f.read(16)
                header = archive.decode_header(head + f.read(archive.header_block_size(head) - 16), path.stat().st_size)
        except archive.ArchiveError as err:
            raise ExportError(f"step {committed.step}: {STATE}: {err}") from None
        params = [e for e in header.tensors if e.name.startswith((PARAM, FROZEN))]
        odd = [e.name for e in params if e.dtype not in st.DTYPES]
        if odd:
            raise ExportError(f"step {committed.step}: {odd[0]} has dtype {next(e.dtype for e in params if e.name == odd[0])!r}, "
                              "which safetensors cannot hold")
        if not params:
            raise ExportError(f"step {committed.step}: its state holds no model parameters")
        by_name = {e.name.split("/", 1)[1]: e for e in params}
        # hf-gpt2 has no adapters: each is folded into the weight it adapts. Our own
        # names keep them apart (a LoRA job's initFrom reads them back as they are).
        scale = 1.0
        folded = lora.adapted(list(by_name)) if fmt == "hf-gpt2" and header.meta.get("lora") is not None else {}
        if folded:
            try:
                scale = lora.scale_of(header.meta["lora"])
            except ValueError as err:
                raise ExportError(f"step {committed.step}: {err}") from None
        params = [e for n, e in by_name.items() if not any(n in pair for pair in folded.values())]
        if fmt == "hf-gpt2":
            model = shape_of({e.name.split("/", 1)[1]: e.shape for e in params}, int(model["n_head"]))

        def reader(entry: archive.TensorEntry, shape: tuple[int, ...], flip: bool) -> Callable[[], bytes]:
            def read() -> bytes:
                with open(path, "rb") as f:
                    f.seek(header.payload_offset + entry.offset)
                    data = f.read(entry.nbytes)
                progress(len(data))
                return transpose(data, shape, st.ITEMSIZE[st.DTYPES[entry.dtype]]) if flip else data
            return read

        def merged(entry: archive.TensorEntry, adapters: tuple[str, str], flip: bool) -> Callable[[], bytes]:
            a, b = by_name[adapters[0]], by_name[adapters[1]]
            rank = a.shape[0] if len(a.shape) == 2 else 0
            if len(entry.shape) != 2 or a.shape != (rank, entry.shape[1]) or b.shape != (entry.shape[0], rank) \
                    or {a.dtype, b.dtype} != {entry.dtype}:
                raise ExportError(f"step {committed.step}: the adapters {adapters[0]} {list(a.shape)} and {adapters[1]} "
                                  f"{list(b.shape)} do not fit {entry.name.split('/', 1)[1]} {list(entry.shape)}")

            def read() -> bytes:
                parts = [reader(e, e.shape, False)() for e in (entry, a, b)]
                try:
                    data = lora.merge(parts[0], parts[1], parts[2], (entry.shape[0], entry.shape[1]), rank, entry.dtype, scale)
                except lora.MergeRefused as err:
                    raise ExportError(str(err)) from None
                return transpose(data, entry.shape, st.ITEMSIZE[st.DTYPES[entry.dtype]]) if flip else data
            return read

        tensors = []
        for entry in params:
            name = entry.name.split("/", 1)[1]
            try:
                target, flip = gpt2_name(name) if fmt == "hf-gpt2" else (name, False)
            except NotGPT2 as err:
                raise ExportError(str(err)) from None
            if flip and len(entry.shape) != 2:
                raise ExportError(f"step {committed.step}: {name} has shape {list(entry.shape)}, not a linear layer's weight")
            shape = entry.shape[::-1] if flip else entry.shape
            read = merged(entry, folded[name], flip) if name in folded else reader(entry, entry.shape, flip)
            tensors.append(st.Tensor(target, entry.dtype, tuple(shape), entry.nbytes, read))
        meta = {"format": "pt", "llmtrain_step": str(committed.step), "llmtrain_job": str(man.get("job", "")),
                "llmtrain_names": "gpt2" if fmt == "hf-gpt2" else "llmtrain"}
        weights = out / "model.safetensors"
        st.write(weights, tensors, meta)
    files = [weights]
    if fmt == "hf-gpt2":
        config = out / "config.json"
        config.write_text(json.dumps(gpt2_config(model, params[0].dtype), indent=2) + "\n")
        files.append(config)
    return Exported(committed.step, tier.label, files, len(tensors), sum(t.nbytes for t in tensors))
