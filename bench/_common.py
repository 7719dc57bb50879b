"""Conventions every benchmark follows (see docs/benchmarks.md).

- ``--quick`` selects a run of about a minute;
- the last line printed is ``RESULT name=value [name=value ...]``.
"""

from __future__ import annotations

import argparse


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="a run of about a minute (CI smoke)")
    return p


def result(**values: float | int | str) -> None:
    """Print the RESULT line. Call it last."""

    def fmt(v: float | int | str) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    print("RESULT " + " ".join(f"{k}={fmt(v)}" for k, v in values.items()), flush=True)
