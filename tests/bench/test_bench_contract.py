"""Every benchmark follows the conventions in docs/benchmarks.md: `--quick`, and a last
line `RESULT name=value ...` (the runs themselves are `make bench`, not tests)."""

import re
import subprocess
import sys

import pytest
from support.specs import ROOT

BENCH = ROOT / "bench"
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if not p.name.startswith("_"))


def test_there_are_benchmarks():
    assert {p.name for p in SCRIPTS} >= {"trainer_overhead.py", "operator_scale.py", "recovery.py"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_each_benchmark_accepts_quick_and_ends_with_a_result_line(script):
    out = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "--quick" in out.stdout
    source = script.read_text()
    assert "RESULT " in source.split('"""')[1], "the docstring shows the RESULT line"
    assert re.search(r"^\s+result\(", source, re.M), "the script prints its RESULT line through _common.result"


def test_the_result_line_format():
    sys.path.insert(0, str(BENCH))
    from _common import result  # bench/ is on the path only from here

    import io
    from contextlib import redirect_stdout

    buf = io.StringIO()
    with redirect_stdout(buf):
        result(ratio=0.98765, jobs=500, name="x")
    assert buf.getvalue() == "RESULT ratio=0.9877 jobs=500 name=x\n"


def test_importing_a_benchmark_leaves_the_environment_as_it_was():
    """A test that imports a benchmark (for its pure helpers) must not change the session
    for every later test: bench/gpu.py's import once set LLMTRAIN_LOG_LEVEL=ERROR, and every
    trainer run after it in the suite logged nothing but errors."""
    program = (
        "import importlib, os, sys\n"
        f"sys.path[:0] = [{str(BENCH)!r}, {str(ROOT / 'tests')!r}, {str(ROOT / 'hack')!r}]\n"
        "changed = {}\n"
        f"for name in {[p.stem for p in SCRIPTS]!r}:\n"
        "    before = dict(os.environ)\n"
        "    importlib.import_module(name)\n"
        "    diff = sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k))\n"
        "    if diff:\n"
        "        changed[name] = diff\n"
        "print(changed)\n"
    )
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "{}", f"benchmarks that change os.environ when imported: {out.stdout}"
