"""Typed trainer configuration, shared with the operator.

The user-facing part (:class:`TrainSpec`) is embedded verbatim in the
``LLMTrainJob`` API as ``spec.trainer.builtin``; the operator adds the runtime part and
renders a :class:`TrainerConfig` file that the trainer reads with ``--config``.

Import-light: pydantic only. The operator image has no torch, and it imports this.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from fnmatch import fnmatchcase
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, StringConstraints

from .base import CamelModel
from .names import METRICS_PORT
from .rules import Rule, Ruled, cel_get, cel_literal, default_of


# --------------------------------------------------------------------------- model

ModelPresetName = Literal["tiny", "small", "gpt2-124m", "gpt2-350m", "gpt-1.3b"]


class ModelShape(BaseModel):
    """The dimensions of a decoder-only transformer."""

    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int
    block_size: int

    def approx_params(self) -> int:
        """Parameter count, embeddings included (tied input/output embedding)."""
        per_layer = 12 * self.n_embd * self.n_embd + 13 * self.n_embd
        return (
            self.vocab_size * self.n_embd
            + self.block_size * self.n_embd
            + self.n_layer * per_layer
            + 2 * self.n_embd
        )


MODEL_PRESETS: dict[str, ModelShape] = {
    # ~3.4 M parameters: fast enough for multi-process CPU tests.
    "tiny": ModelShape(n_layer=4, n_head=4, n_embd=192, vocab_size=8192, block_size=256),
    # ~17 M parameters: for benchmarks that need a non-trivial step time on CPU.
    "small": ModelShape(n_layer=6, n_head=8, n_embd=384, vocab_size=16384, block_size=512),
    "gpt2-124m": ModelShape(n_layer=12, n_head=12, n_embd=768, vocab_size=50304, block_size=1024),
    "gpt2-350m": ModelShape(n_layer=24, n_head=16, n_embd=1024, vocab_size=50304, block_size=1024),
    # GPT-3 XL's depth and width (1.3 B parameters): its AdamW state (about 21 GB with the
    # fp32 weights and gradients) is the size where a checkpoint's stall starts to matter.
    "gpt-1.3b": ModelShape(n_layer=24, n_head=16, n_embd=2048, vocab_size=50304, block_size=2048),
}


class ModelConfig(CamelModel):
    preset: ModelPresetName = "tiny"
    """Named model size. Default ``tiny`` (~3 M parameters, for CPU tests).
    ``gpt2-124m`` and ``gpt2-350m`` match GPT-2's shapes (vocabulary padded to 50304);
    ``gpt-1.3b`` is GPT-3 XL's (24 layers of width 2048, 2048 positions)."""

    activation_checkpointing: bool = False
    """Recompute each block's activations in the backward pass. Default off. Trades
    about 30% more compute for much less activation memory on large models."""

    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Compute dtype. Default ``auto``: bfloat16 on GPUs that support it, float32 on CPU
    (CPU bf16 matmuls are slow and gloo reductions of bf16 lose precision)."""

    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout probability, 0 <= p < 1. Default 0: pretraining rarely needs it, and 0
    keeps runs bit-reproducible across restarts."""

    def shape(self, seq_len: int) -> ModelShape:
        base = MODEL_PRESETS[self.preset]
        return base.model_copy(update={"block_size": seq_len})


# ---------------------------------------------------------------------------- data


class DataConfig(Ruled):
    source: Literal["synthetic", "shards"] = "synthetic"
    """``synthetic``: deterministic pseudo-random tokens from ``seed`` (no files).
    ``shards``: memory-mapped nanoGPT-style ``.bin`` files of uint16 tokens."""

    path: str | None = None
    """For ``shards``: a ``.bin`` file or a directory of them, read in sorted order.
    Inside a pod this is usually a mounted volume. Required for ``shards``.
    ``builtin:tiny`` selects the small byte-level shard shipped with the trainer."""

    seq_len: int = Field(128, ge=8, le=32768)
    """Tokens per sample (the context length), 8..32768. Default 128. Must not exceed
    the preset's block size (256 for ``tiny``, 1024 for GPT-2)."""

    vocab_size: int | None = Field(None, ge=2, le=65536)
    """For ``synthetic`` data: the token range. Default: the model's vocabulary.
    uint16 shards cap it at 65536."""



# ----------------------------------------------------------------------- optimizer


class OptimizerConfig(Ruled):
    name: Literal["adamw", "sgd"] = "adamw"
    """Optimizer. Default ``adamw``. Under DeepSpeed the same settings are passed into
    its config unless ``deepspeedConfig.optimizer`` overrides them."""

    lr: float = Field(3e-4, gt=0.0, le=1.0)
    """Peak learning rate, 0 < lr <= 1. Default 3e-4."""

    min_lr: float = Field(3e-5, ge=0.0)
    """Floor of the cosine/linear decay. Default 3e-5. Must be <= ``lr``."""

    weight_decay: float = Field(0.1, ge=0.0)
    """Decoupled weight decay. Default 0.1 (GPT-2/3 practice)."""

    beta1: float = Field(0.9, ge=0.0, lt=1.0)
    """Adam beta1. Default 0.9."""

    beta2: float = Field(0.95, ge=0.0, lt=1.0)
    """Adam beta2. Default 0.95 (more stable than 0.999 for LLMs)."""

    warmup_steps: int = Field(10, ge=0)
    """Linear warmup, in optimizer steps. Default 10."""

    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    """Decay after warmup, down to ``minLr`` at ``maxSteps``. Default ``cosine``."""

    grad_clip: float = Field(1.0, ge=0.0)
    """Global gradient-norm clip; 0 disables. Default 1.0."""



# ------------------------------------------------------------------------ strategy


class StrategyConfig(Ruled):
    kind: Literal["ddp", "deepspeed"] = "ddp"
    """``ddp``: plain DistributedDataParallel. ``deepspeed``: DeepSpeed with ZeRO.
    Default ``ddp``."""

    zero_stage: int = Field(0, ge=0, le=3)
    """DeepSpeed ZeRO stage 0..3 (``deepspeed`` only). Default 0. Stage 2 shards
    optimizer state and gradients; 3 also shards parameters."""

    deepspeed_config: dict[str, Any] | None = None
    """A DeepSpeed config merged over the project's defaults (passthrough; see the
    DeepSpeed docs). Batch sizes are always derived from ``globalBatchSize`` and
    ``microBatchSize`` so they stay correct at every world size."""


# --------------------------------------------------------------------- fine-tuning

LoraTarget = Literal["qkv", "proj"]
LORA_TARGETS: tuple[LoraTarget, ...] = ("qkv", "proj")
ADAPTER_SUFFIXES = (".lora_a", ".lora_b")
"""The names of a LoRA layer's two adapter matrices, after the layer's own name."""
MAX_FREEZE_PATTERNS = 256
FreezePattern = Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9_.*?!\[\]-]+$")]
"""A glob over parameter names: those are letters, digits, ``_`` and ``.``; the rest are
``fnmatch``'s own (``*``, ``?``, ``[...]``, ``[!...]``). Any other character could only
make a pattern match nothing, so it is refused outright."""


class LoraConfig(Ruled):
    """Low-rank adapters (LoRA, Hu et al. 2021) on the attention projections."""

    rank: int = Field(8, ge=1, le=256)
    """The adapters' rank r, 1..256 and at most the model's width. Default 8."""

    alpha: float = Field(16.0, gt=0.0, le=4096.0)
    """The adapters' scale is ``alpha / rank``. Default 16."""

    targets: list[LoraTarget] = Field(default_factory=lambda: list(LORA_TARGETS), min_length=1, max_length=2)
    """Which projections of every block's attention get adapters: ``qkv`` (the joint
    query/key/value projection, ``blocks.N.attn.qkv``) and ``proj`` (its output
    projection, ``blocks.N.attn.proj``). Default both."""


def is_adapter(name: str) -> bool:
    return name.endswith(ADAPTER_SUFFIXES)


def parameter_names(shape: ModelShape, lora_targets: Sequence[str] = ()) -> list[str]:
    """The built-in model's parameter names, in its own order (``named_parameters``). The
    output head shares ``wte.weight`` (tied embeddings) and has no name of its own."""
    names = ["wte.weight", "wpe.weight"]
    for i in range(shape.n_layer):
        block = f"blocks.{i}"
        names += [f"{block}.ln1.weight", f"{block}.ln1.bias"]
        for target in LORA_TARGETS:
            layer = f"{block}.attn.{target}"
            names += [f"{layer}.weight", f"{layer}.bias"]
            if target in lora_targets:
                names += [layer + suffix for suffix in ADAPTER_SUFFIXES]
        names += [f"{block}.ln2.weight", f"{block}.ln2.bias"]
        names += [f"{block}.mlp.{j}.{kind}" for j in (0, 2) for kind in ("weight", "bias")]
    return names + ["ln_f.weight", "ln_f.bias"]


class FreezeError(ValueError):
    """``freeze`` does not fit the model: a pattern matches nothing, or nothing trains."""


def unmatched(patterns: Sequence[str], names: Sequence[str]) -> list[str]:
    """The patterns that match none of ``names``."""
    return [p for p in patterns if not any(fnmatchcase(n, p) for n in names)]


def frozen_names(names: Sequence[str], freeze: Sequence[str], lora: bool) -> list[str]:
    """Which of the model's parameters ``names`` are frozen, in the model's order.

    The patterns match base parameters only: an adapter always trains. With LoRA and no
    pattern, every base parameter is frozen (the usual LoRA fine-tune); with patterns,
    exactly the ones they match, and the rest of the base trains beside the adapters.
    Raises ``FreezeError`` naming a pattern that matches nothing (a typo must not
    silently train everything), or when nothing would train."""
    base = [n for n in names if not is_adapter(n)]
    missing = unmatched(freeze, base)
    if missing:
        hint = " (the output head is tied to wte.weight)" if any(fnmatchcase("head.weight", p) for p in missing) else ""
        raise FreezeError(f"{missing[0]!r} matches no parameter of the model{hint}, whose parameters are "
                          f"{', '.join(base[:6])}, ..., {base[-1]}")
    if lora and not freeze:
        return base
    frozen = [n for n in base if any(fnmatchcase(n, p) for p in freeze)]
    if len(frozen) == len(names):
        raise FreezeError(f"{', '.join(repr(p) for p in freeze[:3])}{', ...' if len(freeze) > 3 else ''} "
                          f"freeze all {len(names)} parameters: nothing would train")
    return frozen


# ---------------------------------------------------------------------- train spec


class WorldSizeInvalid(ValueError):
    """The world size cannot keep the fixed global batch (the trainer exits
    ``WORLD_SIZE_INVALID``)."""


class TrainSpec(Ruled):
    """What to train: the user-facing part, embedded in the API as ``trainer.builtin``."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    """The model preset and its options."""

    data: DataConfig = Field(default_factory=DataConfig)
    """Where samples come from. Positions are global sample indices, so the data order
    is the same at any world size."""

    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    """Optimizer and learning-rate schedule."""

    strategy: StrategyConfig = Field(default_factory=StrategyConfig)
    """DDP or DeepSpeed."""

    global_batch_size: int = Field(16, ge=1)
    """Samples per optimizer step, fixed across world sizes. Default 16. Gradient
    accumulation absorbs world-size changes, so it must be divisible by
    ``microBatchSize x world size`` for every allowed world size."""

    micro_batch_size: int = Field(4, ge=1)
    """Samples per rank per forward/backward pass. Default 4."""

    max_steps: int = Field(100, ge=1)
    """Optimizer steps to train. Default 100. The job succeeds when it is reached."""

    seed: int = Field(1234, ge=0)
    """Seed for model init, data order and dropout. Default 1234."""

    log_interval_steps: int = Field(10, ge=1)
    """Print a progress line every N steps. Default 10."""

    init_from: str | None = Field(None, min_length=1, max_length=4096, pattern=r"^[^\x00]+$")
    """A safetensors file of weights to start step 0 from instead of the seeded init (a
    path the trainer can read: in a pod, on a mounted volume). Named as the built-in
    model names its parameters (``llmtrain checkpoints export``) or as Hugging Face's
    GPT-2 does (``--format hf-gpt2``, or a GPT-2 of the same shape, with or without the
    ``transformer.`` prefix); every parameter must be in it with its shape, else a fresh
    start fails with DATA_ERROR naming the tensor. A checkpoint, once there is one, is
    resumed instead (the file is then not needed: a failure to read it is only said).
    Not part of the checkpoint identity: a job may resume checkpoints made from other
    starting weights."""

    freeze: list[FreezePattern] | None = Field(None, max_length=MAX_FREEZE_PATTERNS)
    """Parameters that are not trained: globs (``fnmatch``: ``*`` also matches dots) over
    the built-in model's parameter names, at most 256 patterns of at most 256 characters.
    The names: ``wte.weight`` (token embedding, shared with the output head),
    ``wpe.weight`` (positions), per block N (0-based) ``blocks.N.ln1.weight``/``.bias``,
    ``blocks.N.attn.qkv.weight``/``.bias``, ``blocks.N.attn.proj.weight``/``.bias``,
    ``blocks.N.ln2.weight``/``.bias``, ``blocks.N.mlp.0.weight``/``.bias`` (the MLP's
    up-projection), ``blocks.N.mlp.2.weight``/``.bias`` (its down-projection), and
    ``ln_f.weight``/``.bias``. E.g. ``wte.weight``, ``blocks.*.mlp.*``,
    ``blocks.[0-5].*``. A pattern that matches no parameter of the preset is an error, and
    so is freezing every parameter. Patterns match base parameters only (LoRA's adapters
    always train). Default none (unset and an empty list are the same); with ``lora`` and
    no pattern, every base parameter is frozen, and with patterns exactly those. A frozen
    parameter stays bit for bit what step 0 had (the seeded init or ``initFrom``) and is
    in every checkpoint (under DDP first, in one run: docs/trainer.md)."""

    lora: LoraConfig | None = None
    """Low-rank adapters on the attention projections: each targeted layer computes
    ``W x + b + (alpha / rank) * B (A x)``, with ``A`` (rank x in) drawn from the seed and
    ``B`` (out x rank) zero, so that step 0 is the base model exactly. The adapters are
    parameters ``blocks.N.attn.qkv.lora_a``/``.lora_b`` (and ``proj``'s). Default off."""

    def frozen_parameters(self) -> list[str]:
        """The names of the parameters this spec freezes (``frozen_names``), from the
        preset's names; raises ``FreezeError``."""
        if not self.freeze and self.lora is None:
            return []
        shape = self.model.shape(self.data.seq_len)
        names = parameter_names(shape, self.lora.targets if self.lora else ())
        return frozen_names(names, self.freeze or [], self.lora is not None)

    def grad_accum_steps(self, world_size: int) -> int:
        """Gradient accumulation that keeps the global batch at ``world_size``.

        Raises ``WorldSizeInvalid`` when the world size cannot keep it exactly.
        """
        per_step = self.micro_batch_size * world_size
        if world_size < 1 or self.global_batch_size % per_step:
            raise WorldSizeInvalid(
                f"world size {world_size} cannot keep globalBatchSize={self.global_batch_size} "
                f"with microBatchSize={self.micro_batch_size}: {self.global_batch_size} is not "
                f"divisible by {per_step}; valid world sizes are "
                f"{valid_world_sizes(self.global_batch_size, self.micro_batch_size)}"
            )
        return self.global_batch_size // per_step


DERIVED_DEEPSPEED_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
"""DeepSpeed's batch keys: always derived from globalBatchSize and microBatchSize, so that
they stay right at every world size."""
BLOCK_SIZES = {name: shape.block_size for name, shape in MODEL_PRESETS.items()}
VOCAB_SIZES = {name: shape.vocab_size for name, shape in MODEL_PRESETS.items()}

DataConfig.RULES = (
    Rule("shards-need-a-path", "path", "path is required when source is 'shards' (a .bin file or a directory of them)",
         check=lambda d: "" if d.source == "shards" and not d.path else None,
         cel=f"{cel_get('self.source', default_of(DataConfig, 'source'))} != 'shards' || (has(self.path) && self.path != '')",
         example={"source": "shards", "path": None}),
)

OptimizerConfig.RULES = (
    Rule("min-lr-below-peak", "minLr", "minLr must be <= lr",
         check=lambda o: f"{o.min_lr} > {o.lr}" if o.min_lr > o.lr else None,
         cel=f"{cel_get('self.minLr', default_of(OptimizerConfig, 'min_lr'))} <= {cel_get('self.lr', default_of(OptimizerConfig, 'lr'))}",
         example={"lr": 0.001, "minLr": 0.01}),
)

_KIND = cel_get("self.kind", default_of(StrategyConfig, "kind"))
StrategyConfig.RULES = (
    Rule("zero-needs-deepspeed", "zeroStage", "zeroStage needs kind 'deepspeed' (plain DDP has no ZeRO)",
         check=lambda c: "" if c.kind == "ddp" and c.zero_stage else None,
         cel=f"{_KIND} != 'ddp' || {cel_get('self.zeroStage', 0)} == 0",
         example={"kind": "ddp", "zeroStage": 2}),
    Rule("deepspeed-config-needs-deepspeed", "deepspeedConfig", "deepspeedConfig needs kind 'deepspeed'",
         check=lambda c: "" if c.kind == "ddp" and c.deepspeed_config else None,
         cel=f"{_KIND} != 'ddp' || !has(self.deepspeedConfig)",
         example={"kind": "ddp", "deepspeedConfig": {"zero_optimization": {"stage": 1}}}),
    Rule("batch-keys-are-derived", "deepspeedConfig",
         "deepspeedConfig must not set " + ", ".join(DERIVED_DEEPSPEED_KEYS) + ": they are derived from globalBatchSize and "
         "microBatchSize at every world size",
         check=lambda c: ", ".join(k for k in DERIVED_DEEPSPEED_KEYS if k in (c.deepspeed_config or {})) or None,
         server_cannot="deepspeedConfig is a free-form passthrough (x-kubernetes-preserve-unknown-fields), and CEL cannot "
                       "look inside such a value",
         example={"kind": "deepspeed", "deepspeedConfig": {"train_batch_size": 32}}),
)

LoraConfig.RULES = (
    Rule("lora-targets-unique", "targets", "lora.targets must not name a projection twice",
         check=lambda c: ", ".join(sorted({t for t in c.targets if c.targets.count(t) > 1})) or None,
         cel="!has(self.targets) || self.targets.all(t, self.targets.exists_one(u, u == t))",
         example={"targets": ["qkv", "qkv"]}),
)

WIDTHS = {name: shape.n_embd for name, shape in MODEL_PRESETS.items()}


def _base_names(t: TrainSpec) -> list[str]:
    return [n for n in parameter_names(t.model.shape(t.data.seq_len)) if not is_adapter(n)]


def _unmatched_freeze(t: TrainSpec) -> str | None:
    missing = unmatched(t.freeze or [], _base_names(t))
    if not missing:
        return None
    tied = " (the output head is tied to wte.weight)" if fnmatchcase("head.weight", missing[0]) else ""
    return f"{missing[0]!r} matches no parameter of '{t.model.preset}'{tied}"


def _all_frozen(t: TrainSpec) -> str | None:
    patterns = t.freeze or []
    if t.lora is not None or not patterns:
        return None
    names = _base_names(t)
    if all(any(fnmatchcase(n, p) for p in patterns) for n in names):
        return f"they match all {len(names)} parameters of '{t.model.preset}'"
    return None


_FREEZE_CANNOT = ("CEL has no glob matching, and the parameter names depend on the preset's depth; the operator reports "
                  "the job Invalid")
_PRESET = cel_get("self.model.preset", default_of(ModelConfig, "preset"))
TrainSpec.RULES = (
    Rule("seq-len-fits-the-model", "data.seqLen",
         "data.seqLen must not exceed the model preset's block size (" + ", ".join(f"{k} {v}" for k, v in BLOCK_SIZES.items()) + ")",
         check=lambda t: (f"{t.data.seq_len} > {BLOCK_SIZES[t.model.preset]} of '{t.model.preset}'"
                          if t.data.seq_len > BLOCK_SIZES[t.model.preset] else None),
         cel=f"{cel_get('self.data.seqLen', default_of(DataConfig, 'seq_len'))} <= {cel_literal(BLOCK_SIZES)}[{_PRESET}]",
         example={"data.seqLen": 4096}),
    Rule("vocab-fits-the-model", "data.vocabSize",
         "data.vocabSize must not exceed the model preset's vocabulary (" + ", ".join(f"{k} {v}" for k, v in VOCAB_SIZES.items()) + ")",
         check=lambda t: (f"{t.data.vocab_size} > {VOCAB_SIZES[t.model.preset]} of '{t.model.preset}'"
                          if t.data.vocab_size and t.data.vocab_size > VOCAB_SIZES[t.model.preset] else None),
         cel=f"!has(self.data) || !has(self.data.vocabSize) || self.data.vocabSize <= {cel_literal(VOCAB_SIZES)}[{_PRESET}]",
         example={"data.source": "synthetic", "data.vocabSize": 10000}),
    Rule("global-batch-multiple-of-micro", "globalBatchSize", "globalBatchSize must be a multiple of microBatchSize",
         check=lambda t: (f"{t.global_batch_size} % {t.micro_batch_size} != 0"
                          if t.global_batch_size % t.micro_batch_size else None),
         cel=f"{cel_get('self.globalBatchSize', default_of(TrainSpec, 'global_batch_size'))} % "
             f"{cel_get('self.microBatchSize', default_of(TrainSpec, 'micro_batch_size'))} == 0",
         example={"globalBatchSize": 9}),
    Rule("freeze-patterns-match", "freeze",
         "every freeze pattern must match a parameter of the model (names such as wte.weight, blocks.0.attn.qkv.weight, "
         "blocks.0.mlp.0.bias, ln_f.weight)",
         check=_unmatched_freeze, server_cannot=_FREEZE_CANNOT, example={"freeze": ["blocks.99.*"]}),
    Rule("freeze-leaves-something-to-train", "freeze", "freeze must leave a parameter to train (or set lora)",
         check=_all_frozen, server_cannot=_FREEZE_CANNOT, example={"freeze": ["*"]}),
    Rule("lora-rank-fits-the-model", "lora.rank",
         "lora.rank must not exceed the model preset's width (" + ", ".join(f"{k} {v}" for k, v in WIDTHS.items()) + ")",
         check=lambda t: (f"{t.lora.rank} > {WIDTHS[t.model.preset]} of '{t.model.preset}'"
                          if t.lora is not None and t.lora.rank > WIDTHS[t.model.preset] else None),
         cel=f"!has(self.lora) || {cel_get('self.lora.rank', default_of(LoraConfig, 'rank'))} <= {cel_literal(WIDTHS)}[{_PRESET}]",
         example={"lora.rank": 200}),
)


def valid_world_sizes(global_batch: int, micro_batch: int, limit: int = 4096) -> list[int]:
    """World sizes that keep ``global_batch`` exactly, like DeepSpeed elasticity."""
    if global_batch % micro_batch:
        return []
    micro_steps = global_batch // micro_batch
    return [w for w in range(1, min(micro_steps, limit) + 1) if micro_steps % w == 0]


# ---------------------------------------------------------------- runtime settings


class CheckpointTierConfig(CamelModel):
    """One checkpoint tier, as rendered for the trainer."""

    name: Literal["local", "shared", "s3"]
    uri: str
    """A directory for ``local``/``shared``; ``s3://bucket/prefix`` for ``s3``."""
    interval_steps: int = Field(0, ge=0)
    """Least number of steps between two checkpoints kept in this tier (tier 1 takes
    every one: 0)."""
    keep: int = Field(3, ge=1)
    """How many committed checkpoints this tier keeps."""
    endpoint: str | None = None
    """S3 endpoint URL (S3-compatible stores); None means AWS (or ``AWS_ENDPOINT_URL``)."""
    region: str | None = None
    path_style: bool | None = None
    """S3 path-style addressing; None: on when an endpoint is set."""


class AutoCadence(CamelModel):
    """``intervalSteps: auto``: the Young/Daly interval from the measured cost of a
    checkpoint and the job's mean time between failures."""

    initial_steps: int = Field(50, ge=1)
    """The interval until the first checkpoint's cost is measured."""
    min_steps: int = Field(1, ge=1)
    max_steps: int = Field(100_000, ge=1)
    mtbf_prior_seconds: float = Field(14_400.0, gt=0)
    """The MTBF assumed before the job has seen failures, counted as one failure."""


class CheckpointRuntime(CamelModel):
    interval_steps: int = Field(50, ge=1)
    """Take a checkpoint every N steps (tier 1); with ``auto``, the initial interval."""
    auto: AutoCadence | None = None
    """Set: the interval adapts (``checkpoint.intervalSteps: auto``)."""
    tiers: list[CheckpointTierConfig] = Field(default_factory=list)
    """Fastest first. Empty means checkpointing is off."""
    allow_fresh_start: bool = False
    """If every checkpoint is corrupt, start from step 0 instead of exiting with
    CORRUPT_CHECKPOINT."""
    sigterm_budget_seconds: float = Field(20.0, gt=0)
    """Time allowed for the emergency checkpoint after SIGTERM."""


class NumericsRuntime(CamelModel):
    spike_std_devs: float = Field(6.0, ge=0)
    """A loss this many standard deviations above the recent window's mean is bad (0: only
    non-finite losses are)."""
    spike_min_rise: float = Field(0.5, ge=0)
    """A spike must also be this far above the window's mean (the loss's units)."""
    window_steps: int = Field(50, ge=5)
    """The recent window; spikes are judged once it is full."""
    max_rollbacks: int = Field(3, ge=0)
    """Rollbacks allowed over the job; one more bad step exits with BAD_NUMERICS."""


class StragglerRuntime(CamelModel):
    factor: float = Field(2.0, gt=1)
    """A rank's local step time above this multiple of the other ranks' median is slow."""
    steps: int = Field(20, ge=0)
    """Consecutive slow steps before it is a straggler (as many fast ones clear it); 0: off."""
    min_excess_seconds: float = Field(0.05, ge=0)
    """Also at least this much above the median (noise on very short steps is not)."""


class FaultToleranceRuntime(CamelModel):
    hang_timeout_seconds: float = Field(300.0, gt=0)
    """No step progress for this long: dump stacks and exit with HANG."""
    collective_timeout_seconds: float = Field(120.0, gt=0)
    """Timeout for every collective and for process-group init."""
    numerics: NumericsRuntime = Field(default_factory=NumericsRuntime)
    """Bad numerics: a non-finite loss or a spike rolls back and skips the window."""
    stragglers: StragglerRuntime = Field(default_factory=StragglerRuntime)
    """Stragglers: a rank whose local step time stays above the others'."""
    in_process_healing: bool = False
    """A failed peer's survivors keep their processes and state; its replacement gets the
    state from a survivor (``llmtrain_trainer.train.heal``). DDP only."""


class MetricsRuntime(CamelModel):
    enabled: bool = True
    host: str = "0.0.0.0"
    """Bind address. Environment variables are expanded (the operator renders
    ``$POD_IP``); an unset variable falls back to all interfaces."""
    port: int = Field(METRICS_PORT, ge=0, le=65535)
    """Local rank r serves on ``port + r``; 0 picks a free port (tests)."""


class TrainerConfig(TrainSpec):
    """The file the trainer reads (``--config``): the train spec plus runtime settings."""

    job_name: str = "local"
    job_uid: str = Field("", max_length=128)
    """The job's uid (the operator renders it; a local run's id): recorded as each
    checkpoint's owner. Not part of ``config_hash``: a job re-created under the same name
    resumes from its predecessor's steps."""
    run_dir: str = "/tmp/llmtrain"
    """Scratch directory for per-rank status files (exit records, progress)."""
    checkpoint: CheckpointRuntime = Field(default_factory=CheckpointRuntime)
    fault_tolerance: FaultToleranceRuntime = Field(default_factory=FaultToleranceRuntime)
    metrics: MetricsRuntime = Field(default_factory=MetricsRuntime)

    def config_hash(self) -> str:
        """Hash of what determines the training trajectory (not the runtime settings).

        Stored in checkpoints: a checkpoint from a different model or data config is not
        resumed into this run.
        """
        train_part = TrainSpec.model_validate(
            self.model_dump(include=set(TrainSpec.model_fields), by_alias=False)
        ).model_dump(mode="json", exclude={"log_interval_steps", "max_steps", "init_from"})
        # Not part of the identity: logging; the strategy (DDP and DeepSpeed checkpoints
        # are told apart by the manifest's own strategy field); and maxSteps: extending
        # (or shortening) a run from its checkpoints is routine, as in nanoGPT or
        # Megatron. The LR schedule is a pure function of (step, maxSteps) and decays over
        # maxSteps - warmupSteps, so a resume at another maxSteps continues on the new
        # schedule: the LR jumps at the resume step to the new schedule's value; the steps
        # already taken and the data order (global sample indices) do not change. The
        # manifest records maxSteps and the trainer logs the jump when it happens. (In
        # Kubernetes `trainer` is immutable, so this happens only to a new job reusing a
        # job's checkpoints, or to `llmtrain run` of an edited file.)
        train_part.pop("strategy", None)
        # What trains is the identity, not how the patterns spell it: the frozen names.
        # Absent when nothing is frozen and there are no adapters, so that a plain run's
        # hash (and its checkpoints) stays what it was before these options existed.
        train_part.pop("freeze", None)
        if train_part.get("lora") is None:
            train_part.pop("lora", None)
        frozen = self.frozen_parameters()
        if frozen:
            train_part["frozen"] = frozen
        blob = json.dumps(train_part, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]
