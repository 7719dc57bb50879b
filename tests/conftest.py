"""Session-wide fixtures shared by the suites."""

from __future__ import annotations

import os

import pytest
from support import prebuild

_PREBUILD = pytest.StashKey()


LAST = ("cluster", "e2e", "kind")
"""The tiers that need the local cluster (or the kind bed)."""
REQUIRED = {
    "minio": ("tools",),  # MinIO, built from its Go module by `make test`
    "local_cluster": LAST,
    "operator": ("e2e", "kind"),  # tests/e2e/conftest.py: the operator installed with helm
    "real_nodes": ("kind",),  # the same, where the nodes are real (hack/kind/e2e.sh)
}
"""A test that uses one of these fixtures (itself or through another fixture) must carry
one of its markers: markers are declared by each test module (``pytestmark``) or test,
never added here, so this check keeps `-m` selections and the session's order true."""


def _marked(item, *names: str) -> bool:
    return any(item.get_closest_marker(name) for name in names)


def _check_markers(items) -> None:
    wrong = []
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        for fixture, markers in REQUIRED.items():
            if fixture in fixtures and not _marked(item, *markers):
                wrong.append(f"  {item.nodeid}: uses the {fixture!r} fixture but is not marked "
                             + " or ".join(markers))
    if wrong:
        raise pytest.UsageError(
            "tests that need a tool or the local cluster must declare its marker "
            "(`pytestmark = pytest.mark.NAME` in the module, or `@pytest.mark.NAME` on the test; "
            "docs/development.md, \"Test tiers and markers\"):\n" + "\n".join(wrong))


def pytest_collection_modifyitems(config, items):
    """Suites that need the local cluster (marked ``cluster`` or ``e2e``) run last in a
    session that has both, so that the cluster (which stays up for the rest of the session
    once started) is not left idling beside the torchrun suites. (`make test` runs the two
    in separate sessions side by side: hack/test-stages.sh.) Modules with a
    test marked ``tools`` come just before them: the Go-built tools, when missing, are
    built meanwhile (see ``support.prebuild``), and a module stays in one piece for its
    module fixtures. This hook only orders: it never adds a marker."""
    _check_markers(items)
    tool_modules = {item.path for item in items if _marked(item, "tools")}
    items.sort(key=lambda item: 2 if _marked(item, *LAST) else int(item.path in tool_modules))


def pytest_collection_finish(session):
    """Starts the tools' build early when a selected test (after `-m`/`-k`) will need them."""
    config = session.config
    kind = os.environ.get("LLMTRAIN_E2E_BED") == "kind"  # kind brings its own Kubernetes
    if not config.option.collectonly and not kind and any(_marked(i, *LAST, "tools") for i in session.items):
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
