# Reports each step through the optional contract (docs/custom-scripts.md): one write.
import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
steps = int(os.environ.get("STEPS", "40"))
for step in range(1, steps + 1):
    total = torch.ones(1)
    dist.all_reduce(total)
    time.sleep(0.25)
    if dist.get_rank() == 0:
        with open(os.environ["LLMTRAIN_PROGRESS_FILE"], "w") as progress:
            progress.write(f"{step}\n")
dist.destroy_process_group()
