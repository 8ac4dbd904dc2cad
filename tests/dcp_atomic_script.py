"""Run by tests/test_sharding.py under torchrun (2 processes): a sharded checkpoint save (torch.distributed.checkpoint)
that fails in process 1 while writing its shards leaves nothing committed and the previous checkpoint intact.

argv: root. Writes result_rank<r>.json: the error each process got, and (process 0) what the folder holds after."""
import errno
import json
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)
import torch.distributed as td  # noqa: E402
from torch.distributed.checkpoint.filesystem import FileSystemWriter  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import Shard, distribute_tensor  # noqa: E402

from comlrl_nb.checkpoints import CheckpointManager, _read_checkpoint, read_shards  # noqa: E402
from comlrl_nb.distributed import DistContext  # noqa: E402

root = Path(sys.argv[1])
D = DistContext()
mesh = init_device_mesh("cpu", (D.world,))
shards = lambda x: {"team": {"w": distribute_tensor(x, mesh, [Shard(0)])}}
cm = CheckpointManager(root, algo="toy")
cm.save(1, {"n": 1}, None, shards(torch.arange(8.0)), D)              # a good one first

if D.rank == 1:                                                         # process 1's disk is full half-way
    def full(self, plan, planner):
        raise OSError(errno.ENOSPC, "No space left on device")
    FileSystemWriter.write_data = full
err = None
try: cm.save(2, {"n": 2}, None, shards(torch.ones(8)), D)
except Exception as e: err = f"{type(e).__name__}: {e}"
D.barrier()
out = {"error": err}
_, state = _read_checkpoint(cm.latest())                                # every process reads it (collectives)
into = shards(torch.zeros(8))
read_shards(state["sharded"], into)
out["latest"] = [cm.latest().name, state["n"], into["team"]["w"].full_tensor().tolist()]
if D.rank == 0: out["folder"] = sorted(p.name for p in root.iterdir())
(root.parent / f"result_rank{D.rank}.json").write_text(json.dumps(out))
D.barrier()
td.destroy_process_group()
