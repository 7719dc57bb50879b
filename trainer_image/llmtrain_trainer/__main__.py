"""``python -m llmtrain_trainer --config FILE``."""

import os
import sys

from .main import main

code = main()
sys.stdout.flush()
sys.stderr.flush()
# After a failed collective, interpreter teardown can block on the dead process group;
# the exit code is already decided and recorded, so leave without teardown.
os._exit(code)
