"""The incremental side of bench/checkpoint.py: bytes and time per checkpoint into the
job-wide tiers (a shared directory, S3 on MinIO) for full training, 90 % of the weights
frozen, and LoRA adapters, each with the tiers storing pieces by content (today) and
whole (as before content addressing), side by side in one run.

The real trainer (world size 1, in this process) takes every checkpoint and its own
propagators store it into both tiers; this script times each from the save call to the
step's ``COMMITTED`` being visible in each tier, tier 1 (node-local, whole files) too
(its own clock, polling), and measures from outside what each checkpoint wrote: the bytes of the files and objects that were not
in the tier before it (each tier keeps two steps, as retention would). A restore of the
newest step from each tier into a scratch folder is timed too, the two stores alternating
over rounds.
"""

from __future__ import annotations

import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MODES = ("full", "frozen90", "lora")


def spec_of(mode: str, preset: str) -> dict[str, Any]:
    """The trainer spec's fine-tuning part for ``mode``: ``frozen90`` freezes the
    embeddings and the first blocks, as many as bring the frozen share of the weights
    closest to 90 % (89.6 % for ``small``, 88.6 % for ``gpt2-124m``), the last block
    always trained."""
    if mode == "lora":
        return {"lora": {"rank": 8, "alpha": 16}}
    if mode == "full":
        return {}
    from llmtrain_contract.config import MODEL_PRESETS  # noqa: PLC0415

    shape = MODEL_PRESETS[preset]
    width, layers = shape.n_embd, shape.n_layer
    embeddings = (shape.vocab_size + shape.block_size) * width
    block = 12 * width * width + 13 * width  # attention and MLP weights and biases, two LayerNorms
    total = embeddings + layers * block + 2 * width
    frozen = min(range(layers), key=lambda f: abs((embeddings + f * block) / total - 0.9))
    return {"freeze": ["wte.weight", "wpe.weight", *(f"blocks.{i}.*" for i in range(frozen))]}


@dataclass
class Delta:
    mode: str
    store: str
    """``pieces`` (content-addressed) or ``whole``."""
    state_bytes: int = 0
    full_state_bytes: int = 0
    """The state of the same model trained in full (weights and both AdamW moments)."""
    first: dict[str, int] = field(default_factory=dict)
    """Per tier: bytes the first checkpoint added."""
    later: dict[str, list[int]] = field(default_factory=dict)
    """Per tier: bytes each later checkpoint added."""
    seconds: dict[str, list[float]] = field(default_factory=dict)
    """Per tier: save call to COMMITTED visible, every checkpoint after the first."""
    after_local: dict[str, list[float]] = field(default_factory=dict)
    """Per slower tier: from tier 1's COMMITTED to its own (what storing the step there
    took once tier 1 had it; the shared tier is a folder on tier 1's disk)."""
    restore: dict[str, float] = field(default_factory=dict)
    """Per tier: the newest step fetched into a scratch folder, median over rounds."""
    restore_worst: dict[str, float] = field(default_factory=dict)
    allowed: Any = None

    def row(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mode": self.mode, "store": self.store, "state_bytes": self.state_bytes}
        for tier, sizes in self.later.items():
            out[f"{tier}_first_bytes"] = self.first[tier]
            out[f"{tier}_later_bytes_median"] = statistics.median(sizes)
            out[f"{tier}_later_fraction"] = statistics.median(sizes) / self.state_bytes
            out[f"{tier}_later_fraction_of_full"] = statistics.median(sizes) / self.full_state_bytes
            out[f"{tier}_seconds_median"] = statistics.median(self.seconds[tier])
            out[f"{tier}_seconds_worst"] = max(self.seconds[tier])
            if tier in self.after_local:
                out[f"{tier}_after_local_seconds_median"] = statistics.median(self.after_local[tier])
            if tier in self.restore:
                out[f"{tier}_restore_seconds"] = self.restore[tier]
                out[f"{tier}_restore_seconds_worst"] = self.restore_worst[tier]
        return out


TIERS = ("local", "shared", "s3")


def _files(folder: Path) -> dict[str, int]:
    return {str(f): f.stat().st_size for f in folder.rglob("*") if f.is_file()}


def _tier_objects(local: Path, shared: Path, s3: Any, prefix: str) -> dict[str, dict[str, int]]:
    """Every file of tier 1 and the shared tier and every object of the S3 prefix, with its size."""
    return {"local": _files(local), "shared": _files(shared), "s3": s3.keys("bench", prefix + "/")}


def _added(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, int]:
    """Per tier, the bytes of the files and objects that were not there before (what a
    checkpoint wrote; retention may delete older ones meanwhile, which does not count)."""
    return {tier: sum(size for key, size in now.items() if key not in before[tier]) for tier, now in after.items()}


def _committed(local: Path, shared: Path, s3: Any, prefix: str, step: int) -> dict[str, bool]:
    name = f"step-{step:08d}"
    return {"local": (local / name / "COMMITTED").exists(), "shared": (shared / name / "COMMITTED").exists(),
            "s3": f"{prefix}/{name}/COMMITTED" in s3.keys("bench", f"{prefix}/{name}/")}


def run_mode(mode: str, by_content: bool, folder: Path, s3: Any, preset: str, checkpoints: int, steps_between: int,
             full_state: int, log: Any) -> Delta:
    """One trainer, ``checkpoints`` checkpoints ``steps_between`` steps apart."""
    from llmtrain_contract.config import TrainerConfig  # noqa: PLC0415
    from llmtrain_store import build  # noqa: PLC0415
    from llmtrain_trainer.engines import rng  # noqa: PLC0415
    from llmtrain_trainer.train import dist as distmod  # noqa: PLC0415
    from llmtrain_trainer.train import loop  # noqa: PLC0415
    from llmtrain_trainer.train.metrics import NullMetrics  # noqa: PLC0415

    from _ckpt_train import trainer_config  # noqa: PLC0415

    store = "pieces" if by_content else "whole"
    prefix = f"{mode}-{store}"
    shared, local = folder / "shared", folder / "tier1"
    base = trainer_config(preset, 2, 64, local, folder / "run").model_dump(mode="json", by_alias=True)
    base.update(spec_of(mode, preset))
    base["checkpoint"]["tiers"] += [{"name": "shared", "uri": str(shared), "keep": 2},
                                    {"name": "s3", "uri": f"s3://bench/{prefix}", "endpoint": s3.endpoint, "keep": 2}]
    cfg = TrainerConfig.model_validate(base)

    def tiers(specs: Any) -> list[Any]:
        made = build.build_tiers(specs)
        for tier in made[1:]:
            tier.content_addressed = by_content  # "whole": the store as it was before content addressing
        return made

    original, loop.build_tiers = loop.build_tiers, tiers
    try:
        trainer = loop.Trainer(cfg, distmod.init(3600), NullMetrics(), folder / "run")
        trainer.start()
    finally:
        loop.build_tiers = original
    out = Delta(mode, store, trainer.engine.live.size if hasattr(trainer.engine, "live") else 0, full_state)
    try:
        for index in range(checkpoints):
            for _ in range(steps_between):
                trainer.step_once()
            before = _tier_objects(local, shared, s3, prefix)
            began = time.perf_counter()
            trainer.ckpt.save(trainer.step, trainer.step * 2, rng.capture())
            done: dict[str, float] = {}
            while len(done) < len(TIERS):
                for tier, seen in _committed(local, shared, s3, prefix, trainer.step).items():
                    if seen and tier not in done:
                        done[tier] = time.perf_counter() - began
                if time.perf_counter() - began > 600:
                    raise RuntimeError(f"{mode}/{store}: step {trainer.step} not committed in every tier after 600 s")
                time.sleep(0.01)
            trainer.ckpt.wait()
            while trainer.ckpt.writing():  # the commit's retention: the next save must find every tier free
                time.sleep(0.01)
            grew = _added(before, _tier_objects(local, shared, s3, prefix))
            for tier in TIERS:
                if index == 0:
                    out.first[tier] = grew[tier]
                else:
                    out.later.setdefault(tier, []).append(grew[tier])
                    out.seconds.setdefault(tier, []).append(done[tier])
                    if tier != "local":
                        out.after_local.setdefault(tier, []).append(done[tier] - done["local"])
            log(f"  {mode:<9} {store:<6} checkpoint {index + 1}: tier 1 +{grew['local'] / 1e6:.1f} MB in {done['local']:.2f}s, "
                f"shared +{grew['shared'] / 1e6:.1f} MB in {done['shared']:.2f}s ({done['shared'] - done['local']:.2f}s after tier 1), "
                f"s3 +{grew['s3'] / 1e6:.1f} MB in {done['s3']:.2f}s")
    finally:
        trainer.close()
    out.allowed = trainer.engine.allowed_names()
    return out


def restore_rounds(deltas: list[Delta], folders: dict[str, Path], server: Any, rounds: int, cold: bool = False) -> None:
    """Each row's restore time per tier: the newest step fetched whole into a scratch
    folder, every piece checked; the rows' stores alternate round by round (so that the
    machine's drift hits both alike), medians. ``cold``: the page cache dropped before
    each fetch, as on a node that never held the bytes (otherwise whichever store wrote
    last is read from memory: whole, the newest step's files; by content, pieces as old
    as the first checkpoint that held them)."""
    from llmtrain_store.directory import DirTier  # noqa: PLC0415
    from _ckpt_io import drop_caches  # noqa: PLC0415

    times: dict[tuple[int, str], list[float]] = {}
    for round_ in range(rounds):
        order = deltas if round_ % 2 == 0 else deltas[::-1]
        for delta in order:
            folder = folders[delta.store]
            for tier_name, tier in (("shared", DirTier("shared", folder / "shared")), ("s3", _s3(f"{delta.mode}-{delta.store}", server))):
                newest = tier.list()[0]
                scratch = folder / f"restore-{tier_name}"
                if cold:
                    drop_caches()
                began = time.perf_counter()
                tier.fetch(newest, sorted(newest.manifest["files"]), scratch, delta.allowed)
                times.setdefault((id(delta), tier_name), []).append(time.perf_counter() - began)
                shutil.rmtree(scratch, ignore_errors=True)
    for delta in deltas:
        delta.restore = {tier: statistics.median(times[(id(delta), tier)]) for tier in ("shared", "s3")}
        delta.restore_worst = {tier: max(times[(id(delta), tier)]) for tier in ("shared", "s3")}


def _s3(prefix: str, server: Any) -> Any:
    from llmtrain_store.s3 import S3Tier  # noqa: PLC0415

    return S3Tier("s3", f"s3://bench/{prefix}", endpoint=server.endpoint)


def incremental(folder: Path, server: Any, preset: str, checkpoints: int, steps_between: int, log: Any,
                cold: bool = False) -> list[Delta]:
    """Every mode with the tiers storing pieces, then whole; each in a fresh folder and
    S3 prefix, so that nothing is shared between runs (``cold``: restores from a dropped
    page cache, ``restore_rounds``)."""
    full_state = 0
    rows = []
    for mode in MODES:
        folders, pair = {}, []
        for by_content in (True, False):
            store = "pieces" if by_content else "whole"
            folders[store] = folder / f"{mode}-{store}"
            folders[store].mkdir(parents=True)
            delta = run_mode(mode, by_content, folders[store], server, preset, checkpoints, steps_between, full_state, log)
            if mode == "full":
                full_state = delta.full_state_bytes = delta.state_bytes
            pair.append(delta)
        restore_rounds(pair, folders, server, 3, cold)
        rows += pair
        for place in folders.values():
            shutil.rmtree(place, ignore_errors=True)
    return rows
