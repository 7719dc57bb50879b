#!/usr/bin/env bash
# The wheels a GPU machine without network needs for hack/gpu/check.sh, made here into
# .gpu-wheels/ (ignored by git): pydantic and its core for that machine's Python, hjson
# (DeepSpeed's), and DeepSpeed itself built as a pure-Python wheel (no op compiled: the
# trainer never uses one, docs/trainer.md "DeepSpeed without compiled ops").
#
#   bash hack/gpu/wheels.sh [PYTHON_VERSION]     # default 3.12 (the device's python3)
set -euo pipefail
cd "$(dirname "$0")/../.."
PYV=${1:-3.12}
PY=.venv/bin/python
DEST=.gpu-wheels
rm -rf "$DEST" && mkdir -p "$DEST"
plat=()
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_28_x86_64 manylinux_2_34_x86_64; do plat+=(--platform "$p"); done
core=$($PY -m pip show pydantic-core | sed -n 's/^Version: //p')
pyd=$($PY -m pip show pydantic | sed -n 's/^Version: //p')
$PY -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp "${plat[@]}" -d "$DEST" \
    "pydantic==$pyd" "pydantic-core==$core" annotated-types typing-inspection hjson
ds=$(sed -n 's/^deepspeed==//p' constraints.txt)
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
$PY -m pip download -q --no-deps --no-binary=:all: -d "$src" "deepspeed==$ds"
DS_BUILD_OPS=0 $PY -m pip wheel -q --no-deps --no-build-isolation -w "$DEST" "$src"/deepspeed-*.tar.gz
ls -la "$DEST"
