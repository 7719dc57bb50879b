"""``freeze`` and ``lora`` in the train spec: hostile or mistyped patterns are refused with
a message naming them, and the config hash tells fine-tunes apart without changing a
plain run's (whose checkpoints must stay resumable)."""

from __future__ import annotations

import pytest
from llmtrain_contract.config import MODEL_PRESETS, TrainerConfig, TrainSpec, parameter_names
from pydantic import ValidationError

PLAIN_HASH = "0c812375023f9df1"
"""``TrainerConfig().config_hash()`` before ``freeze`` and ``lora`` existed: checkpoints
of plain runs carry it."""


def _error(**spec) -> str:
    with pytest.raises(ValidationError) as info:
        TrainSpec(**spec)
    return str(info.value)


@pytest.mark.parametrize("pattern", ["", "a\x00b", "blocks.0.attn.qkv.weight\n", "blocks/0", "x" * 257, "wte.weight "])
def test_a_pattern_with_a_character_no_parameter_name_has_or_too_long_is_refused(pattern):
    assert "freeze.0" in _error(freeze=[pattern])


def test_the_pattern_list_is_bounded():
    assert "at most 256 items" in _error(freeze=["wte.weight"] * 257)
    TrainSpec(freeze=["wte.weight"] * 256)


def test_a_pattern_that_matches_no_parameter_is_refused_naming_it():
    message = _error(freeze=["wte.weight", "blocks.4.*"])  # tiny has blocks 0..3
    assert "every freeze pattern must match a parameter" in message and "'blocks.4.*' matches no parameter of 'tiny'" in message
    assert "tied to wte.weight" in _error(freeze=["head.weight"])
    assert "matches no parameter" in _error(freeze=["Blocks.0.*"]), "matching is case-sensitive"


def test_freezing_every_parameter_is_refused_unless_adapters_train():
    assert "freeze must leave a parameter to train" in _error(freeze=["*"])
    assert "freeze must leave a parameter to train" in _error(freeze=["wte.*", "wpe.*", "blocks.*", "ln_f.*"])
    spec = TrainSpec(freeze=["*"], lora={})
    assert spec.frozen_parameters() == parameter_names(MODEL_PRESETS["tiny"])


def test_patterns_match_base_parameters_only_and_lora_without_patterns_freezes_the_base():
    spec = TrainSpec(lora={"targets": ["qkv"]})
    frozen = spec.frozen_parameters()
    assert frozen == parameter_names(MODEL_PRESETS["tiny"])
    assert "blocks.0.attn.qkv.lora_a" in parameter_names(MODEL_PRESETS["tiny"], ["qkv"])
    assert not any(n.endswith((".lora_a", ".lora_b")) for n in frozen)
    # With patterns, exactly what they match: here the base's LayerNorms train beside the adapters.
    partial = TrainSpec(lora={}, freeze=["wte.weight", "wpe.weight", "blocks.*.attn.*", "blocks.*.mlp.*"]).frozen_parameters()
    assert "blocks.0.ln1.weight" not in partial and "blocks.3.mlp.2.bias" in partial and "blocks.0.attn.qkv.lora_a" not in partial
    with pytest.raises(ValidationError, match="'blocks.0.attn.qkv.lora_a' matches no parameter"):
        TrainSpec(lora={}, freeze=["blocks.0.attn.qkv.lora_a"])


def test_globs_select_blocks_by_index_and_kind():
    frozen = TrainSpec(freeze=["blocks.[0-1].*", "blocks.*.mlp.0.*"]).frozen_parameters()
    assert {n.split(".")[1] for n in frozen if ".mlp.0." not in n} == {"0", "1"}
    assert {n for n in frozen if ".mlp.0." in n} == {f"blocks.{i}.mlp.0.{k}" for i in range(4) for k in ("weight", "bias")}


@pytest.mark.parametrize(("lora", "wanted"), [
    ({"rank": 0}, "greater than or equal to 1"),
    ({"rank": 257}, "less than or equal to 256"),
    ({"rank": 200}, "lora.rank must not exceed the model preset's width"),
    ({"alpha": 0}, "greater than 0"),
    ({"targets": []}, "at least 1 item"),
    ({"targets": ["mlp"]}, "'qkv' or 'proj'"),
    ({"targets": ["qkv", "qkv"]}, "lora.targets must not name a projection twice"),
    ({"dropout": 0.1}, "Extra inputs are not permitted"),
])
def test_lora_settings_are_bounded(lora, wanted):
    assert wanted in _error(lora=lora)


def test_the_config_hash_of_a_plain_run_is_unchanged_and_a_fine_tune_has_its_own():
    assert TrainerConfig().config_hash() == PLAIN_HASH
    assert TrainerConfig(freeze=[], lora=None).config_hash() == PLAIN_HASH
    frozen = TrainerConfig(freeze=["blocks.*"]).config_hash()
    assert frozen not in {PLAIN_HASH, TrainerConfig(freeze=["blocks.0.*"]).config_hash()}
    # What is frozen is the identity, not how the patterns spell it.
    assert TrainerConfig(freeze=["blocks.[0-3].*", "blocks.0.ln1.weight"]).config_hash() == frozen
    lora = TrainerConfig(lora={}).config_hash()
    assert lora not in {PLAIN_HASH, frozen}
    assert lora != TrainerConfig(lora={"rank": 4}).config_hash() != TrainerConfig(lora={"alpha": 8}).config_hash()
    assert lora != TrainerConfig(lora={"targets": ["qkv"]}).config_hash()
    assert lora != TrainerConfig(lora={}, freeze=["blocks.*"]).config_hash()


def test_a_plain_config_renders_neither_option():
    """The operator renders the config a trainer image reads, and a trainer from before
    these options refuses keys it does not know: a plain job's file must not change."""
    wire = TrainerConfig().to_wire()
    assert "freeze" not in wire and "lora" not in wire


def test_the_options_round_trip_through_the_camel_case_wire_form():
    cfg = TrainerConfig(freeze=["wte.weight"], lora={"rank": 4, "alpha": 8, "targets": ["proj"]})
    assert TrainerConfig.model_validate(cfg.to_wire()) == cfg
    assert cfg.to_wire()["lora"] == {"rank": 4, "alpha": 8.0, "targets": ["proj"]}
