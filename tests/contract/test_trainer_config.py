"""The trainer's config model: batch arithmetic and the config hash."""

from __future__ import annotations

import pytest
from llmtrain_contract.config import TrainerConfig, TrainSpec, valid_world_sizes


@pytest.mark.parametrize(
    ("global_batch", "micro", "world", "accum"),
    [(16, 4, 1, 4), (16, 4, 2, 2), (16, 4, 4, 1), (768, 8, 24, 4), (768, 8, 32, 3)],
)
def test_grad_accumulation_keeps_the_global_batch(global_batch, micro, world, accum):
    spec = TrainSpec(global_batch_size=global_batch, micro_batch_size=micro)
    assert spec.grad_accum_steps(world) == accum
    assert accum * micro * world == global_batch


def test_a_world_size_that_cannot_keep_the_global_batch_is_a_clear_error():
    spec = TrainSpec(global_batch_size=16, micro_batch_size=4)
    with pytest.raises(ValueError, match=r"world size 3 cannot keep globalBatchSize=16.*valid world sizes are \[1, 2, 4\]"):
        spec.grad_accum_steps(3)


def test_valid_world_sizes_match_deepspeed_style_divisors():
    assert valid_world_sizes(24, 2) == [1, 2, 3, 4, 6, 12]
    assert valid_world_sizes(10, 3) == []


def test_config_hash_ignores_runtime_settings_but_not_the_model():
    a = TrainerConfig(job_name="a", run_dir="/tmp/a")
    b = TrainerConfig(job_name="b", run_dir="/tmp/b", log_interval_steps=3)
    c = TrainerConfig(model={"preset": "small"})
    longer = TrainerConfig(max_steps=1000)
    assert a.config_hash() == b.config_hash() == longer.config_hash()
    assert a.config_hash() != c.config_hash()
    assert a.config_hash() != TrainerConfig(global_batch_size=32).config_hash()


def test_config_round_trips_through_its_camel_case_wire_form():
    cfg = TrainerConfig(max_steps=7, checkpoint={"interval_steps": 3})
    again = TrainerConfig.model_validate(cfg.to_wire())
    assert again == cfg
    assert "maxSteps" in cfg.to_wire()
