"""The loss curve of a local run, with the failures and recoveries marked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..api.vocabulary import ConditionType, Reason

MARKED = {Reason.INJECTED_NODE_LOSS: "tab:red", Reason.POD_FAILED: "tab:red", Reason.RESTARTED_IN_PLACE: "tab:orange",
          Reason.POD_DISRUPTED: "tab:purple", Reason.NODE_FAILURE: "tab:red", ConditionType.RUNNING: "tab:green"}


def plot_run(steps: list[dict[str, Any]], events: list[tuple[float, int, Any]], path: Path, title: str) -> Path:
    import matplotlib  # noqa: PLC0415 - about a second; only a finished run plots

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - after choosing the Agg backend

    fig, (ax_loss, ax_world) = plt.subplots(2, 1, figsize=(9, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    if steps:
        t0 = steps[0]["time"]
        ax_loss.plot([r["time"] - t0 for r in steps], [r["loss"] for r in steps], ".-", ms=3, lw=1, label="loss (replayed steps included)")
        ax_world.step([r["time"] - t0 for r in steps], [r["world"] for r in steps], where="post", color="tab:blue")
        for when, _, event in events:
            color = MARKED.get(event.reason)
            if color and when >= t0:
                for ax in (ax_loss, ax_world):
                    ax.axvline(when - t0, color=color, ls="--", lw=1, alpha=0.8)
                ax_loss.annotate(event.reason, (when - t0, ax_loss.get_ylim()[1]), rotation=90, va="top", ha="right", fontsize=7,
                                 color=color)
    ax_loss.set_ylabel("loss")
    ax_loss.set_title(title)
    ax_loss.legend(loc="upper right", fontsize=8)
    ax_world.set_ylabel("world size")
    ax_world.set_xlabel("seconds since the first step")
    ax_world.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
