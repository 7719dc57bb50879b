"""hack/fault_matrix.py: the table it prints comes from the JUnit reports of real pytest
sessions, and a scenario passes a round only when every case of every test it names ran
and passed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import fault_matrix as fm

SAMPLE = '''
import pytest

def test_ok():
    pass

@pytest.mark.parametrize("n", [1, 2])
def test_param(n):
    assert n == 1

def test_error(broken):
    pass

@pytest.fixture
def broken():
    raise RuntimeError("setup failed")
'''


def _junit(tmp_path: Path) -> Path:
    pkg = tmp_path / "tests" / "sample"
    pkg.mkdir(parents=True)
    for folder in (tmp_path / "tests", pkg):
        (folder / "__init__.py").write_text("")
    (pkg / "test_sample.py").write_text(SAMPLE)
    junit = tmp_path / "round.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "--rootdir", str(tmp_path),
         "-c", "/dev/null", f"--junitxml={junit}", "tests/sample/test_sample.py"],
        cwd=tmp_path, capture_output=True, check=False,
    )
    return junit


def test_cases_are_read_per_node_id_with_their_outcome(tmp_path):
    cases = fm.read_junit(_junit(tmp_path))
    by_id = {}
    for case in cases:
        by_id.setdefault(case.nodeid, []).append(case.outcome)
    assert by_id == {
        "tests/sample/test_sample.py::test_ok": ["passed"],
        "tests/sample/test_sample.py::test_param": ["passed", "failed"],
        "tests/sample/test_sample.py::test_error": ["error"],
    }


def test_a_scenario_fails_a_round_on_any_failed_case_or_a_test_that_never_ran(tmp_path):
    cases = fm.read_junit(_junit(tmp_path))
    ok = fm.Scenario(0, "ok", ("tests/sample/test_sample.py::test_ok",))
    half = fm.Scenario(0, "one parameter fails", ("tests/sample/test_sample.py::test_param",))
    errored = fm.Scenario(0, "fixture error", ("tests/sample/test_sample.py::test_error",))
    missing = fm.Scenario(0, "never ran", ("tests/sample/test_sample.py::test_ok", "tests/sample/test_sample.py::test_gone"))
    assert fm.verdict(ok, cases)[0] is True
    assert fm.verdict(half, cases)[0] is False
    assert fm.verdict(errored, cases)[0] is False
    assert fm.verdict(missing, cases)[0] is False
    assert fm.read_junit(tmp_path / "no-report.xml") == []  # pytest died before writing


def test_the_streak_counts_consecutive_passes_only():
    assert fm.longest_streak([True, True, False, True]) == 2
    assert fm.longest_streak([True] * 5) == 5
    assert fm.longest_streak([False, False]) == 0


def test_every_scenario_is_listed_once_and_each_test_is_run_once():
    assert [s.number for s in fm.SCENARIOS] == list(range(1, 23))
    chosen = fm.selection()
    assert len(chosen) == len(set(chosen))
    assert set(chosen) == {t for s in fm.SCENARIOS for t in s.tests}
    # Each node id names a test that exists (a renamed test would silently drop a scenario).
    root = Path(fm.__file__).resolve().parents[1]
    for nodeid in chosen:
        path, name = nodeid.split("::")
        assert f"def {name}(" in (root / path).read_text(), nodeid


def test_a_subset_of_scenarios_is_chosen_by_numbers_and_ranges_and_a_wrong_one_named():
    import pytest

    assert [s.number for s in fm.chosen("3,16-18")] == [3, 16, 17, 18]
    assert fm.chosen(None) == fm.SCENARIOS
    assert set(fm.selection(fm.chosen("16"))) == set(fm.HANGS)
    with pytest.raises(ValueError, match="no scenario 40"):
        fm.chosen("40")
    with pytest.raises(ValueError, match="not a number or a range"):
        fm.chosen("x-3")
