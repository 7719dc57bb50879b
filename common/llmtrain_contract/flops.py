"""Model FLOPs utilisation (MFU): the useful arithmetic a run does over what its GPUs
could do at their dense peak.

FLOPs per token follow PaLM's accounting (Chowdhery et al. 2022, appendix B): a forward
and backward pass costs ``6 N`` for the ``N`` parameters of the matrix products (the
token embedding counts once, through the tied output projection; position embeddings
and LayerNorms do no matrix products) plus ``12 L s h`` for attention's scores and
weighted sum over a context of ``s``. Activation checkpointing's recomputation is not
useful work and is not counted (that is the difference between MFU and HFU).

A fine-tune (``freeze``, ``lora``) does less: ``2 N`` forward for every matrix, adapters
included, but a frozen matrix has no weight gradient (``2 N`` fewer), and no input
gradient is computed below the first parameter that trains (``params.Training``). Counting
it as ``6 N`` would report an MFU a full run could not reach.

Peak FLOP/s are the vendors' dense (not 2:4 sparse) bf16 tensor-core figures. A GPU
product not in the table has no MFU: the trainer exports none rather than a guess.
"""

from __future__ import annotations

from .config import ModelShape
from .params import Training, is_matmul

PEAK_BF16_FLOPS: dict[str, float] = {
    # NVIDIA's data sheets, dense bf16 (half the "with sparsity" figure).
    "NVIDIA H100 80GB HBM3": 989e12,  # SXM5
    "NVIDIA H100 PCIe": 756e12,
    "NVIDIA H100 NVL": 835e12,
    "NVIDIA H200": 989e12,
    "NVIDIA GH200 480GB": 989e12,
    "NVIDIA B200": 2250e12,
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA A100-SXM4-40GB": 312e12,
    "NVIDIA A100 80GB PCIe": 312e12,
    "NVIDIA A100-PCIE-40GB": 312e12,
    "NVIDIA L40S": 362e12,
    "NVIDIA L4": 121e12,
    "NVIDIA A10G": 70e12,
}
"""Dense bf16 peak per GPU, keyed by the name CUDA reports (``torch.cuda.get_device_name``,
also the GPU operator's ``nvidia.com/gpu.product`` label with spaces as dashes)."""


def matmul_params(shape: ModelShape) -> int:
    """Parameters that take part in a matrix product per token: every block's attention
    and MLP weights, and the (tied) vocabulary projection."""
    h = shape.n_embd
    return shape.n_layer * 12 * h * h + shape.vocab_size * h


def flops_per_token(shape: ModelShape, seq_len: int, training: Training | None = None) -> float:
    """Training FLOPs (forward and backward) per token at context ``seq_len``; with
    ``training`` (a fine-tune), only the gradients its step computes."""
    attention = 4.0 * seq_len * shape.n_embd  # per block: scores and weighted sum, forward
    if training is None:
        return 6.0 * matmul_params(shape) + 3 * attention * shape.n_layer
    grad = training.needs_input_grad()
    matrices = {name: n for name, n in training.sizes.items() if is_matmul(name)}
    forward = 2.0 * sum(matrices.values()) + attention * shape.n_layer
    weight_grads = 2.0 * sum(n for name, n in matrices.items() if name not in training.frozen)
    input_grads = 2.0 * sum(n for name, n in matrices.items() if grad[name])
    return forward + weight_grads + input_grads + 2 * attention * training.attention_backward_blocks()


def peak_flops(product: str) -> float | None:
    """The table's figure for a product name, in either spelling (spaces or dashes)."""
    if product in PEAK_BF16_FLOPS:
        return PEAK_BF16_FLOPS[product]
    spaced = product.replace("-", " ")
    for name, value in PEAK_BF16_FLOPS.items():
        if name.replace("-", " ") == spaced:
            return value
    return None


def mfu(tokens_per_second: float, shape: ModelShape, seq_len: int, gpus: int, product: str,
        training: Training | None = None) -> float | None:
    """Tokens per second of the whole job over what ``gpus`` of ``product`` could do."""
    peak = peak_flops(product)
    if peak is None or gpus <= 0:
        return None
    return tokens_per_second * flops_per_token(shape, seq_len, training) / (peak * gpus)
