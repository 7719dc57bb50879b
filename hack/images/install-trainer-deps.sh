#!/bin/sh
# The trainer images' dependencies, in the order that works (docs/install.md, "Images"):
# torch first, from TORCH_INDEX_URL if given (the CPU build's index), else PyPI's default;
# then the trainer extra's requirements (hack/images/requirements.py); then DeepSpeed
# against that torch without build isolation (it has no wheel: an isolated build would
# pull a second torch), its ops left to the JIT at first use (DS_BUILD_OPS=0).
#   sh install-trainer-deps.sh [TORCH_INDEX_URL]
set -eu
if [ -n "${1:-}" ]; then
  pip install -c constraints.txt --index-url "$1" torch
else
  pip install -c constraints.txt torch
fi
python requirements.py trainer > requirements.txt
pip install -c constraints.txt -r requirements.txt
DS_BUILD_OPS=0 pip install -c constraints.txt --no-build-isolation deepspeed
rm requirements.txt
