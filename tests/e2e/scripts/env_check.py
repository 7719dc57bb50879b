# Reads torchrun's variables itself and rendezvouses through MASTER_ADDR/MASTER_PORT.
import os
import sys
import torch.distributed as dist
for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
    assert os.environ.get(name), f"torchrun did not set {name}"
dist.init_process_group(init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                        rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
names = [None] * dist.get_world_size()
dist.all_gather_object(names, os.uname().nodename)
if dist.get_rank() == 0:
    print("env: ranks on", sorted(names), "argv", sys.argv[1:], flush=True)
dist.barrier()
dist.destroy_process_group()
