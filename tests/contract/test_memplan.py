"""The memory plan (llmtrain_contract/memplan.py) against the allocator's peaks measured on
an H200 (bench/gpu.py; docs/benchmarks.md "The trainer on a GPU"), and its arithmetic."""

from __future__ import annotations

from dataclasses import replace

import pytest
from llmtrain_contract import memplan
from llmtrain_contract.config import MODEL_PRESETS, TrainerConfig

GIB = 1 << 30

# (preset, micro-batch, engine, measured peak GiB, measured static GiB) at seq 1024, one
# rank, torch 2.11 + DeepSpeed 0.19.8 on one NVIDIA H200 (docs/data/gpu-h200-run2.json).
MEASURED = [
    ("gpt2-124m", 2, "ddp", 3.44, 1.39), ("gpt2-124m", 2, "zero1", 3.35, 1.62), ("gpt2-124m", 2, "zero2", 3.35, 1.62),
    ("gpt2-124m", 2, "zero3", 4.51, 2.79), ("gpt2-124m", 8, "ddp", 8.86, 1.39), ("gpt2-124m", 8, "zero1", 8.51, 1.62),
    ("gpt2-124m", 8, "zero2", 8.51, 1.62), ("gpt2-124m", 8, "zero3", 9.67, 2.79), ("gpt2-350m", 2, "ddp", 7.01, 3.97),
    ("gpt2-350m", 2, "zero1", 7.29, 4.63), ("gpt2-350m", 2, "zero2", 7.29, 4.63), ("gpt2-350m", 2, "zero3", 8.88, 6.22),
    ("gpt2-350m", 8, "ddp", 16.15, 3.97), ("gpt2-350m", 8, "zero1", 15.28, 4.63), ("gpt2-350m", 8, "zero2", 15.28, 4.63),
    ("gpt2-350m", 8, "zero3", 16.87, 6.22), ("gpt-1.3b", 1, "ddp", 19.97, 14.68),
]


def job(preset: str, micro: int, engine: str, world: int = 1, **changes: object) -> memplan.Job:
    shape = MODEL_PRESETS[preset].model_copy(update={"block_size": 1024})
    if engine == "ddp":
        base = memplan.Job(shape, 1024, micro, world)
    else:
        base = memplan.Job(shape, 1024, micro, world, "deepspeed", int(engine[-1]), "bf16")
    return replace(base, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(("preset", "micro", "engine", "peak", "static"), MEASURED,
                         ids=[f"{p}-mb{m}-{e}" for p, m, e, _, _ in MEASURED])
def test_the_plan_is_within_ten_percent_of_the_measured_peak(preset, micro, engine, peak, static):
    plan = memplan.plan(job(preset, micro, engine))
    assert abs(plan.peak / (peak * GIB) - 1) <= 0.10, plan.describe()
    assert abs(plan.static / (static * GIB) - 1) <= 0.02, plan.describe()


def test_zero_stages_partition_what_they_say_over_the_world():
    one = {z: memplan.plan(job("gpt2-350m", 2, f"zero{z}", world=1)) for z in (1, 2, 3)}
    eight = {z: memplan.plan(job("gpt2-350m", 2, f"zero{z}", world=8)) for z in (1, 2, 3)}
    for z in (1, 2, 3):
        assert eight[z].terms["optimizer state"] == pytest.approx(one[z].terms["optimizer state"] / 8)
        assert eight[z].terms["master weights"] == pytest.approx(one[z].terms["master weights"] / 8)
    assert eight[1].terms["weights"] == one[1].terms["weights"]  # stages 1 and 2 keep whole weights
    assert eight[3].terms["weights"] == pytest.approx(one[3].terms["weights"] / 8)
    assert eight[2].static < one[2].static
    # ZeRO-3 keeps a fixed reduce bucket (1 GB by default): only what scales with the model shrinks.
    assert eight[3].static - eight[3].terms["buckets"] < eight[2].static


def test_ddp_over_several_ranks_adds_its_gradient_buckets():
    assert memplan.plan(job("gpt2-124m", 2, "ddp", world=1)).terms["DDP buckets"] == 0
    assert memplan.plan(job("gpt2-124m", 2, "ddp", world=2)).terms["DDP buckets"] == 4 * MODEL_PRESETS["gpt2-124m"].approx_params()


def test_activation_checkpointing_and_a_smaller_micro_batch_lower_the_peak():
    base = memplan.plan(job("gpt-1.3b", 8, "ddp"))
    assert memplan.plan(job("gpt-1.3b", 8, "ddp", activation_checkpointing=True)).peak < base.peak
    assert memplan.plan(job("gpt-1.3b", 4, "ddp")).peak < base.peak
    half = memplan.plan(job("gpt-1.3b", 4, "ddp"))
    assert base.step["activations"] == pytest.approx(2 * half.step["activations"])


def test_a_suggestion_fits_and_none_is_made_when_nothing_does():
    big = job("gpt-1.3b", 16, "ddp")
    room = 40 * GIB
    assert not memplan.fits(big, room)
    hint = memplan.suggestion(big, room)
    assert hint == "model.activationCheckpointing: true"
    assert memplan.fits(job("gpt-1.3b", 16, "ddp", activation_checkpointing=True), room)
    assert memplan.suggestion(big, 2 * GIB) is None


def test_from_config_reads_the_precision_the_trainer_will_use():
    ddp = TrainerConfig.model_validate({"model": {"preset": "gpt2-124m"}, "data": {"seqLen": 512}, "microBatchSize": 4,
                                        "globalBatchSize": 32})
    ds = TrainerConfig.model_validate({"model": {"preset": "gpt2-124m"}, "data": {"seqLen": 512}, "microBatchSize": 4,
                                       "globalBatchSize": 32, "strategy": {"kind": "deepspeed", "zeroStage": 2}})
    fp32 = TrainerConfig.model_validate({"model": {"preset": "gpt2-124m", "dtype": "float32"}, "globalBatchSize": 8})
    assert memplan.from_config(ddp, 8).precision == "mixed"
    assert (memplan.from_config(ds, 8).precision, memplan.from_config(ds, 8).zero_stage) == ("bf16", 2)
    assert memplan.from_config(fp32, 1).precision == "fp32"
    assert memplan.from_config(ddp, 8, gpu=False).precision == "fp32"
    assert memplan.from_config(ddp, 8).seq_len == 512 and memplan.from_config(ddp, 8).micro_batch == 4


def test_the_description_names_every_counted_term():
    text = memplan.plan(job("gpt2-124m", 8, "zero3")).describe()
    for word in ("peak", "between steps", "in a step", "weights", "optimizer state", "activations", "logits", "buckets"):
        assert word in text, text


@pytest.mark.parametrize("engine", [{"kind": "ddp"}, {"kind": "deepspeed", "zeroStage": 2}])
def test_frozen_weights_keep_their_weights_and_drop_their_gradients_and_optimizer_state(engine):
    base = {"model": {"preset": "gpt2-124m"}, "data": {"seqLen": 1024}, "microBatchSize": 8, "globalBatchSize": 64,
            "strategy": engine}
    def job(**extra):
        return memplan.from_config(TrainerConfig.model_validate({**base, **extra}), world_size=8)

    full, half = job(), job(freeze=["wte.weight", "wpe.weight", "blocks.[0-5].*"])
    assert full.training is None and half.training is not None
    trained = half.training.trained
    assert trained < 0.5 * memplan.params(full.shape)
    a, b = memplan.plan(full), memplan.plan(half)
    assert b.terms["weights"] == a.terms["weights"]
    assert b.terms["optimizer state"] == pytest.approx(a.terms["optimizer state"] * trained / memplan.params(full.shape))
    # Six of twelve blocks (and the embeddings) before every trained weight save nothing.
    assert b.step.get("activations", 0) <= a.step.get("activations", 0) / 2 + 1
    assert b.peak < a.peak
    # Position embeddings that still train put every block back on the backward path.
    assert memplan.plan(job(freeze=["wte.weight", "blocks.[0-5].*"])).step["activations"] > b.step["activations"]
