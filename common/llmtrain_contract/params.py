"""The built-in model's parameters by name and size, and what a fine-tune trains of them.

Freezing (``freeze``) and adapters (``lora``) change what a step costs, not only what a
checkpoint stores: a frozen parameter has no gradient, no optimizer state and no weight
gradient to compute, and the backward pass stops where nothing before it trains. The
memory plan (``memplan``) and MFU (``flops``) read that here, from the config alone (the
operator has no torch).

"Before" is forward order, which is the order of :func:`config.parameter_names` (the
embeddings, then each block's LayerNorm, attention, adapters and MLP, then the final
LayerNorm; the output head is tied to ``wte.weight`` and comes last in the forward pass).
Autograd computes an input's gradient only where some parameter before it trains, and
saves a layer's activations only for a gradient it will compute.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .config import ADAPTER_SUFFIXES, LoraConfig, ModelShape, TrainSpec, parameter_names

MATMUL_LAYERS = ("attn.qkv", "attn.proj", "mlp.0", "mlp.2")
"""A block's layers that multiply each token by a weight matrix."""
BLOCK_OPS: tuple[tuple[str, int], ...] = (
    ("ln1", 1), ("attn.qkv", 1), ("attention", 3), ("attn.proj", 1), ("ln2", 1), ("mlp.0", 1), ("gelu", 4), ("mlp.2", 4),
)
"""A block's operations in forward order, with what each saves for the backward pass per
token, in units of the block's width (16 in all; the GPU fit ``memplan.ACT_BYTES["bf16"]``
is 16 x 2 bytes). A LayerNorm, attention (q, k, v) and the GELU save their input when the
gradient reaches it (a LayerNorm also for its own weights); a linear layer saves its
input only for its weight's gradient, or an adapter's (which reads the same input); an
adapted layer also keeps the adapters' rank-wide middle (``lora_b``'s input). The output
projection's input is the attention's output, one tensor: kept when the attention is
differentiated (it keeps its output) or the projection's weight trains."""
BLOCK_UNITS = sum(units for _, units in BLOCK_OPS)


def _layer_dims(shape: ModelShape, layer: str) -> tuple[int, int]:
    """(out, in) of a block's linear layer."""
    h = shape.n_embd
    return {"attn.qkv": (3 * h, h), "attn.proj": (h, h), "mlp.0": (4 * h, h), "mlp.2": (h, 4 * h)}[layer]


def sizes(shape: ModelShape, lora: LoraConfig | None = None) -> dict[str, int]:
    """Every parameter's element count, in forward order; ``wte.weight`` counts once (the
    head shares it). Without adapters the sum is ``shape.approx_params()``."""
    h, rank = shape.n_embd, lora.rank if lora else 0
    out: dict[str, int] = {}
    for name in parameter_names(shape, lora.targets if lora else ()):
        if name == "wte.weight":
            out[name] = shape.vocab_size * h
        elif name == "wpe.weight":
            out[name] = shape.block_size * h
        elif name.startswith("blocks."):
            layer, kind = name.split(".", 2)[2].rsplit(".", 1)
            if layer in MATMUL_LAYERS:
                rows, cols = _layer_dims(shape, layer)
                out[name] = {"weight": rows * cols, "bias": rows, "lora_a": rank * cols, "lora_b": rows * rank}[kind]
            else:  # ln1, ln2
                out[name] = h
        else:  # ln_f
            out[name] = h
    return out


def is_matmul(name: str) -> bool:
    """A weight that multiplies every token: a block's linear weight, an adapter, or the
    token embedding through the tied head."""
    if name == "wte.weight":
        return True
    if not name.startswith("blocks."):
        return False
    layer = name.split(".", 2)[2]
    return layer.endswith(ADAPTER_SUFFIXES) or any(layer == f"{m}.weight" for m in MATMUL_LAYERS)


@dataclass(frozen=True)
class Training:
    """What a step trains of the built-in model (:func:`of`)."""

    shape: ModelShape
    sizes: dict[str, int]
    """Every parameter's element count, in forward order."""
    frozen: frozenset[str]

    @cached_property
    def total(self) -> int:
        return sum(self.sizes.values())

    @cached_property
    def trained(self) -> int:
        """Elements with a gradient and optimizer state."""
        return sum(n for name, n in self.sizes.items() if name not in self.frozen)

    @cached_property
    def _input_grad(self) -> dict[str, bool]:
        out: dict[str, bool] = {}
        seen = False
        for name in self.sizes:
            out[name] = seen
            seen = seen or name not in self.frozen
        out["wte.weight"] = seen
        for name in out:
            if name.endswith(ADAPTER_SUFFIXES[0]):  # lora_a reads its layer's input
                out[name] = out[name[: -len(ADAPTER_SUFFIXES[0])] + ".weight"]
        return out

    def needs_input_grad(self) -> dict[str, bool]:
        """Per parameter: whether a parameter before its layer trains, so that the
        gradient of its layer's input is computed (``lora_b``'s input is ``lora_a``'s
        output, which always trains). For ``wte.weight`` this is the head's input (the
        head comes last: anything that trains at all)."""
        return dict(self._input_grad)

    @cached_property
    def _trained_layers(self) -> frozenset[str]:
        """Every layer with a parameter that trains: a name less its last part
        (``blocks.3.attn.qkv`` for its weight, bias and adapters)."""
        return frozenset(name.rsplit(".", 1)[0] for name in self.sizes if name not in self.frozen)

    @cached_property
    def _blocks(self) -> list[tuple[float, bool]]:
        """Per block, in order: the share of a fully trained block's saved activations it
        keeps (``BLOCK_OPS``), and whether its attention is differentiated."""
        grad = self._input_grad
        out = []
        for i in range(self.shape.n_layer):
            block = f"blocks.{i}."
            seen = grad[block + "ln1.weight"]  # a parameter before the block trains
            units, attention = 0.0, False
            for op, size in BLOCK_OPS:
                own = block + op in self._trained_layers
                if op in MATMUL_LAYERS:
                    layer = block + op
                    saves = any(layer + s in self.sizes and layer + s not in self.frozen for s in (".weight", *ADAPTER_SUFFIXES))
                    saves = saves or (op == "attn.proj" and attention)  # the attention's own output
                    if layer + ADAPTER_SUFFIXES[0] in self.sizes:  # lora_a's output, lora_b's input: rank wide
                        units += self.sizes[layer + ADAPTER_SUFFIXES[0]] / _layer_dims(self.shape, op)[1] / self.shape.n_embd
                else:
                    saves = seen or own
                    attention = attention or (op == "attention" and seen)
                units += size if saves else 0
                seen = seen or own
            out.append((units / BLOCK_UNITS, attention))
        return out

    def backward_blocks(self) -> int:
        """Blocks the backward pass goes into (some of their activations are saved); a
        frozen block before every trained parameter keeps none."""
        return sum(1 for share, _ in self._blocks if share)

    def saved_blocks(self) -> float:
        """Blocks' worth of saved activations (a block with every weight trained is 1)."""
        return sum(share for share, _ in self._blocks)

    def attention_backward_blocks(self) -> int:
        """Blocks whose attention (scores and weighted sum) is differentiated: a parameter
        before it (its block's qkv projection or adapters included) trains."""
        return sum(1 for _, attention in self._blocks if attention)

    def saved_weight_copies(self) -> int:
        """Elements of the matrices a backward pass needs: a trained one (for its own
        gradient) or one whose input's gradient is computed. Under autocast their bf16
        copies live until the backward pass; the others are freed after use."""
        return self._weight_copies

    @cached_property
    def _weight_copies(self) -> int:
        grad = self._input_grad
        return sum(n for name, n in self.sizes.items() if is_matmul(name) and (grad[name] or name not in self.frozen))


def of(shape: ModelShape, frozen: frozenset[str] = frozenset(), lora: LoraConfig | None = None) -> Training:
    return Training(shape, sizes(shape, lora), frozenset(frozen))


def of_spec(spec: TrainSpec) -> Training:
    """The training of a spec's model at its sequence length (raises ``FreezeError`` as
    ``frozen_parameters`` does)."""
    return of(spec.model.shape(spec.data.seq_len), frozenset(spec.frozen_parameters()), spec.lora)
