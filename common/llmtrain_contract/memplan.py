"""The memory plan: a rank's peak GPU memory for a job, from its config alone, before
anything is scheduled (``llmtrain validate`` prints it; docs/trainer.md "Memory plan").

A rank's memory is *static* (what stays between steps: weights, optimizer state, the
engine's buffers) plus the *peak of a step*: the activations saved for the backward pass,
the loss's fp32 tensors over the vocabulary, and what the backward pass adds first. Per
engine and precision:

- **DDP engine, bf16 autocast (``mixed``).** fp32 weights and AdamW moments (4 + 8 bytes a
  parameter) between steps; in a step, autocast's bf16 copy of every weight (2 bytes a
  parameter, kept for the backward pass) and the tied embedding's fp32 gradient.
- **DeepSpeed in bf16.** bf16 weights, fp32 master weights and moments (2 + 4 + 8);
  ZeRO-3 also keeps a bf16 gradient partition and a reduce bucket (2 bytes x
  ``DS_BUCKET``) between steps. ZeRO partitions over the data-parallel world the
  optimizer state and master weights (stage 1 on), the gradients (2 on) and the weights (3).
- **Activations** per block, per token and unit of model width: ``ACT_BYTES``; with
  activation checkpointing, each block's input and one block recomputed at a time.
- **Logits**: ``LOGIT_BYTES`` per token and vocabulary entry.
- **A fine-tune** (``freeze``, ``lora``; ``params.Training``): the optimizer state, master
  weights and gradients of the trained parameters only; the activations of the blocks the
  backward pass goes into, less the inputs a frozen layer does not keep; bf16 copies of
  the matrices the backward pass reads. Checked against the CPU's own counts (parameters,
  saved tensors: ``tests/trainer/engines/test_finetune_costs.py``); the coefficients were fitted on
  fully trained runs, and no fine-tune has been measured on a GPU yet.

The per-token coefficients and the static terms were fitted to the allocator's peak
(``torch.cuda.max_memory_allocated``) on an H200: 17 rows of DDP and ZeRO 1-3, 124M to
1.3B parameters, two micro-batches, all within 6 % (docs/benchmarks.md, "Memory plan";
``bench/gpu.py`` measures them). Counting the saved tensors op by op gives a little more
for the mixed case (38 bytes a token and unit of width): not all of them are alive at
the peak. The allocator's fragmentation and CUDA's own context come on top, so
:func:`fits` keeps a margin (``HEADROOM``, ``CUDA_CONTEXT``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from . import params as parameters
from .config import ModelShape, TrainerConfig

GIB = 1 << 30

ACT_BYTES = {"mixed": 32.5, "bf16": 32, "fp32": 68}
"""Saved activations of one block, bytes per token and unit of model width (fitted on an
H200: docs/benchmarks.md "Memory plan"; fp32, which no GPU run uses by default, is the
op-by-op count, not measured)."""
LOGIT_BYTES = {"mixed": 11.25, "bf16": 12, "fp32": 12}
"""The loss's fp32 tensors at the start of the backward pass, bytes per token and
vocabulary entry (fitted likewise)."""
DS_BUCKET = 500_000_000
"""DeepSpeed's default reduce/allgather bucket, elements."""
CUDA_CONTEXT = 0.6 * GIB
"""CUDA's context, cuBLAS's workspace and NCCL's buffers: not counted by the allocator."""
HEADROOM = 0.9
"""The share of a GPU's memory the plan may fill (fragmentation, the context)."""


@dataclass(frozen=True)
class Job:
    """What the plan needs of a job's config (``from_config`` builds it)."""

    shape: ModelShape
    seq_len: int
    micro_batch: int
    world_size: int
    engine: str = "ddp"
    """``ddp`` or ``deepspeed``."""
    zero_stage: int = 0
    precision: str = "mixed"
    """``mixed`` (fp32 weights, bf16 autocast), ``bf16`` (the model in bf16) or ``fp32``."""
    activation_checkpointing: bool = False
    optimizer_states: int = 2
    """AdamW's two moments, or SGD's momentum (1)."""
    training: parameters.Training | None = None
    """What a fine-tune trains (``freeze``, ``lora``); None: every parameter."""


@dataclass
class Plan:
    job: Job
    terms: dict[str, float] = field(default_factory=dict)
    """Bytes per named term that stays between steps."""
    step: dict[str, float] = field(default_factory=dict)
    """Bytes per named term at the step's peak, on top of the static ones."""
    static: float = 0.0
    peak: float = 0.0

    def describe(self) -> str:
        def parts(terms: dict[str, float]) -> str:
            return ", ".join(f"{name} {size(value)}" for name, value in terms.items() if value)

        return (f"peak {size(self.peak)}: between steps {size(self.static)} ({parts(self.terms)}), "
                f"in a step {size(self.peak - self.static)} more ({parts(self.step)})")


def size(nbytes: float) -> str:
    return f"{nbytes / GIB:.1f} GiB" if nbytes >= GIB else f"{nbytes / (1 << 20):.0f} MiB"


def precision_of(engine: str, dtype: str, gpu: bool = True) -> str:
    """The precision a run uses on a GPU: the trainer's rule for ``dtype: auto``."""
    if dtype == "float32" or not gpu:
        return "fp32"
    return "bf16" if engine == "deepspeed" else "mixed"


def from_config(cfg: TrainerConfig, world_size: int, gpu: bool = True) -> Job:
    """A plan's inputs from a trainer config, for ``world_size`` ranks on GPUs (or CPUs)."""
    model, strategy, seq = cfg.model, cfg.strategy, cfg.data.seq_len
    return Job(
        shape=model.shape(seq), seq_len=seq, micro_batch=cfg.micro_batch_size, world_size=world_size,
        engine=strategy.kind, zero_stage=strategy.zero_stage if strategy.kind == "deepspeed" else 0,
        precision=precision_of(strategy.kind, model.dtype, gpu), activation_checkpointing=model.activation_checkpointing,
        optimizer_states=2 if cfg.optimizer.name == "adamw" else 1,
        training=parameters.of_spec(cfg) if cfg.freeze or cfg.lora else None,
    )


def params(shape: ModelShape) -> int:
    return shape.approx_params()


def plan(job: Job) -> Plan:
    h, layers, vocab = job.shape.n_embd, job.shape.n_layer, job.shape.vocab_size
    training = job.training
    if training is None:
        p = trained = params(job.shape)
        copied, on_path, saved = p, float(layers), float(layers)
        embedding_trains = True
    else:
        p, trained = training.total, training.trained
        copied, on_path, saved = training.saved_weight_copies(), training.backward_blocks(), training.saved_blocks()
        embedding_trains = "wte.weight" not in training.frozen
    tokens = job.micro_batch * job.seq_len
    w = max(1, job.world_size)
    out = Plan(job)
    t = out.terms
    opt = 4 * job.optimizer_states
    if job.engine == "deepspeed":
        z = job.zero_stage
        half = 2 if job.precision == "bf16" else 4  # the model's own weights and gradients
        t["weights"] = half * p / (w if z >= 3 else 1)
        t["master weights"] = 4 * trained / (w if z >= 1 else 1) if job.precision == "bf16" else 0
        t["optimizer state"] = opt * trained / (w if z >= 1 else 1)
        # ZeRO-3 keeps its gradient partition and a reduce bucket between steps.
        t["gradient partition"] = half * trained / w if z >= 3 else 0
        t["buckets"] = 2 * DS_BUCKET if z >= 3 else 0
        # The optimizer step's gradients: the model's, and fp32 copies (partitioned from stage 2).
        grads = half * trained + (4 * trained / (w if z >= 2 else 1) if job.precision == "bf16" else 0)
        weight_copies = 0.0
        head_grad = 0.0
    else:
        t["weights"] = 4 * p
        t["optimizer state"] = opt * trained
        grads = 4 * trained
        # DDP's gradient buckets, allocated with the wrapper (a copy of the gradients; not
        # measured: the GPU runs so far had one rank).
        t["DDP buckets"] = 4 * trained if w > 1 else 0.0
        weight_copies = 2 * copied if job.precision == "mixed" else 0.0
        # The tied embedding's fp32 gradient, first of the backward pass.
        head_grad = 4 * vocab * h if embedding_trains else 0.0
    out.static = sum(t.values())
    act_per_layer = ACT_BYTES[job.precision] * tokens * h
    if job.activation_checkpointing:
        # Each block's input (the residual stream), and one block recomputed at a time.
        residual = (2 if job.precision == "bf16" else 4) * tokens * h
        acts = on_path * residual + (act_per_layer if on_path else 0.0)
    else:
        acts = saved * act_per_layer
    logits = LOGIT_BYTES[job.precision] * tokens * vocab
    # The step's peak: the start of the backward pass holds every saved activation, the
    # loss's tensors and the first (vocabulary) gradient; by its end the activations are
    # freed and every gradient exists.
    start = {"weight copies (bf16)": weight_copies, "activations": acts, "logits": logits,
             "embedding gradient": head_grad}
    end = {"gradients": grads}
    out.step = max(start, end, key=lambda terms: sum(terms.values()))
    out.peak = out.static + sum(out.step.values())
    return out


def fits(job: Job, gpu_bytes: float) -> bool:
    return plan(job).peak + CUDA_CONTEXT <= HEADROOM * gpu_bytes


def suggestion(job: Job, gpu_bytes: float) -> str | None:
    """The smallest change, in the order a user would try them, that makes the job fit a
    GPU of ``gpu_bytes``; None when none of them does."""
    tries: list[tuple[str, Job]] = []
    if not job.activation_checkpointing:
        tries.append(("model.activationCheckpointing: true", replace(job, activation_checkpointing=True)))
    mb = job.micro_batch
    while mb > 1:
        mb //= 2
        tries.append((f"microBatchSize: {mb}", replace(job, micro_batch=mb)))
    if job.engine == "deepspeed":
        for z in range(job.zero_stage + 1, 4):
            tries.append((f"strategy.zeroStage: {z}", replace(job, zero_stage=z)))
    else:
        for z in (1, 2, 3):
            tries.append((f"strategy: {{kind: deepspeed, zeroStage: {z}}}",
                          replace(job, engine="deepspeed", zero_stage=z, precision="bf16" if job.precision != "fp32" else "fp32")))
    for name, candidate in tries:
        if fits(candidate, gpu_bytes):
            return name
    return None


def advice(job: Job, gpu_bytes: float) -> str:
    """The suggestion in words, or that no single change fits."""
    hint = suggestion(job, gpu_bytes)
    return f"try {hint}" if hint else "no single change of micro-batch, activation checkpointing or ZeRO stage fits"


def verdict(job: Job, gpu_bytes: float | None) -> str:
    """The plan in one sentence, against a GPU of ``gpu_bytes`` when its size is known:
    what a message about a rank out of GPU memory cites."""
    text = f"the memory plan at world size {job.world_size}: {plan(job).describe()}"
    if gpu_bytes is None:
        return text
    if fits(job, gpu_bytes):
        # The plan is a model fitted within 6 %: an OOM it did not foresee is fragmentation,
        # a larger batch than planned (a script), or a case the fit did not cover.
        return (f"{text}; by the plan it fits a GPU of {size(gpu_bytes)}, so the allocator's fragmentation or memory the "
                f"plan does not count filled it (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True helps the first)")
    return f"{text}; it does not fit a GPU of {size(gpu_bytes)} ({HEADROOM:.0%} usable, less CUDA's context): {advice(job, gpu_bytes)}"
