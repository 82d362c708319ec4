"""p3kv for PyTorch: P3 (priority-based parameter propagation) under an unchanged torch training loop.

    model, optimizer = p3kv.torch.distribute(model, torch.optim.SGD(model.parameters(), lr=0.1))

run under ``python -m p3kv.launch -n W -s S -- python train.py`` (which exports torchrun's RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT as well); a script started by torchrun instead passes
servers=S to `distribute` (or calls `init_from_torchrun(servers=S)` first) and starts p3kv's scheduler and servers
itself (p3kv.torch.torchrun). The contract is `distribute`'s docstring; docs/torch.md says what works and what is
refused. Pure Python over p3kv.core (no extension built against torch).
"""

from p3kv.torch.distributed import distribute, worker
from p3kv.torch.torchrun import init_from_torchrun

__all__ = ["distribute", "init_from_torchrun", "worker"]
