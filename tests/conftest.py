"""Session-wide fixtures shared by the suites."""

from __future__ import annotations

import os

import pytest
from support import prebuild

_PREBUILD = pytest.StashKey()


def _needs_cluster(item) -> bool:
    return any(part in str(item.fspath) for part in ("/cluster/", "/e2e/"))


def pytest_collection_modifyitems(config, items):
    """Suites that need the local cluster run last, so that the cluster (which stays up
    for the rest of the session once started) does not compete with the timing-sensitive
    torchrun suites for this machine's two cores. Modules with a test that needs MinIO
    come just before them: the Go-built tools, when missing, are built meanwhile (see
    ``support.prebuild``), and a module stays in one piece for its module fixtures."""
    tool_modules = set()
    for item in items:
        if "minio" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.tools)
            tool_modules.add(item.fspath)
    items.sort(key=lambda item: 2 if _needs_cluster(item) else int(item.fspath in tool_modules))


def pytest_collection_finish(session):
    """Starts the tools' build early when a selected test (after `-m`/`-k`) will need them."""
    config = session.config
    kind = os.environ.get("LLMTRAIN_E2E_BED") == "kind"  # kind brings its own Kubernetes
    if not config.option.collectonly and not kind and any(_needs_cluster(i) or i.get_closest_marker("tools") for i in session.items):
        config.stash[_PREBUILD] = prebuild.start()


def pytest_unconfigure(config):
    prebuild.stop(config.stash.get(_PREBUILD, None))


@pytest.fixture(scope="session")
def local_cluster():
    """The local Kubernetes test bed (hack/localcluster), up for the whole session.

    Needs root (network namespaces, bind mounts, cgroups). ``.ci/run`` runs as root; on a
    machine where that is impossible the suites marked ``cluster``/``e2e`` fail loudly
    rather than skip.

    With ``LLMTRAIN_E2E_BED=kind`` (``hack/kind/e2e.sh`` sets it, with the cluster it
    created), the same tests drive a kind cluster through ``hack/kindbed.py`` instead.
    """
    if os.environ.get("LLMTRAIN_E2E_BED") == "kind":
        from kindbed import KindCluster

        kind = KindCluster.from_env().up()
        try:
            yield kind
        finally:
            kind.down()
        return

    from localcluster.cluster import LocalCluster

    if os.geteuid() != 0:
        pytest.fail("the local cluster needs root (network namespaces, mounts, cgroups)")
    bed = LocalCluster.default().up()
    try:
        yield bed
    finally:
        bed.down()


@pytest.fixture(scope="session")
def minio(tmp_path_factory):
    """A real S3 server (MinIO built from its Go module, hack/s3server.py) on loopback,
    with the bucket ``ckpt``; up for the session once a test asks for it."""
    from s3server import MinioServer

    with MinioServer(tmp_path_factory.mktemp("minio")) as server:
        server.make_bucket("ckpt")
        yield server
