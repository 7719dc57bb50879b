"""The loss curve of a local run, with the failures and recoveries marked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..api.vocabulary import ConditionType, Reason

MARKED = {Reason.INJECTED_NODE_LOSS: "tab:red", Reason.POD_FAILED: "tab:red", Reason.RESTARTED_IN_PLACE: "tab:orange",
          Reason.POD_DISRUPTED: "tab:purple", Reason.NODE_FAILURE: "tab:red", ConditionType.RUNNING: "tab:green"}


def kept_and_replayed(steps: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The trajectory the model kept (each step's last record, in time order) and the
    records a restart replayed (a step's earlier runs, lost with the attempt)."""
    last: dict[int, dict[str, Any]] = {}
    for record in sorted(steps, key=lambda r: r["time"]):
        last[record["step"]] = record
    kept = sorted(last.values(), key=lambda r: r["step"])
    keep = {id(r) for r in kept}
    return kept, [r for r in steps if id(r) not in keep]


def plot_run(steps: list[dict[str, Any]], events: list[tuple[float, int, Any]], path: Path, title: str) -> Path:
    """Loss against steps (what the model kept, and what restarts redid), and beside it
    loss and world size against wall-clock time with each failure and recovery marked."""
    import matplotlib  # noqa: PLC0415 - about a second; only a finished run plots

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - after choosing the Agg backend

    fig = plt.figure(figsize=(13, 6))
    grid = fig.add_gridspec(2, 2, height_ratios=[3, 1], width_ratios=[1, 1])
    ax_steps = fig.add_subplot(grid[:, 0])
    ax_loss = fig.add_subplot(grid[0, 1])
    ax_world = fig.add_subplot(grid[1, 1], sharex=ax_loss)
    if steps:
        kept, replayed = kept_and_replayed(steps)
        ax_steps.plot([r["step"] for r in kept], [r["loss"] for r in kept], ".-", ms=3, lw=1, label="kept")
        if replayed:
            ax_steps.plot([r["step"] for r in replayed], [r["loss"] for r in replayed], "x", ms=4, color="tab:gray",
                          label="redone after a restart (lost)")
        t0 = min(r["time"] for r in steps)
        ordered = sorted(steps, key=lambda r: r["time"])
        ax_loss.plot([r["time"] - t0 for r in ordered], [r["loss"] for r in ordered], ".-", ms=3, lw=1,
                     label="loss (replayed steps included)")
        ax_world.step([r["time"] - t0 for r in ordered], [r["world"] for r in ordered], where="post", color="tab:blue")
        for when, _, event in events:
            color = MARKED.get(event.reason)
            if color and when >= t0:
                for ax in (ax_loss, ax_world):
                    ax.axvline(when - t0, color=color, ls="--", lw=1, alpha=0.8)
                ax_loss.annotate(event.reason, (when - t0, ax_loss.get_ylim()[1]), rotation=90, va="top", ha="right", fontsize=7,
                                 color=color)
    ax_steps.set_xlabel("step")
    ax_steps.set_ylabel("loss")
    ax_steps.set_title(title)
    ax_steps.legend(loc="upper right", fontsize=8)
    ax_loss.set_ylabel("loss")
    ax_loss.set_title("against wall-clock time", fontsize=10)
    ax_loss.legend(loc="upper right", fontsize=8)
    ax_world.set_ylabel("world size")
    ax_world.set_xlabel("seconds since the first step")
    ax_world.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
