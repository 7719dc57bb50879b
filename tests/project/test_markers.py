"""Markers are declared by the test modules (``pytestmark``) or tests, never inferred:
tests/conftest.py only orders the session by them, and refuses at collection a test that
needs MinIO or the local cluster without its marker, naming it."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("tests_root_conftest", Path(__file__).resolve().parents[1] / "conftest.py")
conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(conftest)


class Item:
    def __init__(self, nodeid: str, fixtures: tuple[str, ...] = (), marks: tuple[str, ...] = ()):
        self.nodeid, self.fixturenames, self.marks = nodeid, list(fixtures), marks
        self.path = Path(nodeid.split("::")[0])

    def get_closest_marker(self, name: str):
        return getattr(pytest.mark, name).mark if name in self.marks else None

    def add_marker(self, marker):
        raise AssertionError(f"a conftest added the marker {marker!r} to {self.nodeid}")


def test_a_test_that_uses_minio_without_tools_is_refused_naming_it():
    items = [Item("tests/store/test_x.py::test_ok", ("minio", "tmp_path"), ("tools",)),
             Item("tests/store/test_x.py::test_unmarked", ("s3env", "minio"))]
    with pytest.raises(pytest.UsageError) as err:
        conftest.pytest_collection_modifyitems(None, items)
    assert "tests/store/test_x.py::test_unmarked: uses the 'minio' fixture but is not marked tools" in str(err.value)
    assert "test_ok" not in str(err.value)


@pytest.mark.parametrize(("fixtures", "marks", "wanted"), [
    (("local_cluster",), (), "'local_cluster' fixture but is not marked cluster or e2e"),
    (("local_cluster", "operator"), ("cluster",), "'operator' fixture but is not marked e2e or kind"),
    (("real_nodes",), ("e2e",), "'real_nodes' fixture but is not marked kind"),
])
def test_a_test_under_a_cluster_fixture_without_its_marker_is_refused(fixtures, marks, wanted):
    with pytest.raises(pytest.UsageError, match=wanted):
        conftest.pytest_collection_modifyitems(None, [Item("tests/e2e/test_y.py::test_z", fixtures, marks)])


def test_the_session_is_ordered_by_marker_cluster_last_and_tool_modules_whole_just_before():
    items = [
        Item("tests/e2e/test_a.py::test_1", ("local_cluster", "operator"), ("e2e",)),
        Item("tests/test_b.py::test_1"),
        Item("tests/store/test_c.py::test_1"),
        Item("tests/store/test_c.py::test_2", ("minio",), ("tools",)),
        Item("tests/cluster/test_d.py::test_1", ("local_cluster",), ("cluster",)),
        Item("tests/trainer/test_e.py::test_1", (), ("slow",)),
    ]
    conftest.pytest_collection_modifyitems(None, items)
    assert [i.nodeid for i in items] == [
        "tests/test_b.py::test_1",
        "tests/trainer/test_e.py::test_1",
        "tests/store/test_c.py::test_1",
        "tests/store/test_c.py::test_2",
        "tests/e2e/test_a.py::test_1",
        "tests/cluster/test_d.py::test_1",
    ]


def test_the_fast_stage_leaves_out_every_declared_marker():
    """`make test-fast` and CI's fast stage run the unmarked tests only: a marker added to
    pyproject.toml but not to their selection (``kind``: real nodes) would run there."""
    root = Path(__file__).resolve().parents[2]
    declared = {m.split(":")[0] for m in tomllib.loads((root / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]}
    for where in ("Makefile", "hack/test-stages.sh"):
        (selection,) = re.findall(r'-m "(not slow[^"]*)"', (root / where).read_text())
        assert set(re.findall(r"not (\w+)", selection)) == declared, (where, selection, declared)


def test_the_full_stages_two_sessions_run_every_marked_test_exactly_once():
    """CI's full stage runs two pytest sessions side by side (hack/test-stages.sh): for every
    combination of markers, a test the old single selection ("slow or cluster or e2e or
    tools") took runs in exactly one of them, and nothing else runs in either."""
    from itertools import combinations

    from _pytest.mark.expression import Expression  # pytest's own -m parser

    root = Path(__file__).resolve().parents[2]
    text = (root / "hack/test-stages.sh").read_text()
    options = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    declared = sorted(m.split(":")[0] for m in options["markers"])
    (runs,) = re.findall(r'pytest" -m "(\(slow or tools\)[^"]*)"', text)
    (cluster,) = re.findall(r'pytest" -m "(cluster or e2e)"', text)

    def selects(expression: str, markers: set[str]) -> bool:
        return Expression.compile(expression).evaluate(lambda name, **_: name in markers)

    for size in range(len(declared) + 1):
        for chosen in combinations(declared, size):
            markers = set(chosen)
            wanted = selects("slow or cluster or e2e or tools", markers)
            assert selects(runs, markers) + selects(cluster, markers) == int(wanted), (markers, runs, cluster)
