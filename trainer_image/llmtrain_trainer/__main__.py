"""``python -m llmtrain_trainer --config FILE``."""

import os
import sys

from llmtrain_contract.names import Env

code = None
server = os.environ.get(Env.ZYGOTE, "")
if server and server != "0":
    # The launcher's fork server has torch imported already: this process only stands in
    # for the forked rank (pod/standin.py). None: no server answered, so train here.
    from llmtrain_trainer.pod.standin import run_forked

    code = run_forked(server, sys.argv)
if code is None:
    from llmtrain_trainer.train.main import main

    code = main()
sys.stdout.flush()
sys.stderr.flush()
# After a failed collective, interpreter teardown can block on the dead process group;
# the exit code is already decided and recorded, so leave without teardown.
os._exit(code)
