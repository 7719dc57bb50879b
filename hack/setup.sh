#!/usr/bin/env bash
# Creates .venv/ in the repo root and installs everything the project needs from the
# repo's own files. Idempotent: a stamp with the hash of the inputs skips a redo.
set -euo pipefail
cd "$(dirname "$0")/.."
# PYTHON=/path/to/python picks the interpreter; otherwise the first of these found that is
# >= 3.11 (pyproject's requires-python), the tested 3.11 first.
find_python() {
  local c
  for c in python3.11 python3.12 python3.13 python3; do
    if command -v "$c" >/dev/null && "$c" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
      echo "$c"; return 0
    fi
  done
  echo "setup: no Python >= 3.11 found (tried python3.11, python3.12, python3.13, python3); set PYTHON=" >&2
  return 1
}
PY=${PYTHON:-$(find_python)}
VENV=.venv
stamp="$VENV/.llmtrain-setup-stamp"
want=$(cat pyproject.toml constraints.txt hack/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }
pip install -q -U "pip>=24" "setuptools>=77.0.3" wheel
echo "setup: installing torch (pinned; a CUDA build from PyPI, several GB on a cold cache)"
pip install -q -c constraints.txt torch
echo "setup: installing the project (operator, trainer, dev extras)"
pip install -q -c constraints.txt -e '.[operator,trainer,dev]'
# DeepSpeed has no wheel. Build it against the torch already installed: with build
# isolation pip would pull a second torch into the isolated build env.
echo "setup: installing deepspeed (--no-build-isolation, after torch)"
DS_BUILD_OPS=0 pip install -q -c constraints.txt --no-build-isolation deepspeed
echo "$want" > "$stamp"
echo "setup: done ($VENV)"
