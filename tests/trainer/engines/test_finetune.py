"""Fine-tuning in the DDP engine (``freeze``, ``lora``), in one process on the CPU: frozen
weights stay bit for bit, LoRA starts from the base model exactly, the arena puts the
frozen parameters first and contiguously (and a plain run's layout is what it always
was), a checkpoint restores a fine-tune exactly, and ``initFrom`` of base weights leaves
the adapters their seeded start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from llmtrain_contract.config import MODEL_PRESETS, FreezeError, TrainerConfig, parameter_names
from llmtrain_store import manifest as mf
from llmtrain_store import safetensors as st
from llmtrain_store.archive import aligned, layout
from llmtrain_trainer.engines.data import DataError, build_source, micro_batch_indices
from llmtrain_trainer.engines.ddp import DDP_STATE_FILE, DDPEngine
from llmtrain_trainer.engines.init_weights import load_into
from llmtrain_trainer.engines.model import GPT, add_lora, apply_freeze, build_model, make_model
from llmtrain_trainer.world import DistInfo

INFO = DistInfo(rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0, restart_count=0, backend="gloo")
MOST = ["wte.weight", "wpe.weight", "blocks.[0-2].*", "blocks.3.mlp.*"]
"""About 90% of the tiny model's weights: the embeddings, three of four blocks and the
last one's MLP."""


def _cfg(**extra: Any) -> TrainerConfig:
    return TrainerConfig(model={"preset": "tiny"}, data={"seqLen": 32, "vocabSize": 256}, global_batch_size=4,
                         micro_batch_size=4, optimizer={"lr": 0.003, "warmupSteps": 1}, **extra)


def _train(engine: DDPEngine, cfg: TrainerConfig, steps: range) -> list[float]:
    source = build_source(cfg.data, cfg.seed, cfg.model.shape(cfg.data.seq_len).vocab_size)
    return [float(engine.train_step(step, [source.batch(micro_batch_indices(step, 0, 0, 1, 4, 4))])) for step in steps]


def _weights(engine: DDPEngine) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in engine.module.named_parameters()}


def _load(engine: DDPEngine, folder: Path, records: dict[str, Any]) -> None:
    files = mf.entries({"format": mf.FORMAT_VERSION, "files": records}, DDPEngine.allowed_names())
    engine.load(folder, files)


@pytest.mark.parametrize("preset", list(MODEL_PRESETS))
@pytest.mark.parametrize("targets", [(), ("qkv",), ("qkv", "proj")])
def test_the_contract_names_the_models_parameters_in_its_order(preset, targets):
    shape = MODEL_PRESETS[preset]
    with torch.device("meta"):  # the names and order only: no memory, no init
        model = GPT(shape)
        if targets:
            add_lora(model, _cfg(lora={"targets": list(targets)}).lora, seed=0)  # type: ignore[arg-type]
    assert [n for n, _ in model.named_parameters()] == parameter_names(shape, targets)


def test_the_model_refuses_a_pattern_its_own_names_do_not_match():
    model = build_model(MODEL_PRESETS["tiny"], 0.0, False, seed=1)
    cfg = TrainerConfig.model_construct(freeze=["blocks.7.*"])  # past the config's own check: the model checks again
    with pytest.raises(FreezeError, match="'blocks.7.\\*' matches no parameter"):
        apply_freeze(model, cfg)


def test_frozen_weights_stay_bit_for_bit_and_the_rest_trains():
    cfg = _cfg(freeze=MOST)
    engine = DDPEngine(cfg, INFO)
    frozen = {n for n, _ in engine.frozen_named}
    assert frozen == set(cfg.frozen_parameters())
    total = sum(p.numel() for _, p in engine.frozen_named) + sum(p.numel() for _, p in engine.named)
    assert sum(p.numel() for _, p in engine.frozen_named) / total > 0.85
    before = _weights(engine)
    losses = _train(engine, cfg, range(8))
    after = _weights(engine)
    assert all(after[n].equal(before[n]) for n in frozen)
    assert all(not after[n].equal(before[n]) for n, _ in engine.named if n.endswith(".weight"))
    assert all(p.grad is None for p in engine.module.parameters())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0], losses


def test_lora_starts_from_the_base_model_exactly_and_trains_only_its_adapters():
    base_cfg, lora_cfg = _cfg(), _cfg(lora={"rank": 4, "alpha": 8})
    base, engine = DDPEngine(base_cfg, INFO), DDPEngine(lora_cfg, INFO)
    assert sorted(n for n, _ in engine.named) == sorted(n for n in parameter_names(MODEL_PRESETS["tiny"], ("qkv", "proj"))
                                                        if n.endswith((".lora_a", ".lora_b")))
    start = _weights(engine)
    assert all(start[n].equal(w) for n, w in _weights(base).items()), "the adapters change no base weight"
    # A step returns the loss before its update: step 0's is the base model's, bit for bit.
    assert _train(engine, lora_cfg, range(1)) == _train(base, base_cfg, range(1))
    losses = _train(engine, lora_cfg, range(1, 8))
    after = _weights(engine)
    assert all(after[n].equal(start[n]) for n, _ in engine.frozen_named)
    assert all(not after[n].equal(start[n]) for n, _ in engine.named)  # both A and B move
    assert all(torch.isfinite(torch.tensor(losses)))


def test_the_adapters_start_the_same_in_every_build():
    one, two = DDPEngine(_cfg(lora={}), INFO), DDPEngine(_cfg(lora={}), INFO)
    assert all(w.equal(_weights(two)[n]) for n, w in _weights(one).items())
    assert not _weights(DDPEngine(_cfg(lora={}, seed=7), INFO))["blocks.0.attn.qkv.lora_a"].equal(
        _weights(one)["blocks.0.attn.qkv.lora_a"])


def _expected_plain_layout(cfg: TrainerConfig) -> list[Any]:
    """The arena as the engine laid it out before fine-tuning existed: every parameter
    (a tied weight once), then each optimizer moment of each, in the model's order."""
    model = build_model(cfg.model.shape(cfg.data.seq_len), 0.0, False, cfg.seed)
    named = list(model.named_parameters())  # torch lists a tied weight once
    specs = [(f"param/{n}", "float32", tuple(p.shape), p.numel() * 4) for n, p in named]
    specs += [(f"{s}/{n}", "float32", tuple(p.shape), p.numel() * 4) for s in ("exp_avg", "exp_avg_sq") for n, p in named]
    return [(e.name, e.dtype, list(e.shape), e.offset, e.nbytes) for e in layout(specs)]


def test_without_frozen_parameters_the_arena_is_laid_out_as_it_always_was():
    cfg = _cfg()
    engine = DDPEngine(cfg, INFO)
    assert engine.live.layout_signature() == _expected_plain_layout(cfg)
    assert not any(e.name.startswith("frozen/") for e in engine.live.entries)


@pytest.mark.parametrize("extra", [{"freeze": MOST}, {"lora": {}}, {"lora": {}, "freeze": ["wte.weight", "blocks.*.attn.*"]}],
                         ids=["freeze", "lora", "lora-and-freeze"])
def test_frozen_parameters_come_first_in_one_contiguous_run(extra):
    cfg = _cfg(**extra)
    engine = DDPEngine(cfg, INFO)
    entries = engine.live.entries
    count = len(cfg.frozen_parameters())
    assert [e.name for e in entries[:count]] == [f"frozen/{n}" for n in cfg.frozen_parameters()]
    assert not any(e.name.startswith("frozen/") for e in entries[count:])
    end = 0
    for e in entries[:count]:
        assert e.offset == end, "no gap between frozen entries"
        end = e.offset + aligned(e.nbytes)
    assert entries[count].offset == end
    # The trainable state after them keeps its order: parameters, then each moment.
    names = [n for n, _ in engine.named]
    assert [e.name for e in entries[count:]] == [f"{s}/{n}" for s in ("param", "exp_avg", "exp_avg_sq") for n in names]


def test_a_step_into_the_spare_arena_carries_the_frozen_weights_and_a_checkpoint_from_it_holds_them(tmp_path):
    cfg = _cfg(freeze=MOST)
    engine = DDPEngine(cfg, INFO)
    frozen = {f"frozen/{n}": p.detach().clone() for n, p in engine.frozen_named}
    _train(engine, cfg, range(2))
    for round_ in range(3):  # into the spare, then back into the first arena, then the spare again
        snap = engine.snapshot()
        assert snap is not None
        _train(engine, cfg, range(2 + round_, 3 + round_))
        assert engine.live is not snap.arena, "the step went into the spare arena"
        assert all(engine.live.views[n].equal(w) and snap.arena.views[n].equal(w) for n, w in frozen.items())
        snap.release()
    # A checkpoint written from the arena the last steps went into restores every weight.
    snap = engine.snapshot()
    assert snap is not None
    records = snap.write(tmp_path)
    snap.release()
    again = DDPEngine(cfg, INFO)
    _load(again, tmp_path, records)
    assert all(w.equal(_weights(engine)[n]) for n, w in _weights(again).items())


def test_a_restore_brings_the_checkpoints_frozen_weights_into_both_arenas(tmp_path):
    """The checkpoint's frozen weights win over the build's (another seed here, as another
    ``initFrom`` file would): in the live arena, and in the spare one the next step goes into."""
    cfg = _cfg(freeze=MOST)
    first = DDPEngine(cfg, INFO)
    _train(first, cfg, range(3))
    snap = first.snapshot()
    assert snap is not None
    records = snap.write(tmp_path)
    snap.release()
    other = DDPEngine(_cfg(freeze=MOST, seed=99), INFO)
    held = other.snapshot()
    assert held is not None
    _train(other, cfg, range(1))  # into the spare arena: now both hold the old build's frozen weights
    held.release()
    _load(other, tmp_path, records)
    held = other.snapshot()
    assert held is not None
    _train(other, cfg, range(3, 4))
    assert other.live is not held.arena
    assert all(other.live.views[f"frozen/{n}"].equal(p) for n, p in first.frozen_named)
    held.release()


@pytest.mark.parametrize("extra", [{"freeze": MOST}, {"lora": {"rank": 4}}], ids=["freeze", "lora"])
def test_a_run_resumed_from_its_checkpoint_reproduces_the_uninterrupted_losses(tmp_path, extra):
    cfg = _cfg(**extra)
    reference = DDPEngine(cfg, INFO)
    uninterrupted = _train(reference, cfg, range(6))
    crashed = DDPEngine(cfg, INFO)
    before = _train(crashed, cfg, range(3))
    snap = crashed.snapshot()
    assert snap is not None
    records = snap.write(tmp_path)
    _train(crashed, cfg, range(3, 5))  # progress past the checkpoint, lost with the process
    snap.release()
    resumed = DDPEngine(cfg, INFO)
    _load(resumed, tmp_path, records)
    assert resumed.updates() == 3
    assert before + _train(resumed, cfg, range(3, 6)) == uninterrupted


def test_a_checkpoint_of_a_fine_tune_does_not_load_into_a_plain_run(tmp_path):
    lora = DDPEngine(_cfg(lora={}), INFO)
    snap = lora.snapshot()
    assert snap is not None
    records = snap.write(tmp_path)
    snap.release()
    assert snap.meta["lora"] == {"rank": 8, "alpha": 16.0, "targets": ["qkv", "proj"]}  # for an export's merge
    with pytest.raises(Exception, match="do not match this model's"):
        _load(DDPEngine(_cfg(), INFO), tmp_path, records)
    assert (tmp_path / DDP_STATE_FILE).exists()


def _save(path: Path, weights: dict[str, torch.Tensor]) -> Path:
    tensors = [st.Tensor(n, "float32", tuple(t.shape), t.numel() * 4, lambda t=t: t.contiguous().numpy().tobytes())
               for n, t in weights.items()]
    st.write(path, tensors)
    return path


def test_init_from_base_weights_starts_the_adapters_from_the_seed_and_a_file_with_adapters_needs_them(tmp_path):
    donor = build_model(MODEL_PRESETS["tiny"].model_copy(update={"block_size": 32}), 0.0, False, seed=5)
    plain = _save(tmp_path / "base.safetensors", {n: p.detach() for n, p in donor.named_parameters()})
    model = make_model(_cfg(lora={"rank": 4}, init_from=str(plain)))
    seeded = dict(make_model(_cfg(lora={"rank": 4})).named_parameters())
    for name, param in model.named_parameters():
        source = seeded if name.endswith((".lora_a", ".lora_b")) else dict(donor.named_parameters())
        assert param.detach().equal(source[name].detach()), name
        assert param.requires_grad == name.endswith((".lora_a", ".lora_b")), name

    with torch.no_grad():
        model.blocks[0].attn.qkv.lora_b.fill_(0.5)
    adapted = _save(tmp_path / "adapted.safetensors", {n: p.detach() for n, p in model.named_parameters()})
    again = make_model(_cfg(lora={"rank": 4}, init_from=str(adapted)))
    assert again.blocks[0].attn.qkv.lora_b.detach().eq(0.5).all(), "adapters in the file are loaded"
    with pytest.raises(DataError, match="'blocks.0.attn.qkv.lora_a' is a LoRA adapter, which this model does not have"):
        load_into(build_model(MODEL_PRESETS["tiny"].model_copy(update={"block_size": 32}), 0.0, False, seed=5), adapted)
