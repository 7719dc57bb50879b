"""The trainer warms ``torch._dynamo`` in a thread while the process group starts
(``main.run``). Two threads importing overlapping module graphs can deadlock on import
locks, which Python breaks by handing one of them a half-imported module (a CI run failed
with "module 'sympy' has no attribute 'core'"). The main thread joins the warm-up right
after ``dist.init``, so the overlap is safe only while ``dist.init`` imports nothing: this
checks that, in a fresh interpreter, with a real gloo process group."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

PROBE = """
import json, sys
import torch
from llmtrain_trainer.train import main  # the modules run() imports before the warm-up starts
from llmtrain_trainer.train import dist
from llmtrain_trainer.checkpoint import restore
from llmtrain_trainer.engines import data
from llmtrain_trainer.train import metrics
from llmtrain_trainer.train import loop
before = set(sys.modules)
info = dist.init(30)
print(json.dumps({"world": info.world_size, "new": sorted(set(sys.modules) - before),
                  "dynamo": "torch._dynamo" in sys.modules}))
dist.shutdown()
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_process_group_init_imports_no_module_while_the_warm_up_thread_may_be_importing(tmp_path: Path):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", WORLD_SIZE="1",
               LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["world"] == 1
    # The premise of the test: the warm-up's target was not already imported by the others.
    assert not seen["dynamo"], "torch._dynamo is imported by run()'s own modules; the warm-up thread is moot"
    assert seen["new"] == [], f"dist.init imported modules while the warm-up may be importing: {seen['new']}"
