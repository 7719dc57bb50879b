"""Import contracts: layering, the pure planner, and image boundaries."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from support.specs import ROOT



def test_import_contracts_are_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_operator_modules_import_without_torch_at_runtime():
    # Static contracts miss dynamic imports; import everything and look at sys.modules.
    code = (
        "import sys, pkgutil, importlib, llmtrain_operator\n"
        "for m in pkgutil.walk_packages(llmtrain_operator.__path__, 'llmtrain_operator.'):\n"
        "    importlib.import_module(m.name)\n"
        "import llmtrain_contract.config, llmtrain_contract.exitcodes\n"
        "heavy = sorted(n for n in ('torch', 'deepspeed', 'numpy') if n in sys.modules)\n"
        "print(heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
