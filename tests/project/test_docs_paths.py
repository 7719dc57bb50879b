"""The docs name only what exists: every repository path, source path and Python module
written in README.md and docs/*.md must be there.

Checked, in inline code (backticks) and in the lines of fenced blocks that are not shell
output (a block with ``$ `` prompts: only the prompted lines):

- repo-relative paths (``operator/...``, ``tests/...``, ``docs/...``, ...), optionally with
  ``::test_name``, which must then be a ``def test_name`` in that file; in prose, outside
  backticks, only such a path that ends in a file extension (``docs/operator.md``);
- package-relative source paths (``planner/accounting.py``, ``k8s/``): a token that ends in
  ``.py`` or ``/``, contains a ``/`` and is not repo-relative must be the end of an existing
  path under one of the source trees (``trainer/x.py`` is read as ``llmtrain_trainer/x.py``);
- dotted modules (``llmtrain_operator.metrics``, ``llmtrain_contract.names.TIER_REASONS``): a module
  or package file under operator/, trainer_image/ or common/, or a top-level name defined in
  one (found by text, so torch is never imported);
- a test module by its file name alone (``test_hangs.py``, ``test_fault_matrix.py::test_01``):
  a file of that name under tests/, defining a test whose name starts with the one given;
- a test by its name alone (``test_10``, ``test_refused_s3_credentials...``): the start of
  some test's name under tests/;
- and the target of every Markdown link, relative to its doc.

Placeholders and globs (``<``, ``*``, ``{``), absolute, home, ``$VAR`` and dot-folder paths
(``.venv/``, ``.cache/``) and URLs are not checked, nor ``operator/__init__.py`` (named
as the file never to create), nor what a run writes (``RUN_OUTPUTS``, ``LAYOUT``).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from support.specs import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

REPO_ROOTS = ("operator/", "trainer_image/", "common/", "hack/", "bench/", "tests/", "charts/", "crds/",
              "examples/", "docs/", ".ci/", ".github/")
SOURCE_TREES = ("operator", "trainer_image", "common", "hack", "bench", "tests")
MODULE_ROOTS = ("operator", "trainer_image", "common")
PACKAGES = ("llmtrain_operator", "llmtrain_trainer", "llmtrain_contract", "llmtrain_store")
NEVER_CHECKED = {"operator/__init__.py"}  # docs/development.md: the file never to create
# What a run writes, not the repository: the run dir of `make demo`, and folders inside a
# checkpoint or a run dir (docs/trainer.md).
RUN_OUTPUTS = ("runs/",)
LAYOUT = {"ds/", "attempt-N/superseded/"}

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")
PROSE_FILE = re.compile(r"\.(py|md|sh|yaml|yml|json|png|toml|txt|tpl)$")
STRIP = "\"'`,;()[]|"
PLACEHOLDER = re.compile(r"[<>*{}?]")


def _words(text: str, first_line: int):
    """(line number, word) of each word of ``text``, which starts at line ``first_line``."""
    for match in re.finditer(r"[^\s=]+", text):
        word = match.group()
        while word != (stripped := word.strip(STRIP).rstrip(".:")):
            word = stripped
        if word:
            yield first_line + text.count("\n", 0, match.start()), word


def _inline(paragraph: str, first_line: int):
    """References in a paragraph's text: inline code may span lines, so it is read whole."""
    def line_of(offset: int) -> int:
        return first_line + paragraph.count("\n", 0, offset)

    for match in INLINE.finditer(paragraph):
        for number, word in _words(match.group(2), line_of(match.start(2))):
            yield number, word, "code"
    prose = INLINE.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), paragraph)  # keeps the offsets
    for match in LINK.finditer(prose):
        yield line_of(match.start(1)), match.group(1), "link"
    for number, word in _words(LINK.sub(lambda m: "]" + " " * (len(m.group()) - 1), prose), first_line):
        yield number, word, "prose"


def _references(doc: Path):
    """(line number, token, where): where is "code" (backticks or a fenced line), "prose",
    or "link" (a Markdown link's target, relative to the doc's folder)."""
    fenced = False
    block: list[tuple[int, str]] = []
    paragraph: list[tuple[int, str]] = []
    lines = doc.read_text().splitlines()
    for number, line in enumerate([*lines, ""], 1):
        if not fenced and (not line.strip() or FENCE.match(line)) and paragraph:
            yield from _inline("\n".join(text for _, text in paragraph), paragraph[0][0])
            paragraph = []
        if FENCE.match(line):
            if fenced:
                prompted = any(text.lstrip().startswith("$ ") for _, text in block)
                for n, text in block:
                    if prompted:  # a transcript: the output lines are not ours to check
                        if not text.lstrip().startswith("$ "):
                            continue
                        text = text.lstrip()[2:]
                    for _, word in _words(text, n):
                        yield n, word, "code"
                block = []
            fenced = not fenced
        elif fenced:
            block.append((number, line))
        elif line.strip():
            paragraph.append((number, line))


@cache
def _source_paths() -> tuple[str, ...]:
    """Every file and folder under the source trees, as repo-relative posix paths (folders
    with a trailing slash)."""
    found = []
    for tree in SOURCE_TREES:
        for path in (ROOT / tree).rglob("*"):
            if "__pycache__" in path.parts or ".egg-info" in str(path):
                continue
            rel = path.relative_to(ROOT).as_posix()
            found.append(rel + "/" if path.is_dir() else rel)
    return tuple(found)


def _defines(path: Path, name: str, top_level: bool) -> bool:
    indent = "" if top_level else r"[ \t]*"
    name = re.escape(name)
    pattern = rf"^{indent}(?:(?:async[ \t]+)?def[ \t]+{name}\b|class[ \t]+{name}\b|{name}[ \t]*[:=])"
    return re.search(pattern, path.read_text(), re.M) is not None


def _repo_path_missing(token: str) -> bool:
    path, _, test = token.partition("::")
    path = path.split("#")[0]
    if path in NEVER_CHECKED:
        return False
    target = ROOT / path
    if not target.exists() or (path.endswith("/") and not target.is_dir()):
        return True
    if test:
        name = test.split("[")[0].split("::")[-1]
        return not (target.is_file() and _defines(target, name, top_level=False))
    return False


def _package_path_missing(token: str) -> bool:
    for rel in _source_paths():
        if rel.endswith(token) and (len(rel) == len(token) or rel[-len(token) - 1] in "/_"):
            return False
    return True


def _module_file(parts: list[str]) -> Path | None:
    for root in MODULE_ROOTS:
        base = ROOT / root / Path(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def _module_missing(token: str) -> bool:
    module, _, attr = token.partition(":")  # an entry point: package.module:function
    parts = module.split(".")
    names = [*parts, *([attr] if attr else [])]
    for cut in range(len(parts), 0, -1):
        found = _module_file(parts[:cut])
        if found is None:
            continue
        rest = names[cut:]
        if not rest:
            return False
        return not (_defines(found, rest[0], top_level=True)
                    and all(_defines(found, name, top_level=False) for name in rest[1:]))
    return True


def _skipped(token: str) -> bool:
    if PLACEHOLDER.search(token) or "://" in token or token.startswith(RUN_OUTPUTS) or token in LAYOUT:
        return True
    return token.startswith(("/", "~", "$", ".")) and not token.startswith((".ci/", ".github/"))


def _link_missing(doc: Path, target: str) -> bool:
    if re.match(r"[a-z]+:", target) or target.startswith("#"):
        return False  # a URL, a mail address, an anchor in the same doc
    return not (doc.parent / target.split("#")[0]).exists()


def _missing(token: str, where: str) -> bool:
    if _skipped(token):
        return False
    if token.startswith(REPO_ROOTS):
        if where == "prose" and not PROSE_FILE.search(token):
            return False
        return _repo_path_missing(token)
    if where == "prose":
        return False
    if token.startswith(tuple(p + "." for p in PACKAGES)) and re.fullmatch(r"[\w.]+(:\w+)?", token):
        return _module_missing(token)
    if "/" in token and token.endswith((".py", "/")) and re.fullmatch(r"[\w./-]+", token):
        return _package_path_missing(token)
    if re.fullmatch(r"test_\w+\.py(\[[^]]*\])?(::\w+)?", token):
        return _test_file_missing(token)
    if re.fullmatch(r"test_\w+", token):
        return not any(name.startswith(token) for name in _test_names())
    return False


@cache
def _test_names() -> frozenset[str]:
    names = set()
    for rel in _source_paths():
        if rel.startswith("tests/") and rel.endswith(".py"):
            names.update(re.findall(r"^[ \t]*(?:async[ \t]+)?def[ \t]+(test_\w+)", (ROOT / rel).read_text(), re.M))
    return frozenset(names)


def _test_file_missing(token: str) -> bool:
    """A test module named by its file name alone (``test_hangs.py``, the fault matrix's
    ``test_fault_matrix.py::test_01``): some file of that name under tests/ that defines a
    test whose name starts with the one given (the docs shorten the long names)."""
    name, _, test = token.partition("::")
    name = name.split("[")[0]
    files = [ROOT / rel for rel in _source_paths() if rel.startswith("tests/") and rel.rsplit("/", 1)[-1] == name]
    return not any(not test or re.search(rf"^[ \t]*(?:async[ \t]+)?def[ \t]+{re.escape(test)}", f.read_text(), re.M)
                   for f in files)


def missing_references() -> list[str]:
    found = []
    for doc in DOCS:
        for number, token, where in _references(doc):
            if _link_missing(doc, token) if where == "link" else _missing(token, where):
                found.append(f"{doc.relative_to(ROOT).as_posix()}:{number}: {token}")
    return found


def test_every_path_and_module_the_docs_name_exists():
    missing = missing_references()
    assert not missing, "the docs name paths or modules that do not exist:\n" + "\n".join(missing)


def test_the_checker_tells_stale_from_existing():
    assert not _missing("planner/accounting.py", "code") and _missing("planner/failures.py", "code")
    assert not _missing("hack/kind/e2e.sh", "code") and _missing("hack/kind/e3e.sh", "code")
    assert not _missing("tests/project/test_docs_paths.py::test_the_checker_tells_stale_from_existing", "code")
    assert _missing("tests/project/test_docs_paths.py::test_nothing_of_the_kind", "code")
    assert not _missing("llmtrain_contract.names", "code") and _missing("llmtrain_contract.nothing", "code")
    assert not _missing("llmtrain_operator.planner.plan.plan", "code")
    assert _missing("llmtrain_operator.planner.plan.no_such_name", "code")
    assert not _missing("operator/__init__.py", "code") and not _missing("planner/policies/*", "code")
    assert not _missing("k8s/", "code") and _missing("k9s/", "code")
    assert not _missing("operator/trainer", "prose")  # a prose word is a path only with a file extension
    assert not _missing("test_docs_paths.py::test_the_checker", "code") and _missing("test_docs_paths.py::test_x", "code")
    assert _missing("test_no_such_module.py", "code")
    assert not _missing("test_the_checker", "code") and _missing("test_no_such_test", "code")
