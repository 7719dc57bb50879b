"""What a user copies from one page to another has one name: the S3 credentials Secret
that the examples reference, that the docs tell them to create, and that example 02
defines, is the same Secret everywhere."""

from __future__ import annotations

import re

import yaml
from support.specs import ROOT


def _example_secret_names() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            if doc.get("kind") == "Secret":
                found.setdefault(path.name, set()).add(doc["metadata"]["name"])
            s3 = ((doc.get("spec") or {}).get("checkpoint") or {}).get("s3") or {}
            if "credentialsSecret" in s3:
                found.setdefault(path.name, set()).add(s3["credentialsSecret"]["name"])
    return found


def test_the_s3_credentials_secret_has_one_name_in_the_examples_and_the_docs():
    names = _example_secret_names()
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for name in re.findall(r"kubectl create secret generic ([a-z0-9.-]+)", doc.read_text()):
            names.setdefault(doc.name, set()).add(name)
    assert len(names) >= 3, f"the examples and docs that name the Secret: {names}"
    assert len(set().union(*names.values())) == 1, names
