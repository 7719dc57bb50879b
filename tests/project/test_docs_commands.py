"""The docs' shell commands as a shell reads them: a `helm --set` key with an escaped dot
(`nodeSelector.llmtrain\\.io/pool=system`) must reach helm with its backslash. Unquoted,
the shell drops it and helm nests the key (`got object, want string`): docs/install.md's
kind walk-through failed that way, word for word."""

from __future__ import annotations

import re
import shlex

from support.specs import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _commands(text: str) -> list[str]:
    """Each command of the ```bash blocks, continuation lines joined."""
    out: list[str] = []
    for block in re.findall(r"```(?:bash|sh|console)\n(.*?)```", text, flags=re.S):
        pending = ""
        for line in block.splitlines():
            pending += line
            if pending.endswith("\\"):
                pending = pending[:-1] + " "
                continue
            if pending.strip():
                out.append(pending)
            pending = ""
    return out


def test_every_escaped_dot_in_a_helm_set_reaches_helm():
    wrong = []
    for doc in DOCS:
        for command in _commands(doc.read_text()):
            if "--set" not in command or "\\." not in command:
                continue
            words = shlex.split(command, comments=True)
            keys = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--set"]
            if not any("\\." in key for key in keys):
                wrong.append(f"{doc.relative_to(ROOT)}: {command.strip()}")
    assert not wrong, "quote the --set value, or the shell eats its backslash: " + "; ".join(wrong)


def test_the_check_sees_the_unquoted_form():
    assert _commands("```bash\nhelm install x c \\\n  --set a.b\\.io/c=d\n```\n") == ["helm install x c    --set a.b\\.io/c=d"]
    words = shlex.split("helm install x c --set a.b\\.io/c=d")
    assert words[-1] == "a.b.io/c=d", "unquoted, the backslash is gone"
