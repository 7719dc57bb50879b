"""MFU arithmetic (llmtrain_contract/flops.py)."""

from __future__ import annotations

import pytest
from llmtrain_contract import flops
from llmtrain_contract.config import MODEL_PRESETS


def test_flops_per_token_of_gpt2_124m_follow_palms_accounting():
    shape = MODEL_PRESETS["gpt2-124m"]
    n = 12 * 12 * 768 * 768 + 50304 * 768  # blocks' matrices and the tied vocabulary projection
    assert flops.matmul_params(shape) == n
    assert flops.flops_per_token(shape, 1024) == 6 * n + 12 * 12 * 1024 * 768
    # The attention term grows with the context, the rest does not.
    assert flops.flops_per_token(shape, 2048) - flops.flops_per_token(shape, 1024) == 12 * 12 * 1024 * 768


def test_mfu_of_a_known_product_in_either_spelling():
    shape = MODEL_PRESETS["gpt2-350m"]
    per_token = flops.flops_per_token(shape, 1024)
    tokens = 989e12 / per_token  # exactly one H200's peak
    assert flops.mfu(tokens, shape, 1024, 1, "NVIDIA H200") == pytest.approx(1.0)
    assert flops.mfu(tokens, shape, 1024, 2, "NVIDIA H200") == pytest.approx(0.5)
    assert flops.peak_flops("NVIDIA-H100-80GB-HBM3") == flops.PEAK_BF16_FLOPS["NVIDIA H100 80GB HBM3"]


def test_an_unknown_product_or_no_gpu_has_no_mfu():
    shape = MODEL_PRESETS["tiny"]
    assert flops.mfu(1000.0, shape, 64, 1, "Some Future GPU") is None
    assert flops.mfu(1000.0, shape, 64, 0, "NVIDIA H200") is None
