# Run as `-m pkg.train`, with torch's own error-file decorator.
import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    dist.init_process_group()
    t = torch.ones(4) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    if dist.get_rank() == 0:
        print("module: all_reduce", t.tolist(), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
