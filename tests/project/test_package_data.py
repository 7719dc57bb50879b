"""Every data file inside a package ships in the wheel the images install: a file that
package-data misses works from the checkout and is absent in the image."""

from __future__ import annotations

import fnmatch
import subprocess
import tomllib

from support.specs import ROOT

PACKAGE_ROOTS = {"llmtrain_operator": "operator", "llmtrain_trainer": "trainer_image", "llmtrain_contract": "common",
                 "llmtrain_store": "common"}


def test_every_tracked_data_file_in_a_package_is_package_data():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    files = subprocess.run(["git", "ls-files", *PACKAGE_ROOTS.values()], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    missing = []
    for path in files:
        if path.endswith((".py", ".pyi")) or "/" not in path:
            continue
        folder, _, rest = path.partition("/")
        package, _, inner = rest.partition("/")
        if PACKAGE_ROOTS.get(package) != folder or not inner:
            continue
        if not any(fnmatch.fnmatch(inner, glob) for glob in declared.get(package, [])):
            missing.append(path)
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"
    assert any(p.endswith("api/k8s/core-v1.json") for p in files), "the check sees the core-type schemas"
