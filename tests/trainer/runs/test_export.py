"""Checkpoints in and out of our format, with real runs: a trained job's step exported as
safetensors and as a folder Hugging Face transformers loads (GPT-2), whose logits equal
the trained model's; a new job started from those weights (``initFrom``) begins where the
first left off; a tampered copy is never exported and a file that does not fit the model
is refused naming the tensor, unless a checkpoint is resumed instead."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from llmtrain_contract.config import MODEL_PRESETS
from llmtrain_contract.exitcodes import ExitCode
from llmtrain_store import safetensors as st
from llmtrain_trainer.engines.init_weights import load_into
from llmtrain_trainer.engines.model import GPT
from support.elastic import base_config, run_job

pytestmark = pytest.mark.slow  # real torchrun runs

LLMTRAIN = str(Path(sys.executable).with_name("llmtrain"))
SEQ = 32


def _export(tier: Path, fmt: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([LLMTRAIN, "checkpoints", "export", str(tier), "--format", fmt, "--out", str(out), "--no-progress", *extra],
                          capture_output=True, text=True, timeout=120)


def _assert_same_logits(model, hf) -> None:
    """Our model and transformers' compute the same logits for the same tokens."""
    tokens = torch.randint(0, 256, (2, SEQ), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        x = model.wte(tokens) + model.wpe(torch.arange(SEQ))
        for block in model.blocks:
            x = block(x)
        logits = model.head(model.ln_f(x))
        theirs = hf(tokens).logits
    assert torch.allclose(logits, theirs, atol=1e-4, rtol=1e-4), (logits - theirs).abs().max()


def _first_loss(job) -> float:
    return min(job.steps(), key=lambda r: r["step"])["loss"]


def test_a_trained_step_loads_in_transformers_and_starts_a_new_job_where_it_left_off(tmp_path):
    from transformers import GPT2LMHeadModel

    trained, codes = run_job(tmp_path / "a", base_config(maxSteps=30))
    assert codes == [0], trained.logs()
    tier = trained.node_dir(0) / "ckpt"
    ours, gpt2 = tmp_path / "ours", tmp_path / "gpt2"
    for fmt, out in (("safetensors", ours), ("hf-gpt2", gpt2)):
        done = _export(tier, fmt, out)
        assert done.returncode == 0 and "step 30: 52 tensors" in done.stdout, done.stdout + done.stderr
    assert st.read_header(ours / "model.safetensors").metadata["llmtrain_step"] == "30"
    config = json.loads((gpt2 / "config.json").read_text())
    assert (config["n_layer"], config["n_head"], config["n_embd"], config["n_positions"]) == (4, 4, 192, SEQ), config

    # transformers computes what the trained model computes.
    model = GPT(MODEL_PRESETS["tiny"].model_copy(update={"block_size": SEQ})).eval()
    assert load_into(model, ours / "model.safetensors") == 52
    hf = GPT2LMHeadModel.from_pretrained(str(gpt2)).eval()
    _assert_same_logits(model, hf)

    # A new job from the GPT-2 folder's weights starts at the trained loss, not a fresh one.
    fresh_loss, trained_loss = _first_loss(trained), trained.steps()[-1]["loss"]
    started, codes = run_job(tmp_path / "b", base_config(maxSteps=3, initFrom=str(gpt2 / "model.safetensors")))
    assert codes == [0], started.logs()
    assert "initialised 52 parameters from" in started.logs()
    first = _first_loss(started)
    assert fresh_loss - trained_loss > 2.0, (fresh_loss, trained_loss)
    assert abs(first - trained_loss) < 1.0 < fresh_loss - first, (fresh_loss, trained_loss, first)


def test_a_tampered_copy_is_not_exported_and_a_file_that_does_not_fit_fails_the_job_naming_the_tensor(tmp_path):
    trained, codes = run_job(tmp_path / "a", base_config(maxSteps=5, checkpoint={"intervalSteps": 5}))
    assert codes == [0], trained.logs()
    # initFrom matters only for step 0: a job that resumes a checkpoint does not need the
    # file (gone since, say), and says so instead of failing.
    resumed, codes = run_job(tmp_path / "a", base_config(maxSteps=8, checkpoint={"intervalSteps": 5},
                                                        initFrom=str(tmp_path / "gone.safetensors")))
    assert codes == [0], resumed.logs()
    assert "not needed: resuming the checkpoint of step 5" in resumed.logs(), resumed.logs()[-3000:]
    state = sorted((trained.node_dir(0) / "ckpt").glob("step-*/state.llmt"))[-1]
    with open(state, "r+b") as f:
        f.seek(state.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    refused = _export(trained.node_dir(0) / "ckpt", "safetensors", tmp_path / "out")
    assert refused.returncode == 1 and "state.llmt" in refused.stderr and "check" in refused.stderr, refused.stderr
    assert not list((tmp_path / "out").glob("*.safetensors")), "nothing is written from a copy that fails its check"

    # Weights of another shape: refused before step 0, naming the tensor (DATA_ERROR).
    other = tmp_path / "other.safetensors"
    wte = bytes(4 * 100 * 192)
    st.write(other, [st.Tensor("wte.weight", "float32", (100, 192), len(wte), lambda: wte)])
    failed, codes = run_job(tmp_path / "c", base_config(maxSteps=3, initFrom=str(other)))
    assert codes == [ExitCode.DATA_ERROR], failed.logs()
    assert "initFrom" in failed.logs() and "lacks" in failed.logs(), failed.logs()[-3000:]


def test_a_lora_fine_tune_exports_its_frozen_base_and_adapters_and_folds_them_for_transformers(tmp_path):
    """The frozen base weights leave with the adapters (our names), and hf-gpt2 folds each
    adapter pair into its projection: transformers computes what the adapted model does."""
    from transformers import GPT2LMHeadModel

    from llmtrain_contract.config import LoraConfig
    from llmtrain_trainer.engines.model import add_lora

    lora = {"rank": 4, "alpha": 8.0}
    trained, codes = run_job(tmp_path / "a", base_config(maxSteps=12, lora=lora, optimizer={"lr": 0.01, "warmupSteps": 1}))
    assert codes == [0], trained.logs()
    tier = trained.node_dir(0) / "ckpt"
    ours, gpt2 = tmp_path / "ours", tmp_path / "gpt2"
    for fmt, out in (("safetensors", ours), ("hf-gpt2", gpt2)):
        done = _export(tier, fmt, out)
        assert done.returncode == 0, done.stdout + done.stderr
    names = set(st.read_header(ours / "model.safetensors").entries)
    assert "wte.weight" in names and "blocks.0.attn.qkv.lora_a" in names, "frozen base and adapters, our names"
    assert not any("lora" in n for n in st.read_header(gpt2 / "model.safetensors").entries), "folded for transformers"

    model = GPT(MODEL_PRESETS["tiny"].model_copy(update={"block_size": SEQ})).eval()
    add_lora(model, LoraConfig.model_validate(lora), seed=0)
    load_into(model, ours / "model.safetensors")
    assert model.blocks[0].attn.qkv.lora_b.abs().max() > 0, "the adapters trained"
    hf = GPT2LMHeadModel.from_pretrained(str(gpt2)).eval()
    _assert_same_logits(model, hf)
