"""The local cluster refuses to start where its pods could not see its own files: they
run on the host's tree and mount an emptyDir over /tmp, so a clone under /tmp fails in
every pod far from the cause (the first mount: "special device ... does not exist")."""

from __future__ import annotations

from pathlib import Path

import pytest
from localcluster.cluster import LocalCluster, check_reachable_in_pods


def test_a_bed_under_a_path_the_pods_mount_over_is_refused_naming_both():
    with pytest.raises(RuntimeError) as err:
        check_reachable_in_pods([Path("/work/project"), Path("/tmp/ci/.cache/localcluster")])
    assert "/tmp/ci/.cache/localcluster" in str(err.value) and "emptyDir over /tmp" in str(err.value)


def test_paths_beside_it_are_accepted():
    check_reachable_in_pods([Path("/work/project"), Path("/tmpfs/state"), Path("/check/work/main/.venv/bin")])


def test_up_checks_before_building_anything(monkeypatch):
    built = []
    monkeypatch.setattr("localcluster.cluster.build_tools", lambda *tools: built.append(tools))
    with pytest.raises(RuntimeError, match="outside /tmp"):
        LocalCluster(state=Path("/tmp/elsewhere/localcluster")).up()
    assert built == []
