# A plain DDP loop: torchrun's env contract only, the default backend, nothing else.
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group()
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(30):
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(step * world + rank))
    loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
weights = [p.detach().clone() for p in model.parameters()]
for w in weights:
    gathered = [torch.empty_like(w) for _ in range(world)]
    dist.all_gather(gathered, w)
    assert all(torch.equal(g, w) for g in gathered), "replicas diverged"
if rank == 0:
    print(f"ddp: {world} ranks agree after 30 steps, loss {loss.item():.4f}", flush=True)
dist.destroy_process_group()
