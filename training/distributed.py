"""Training on several processes with torch.distributed, launched by `torchrun`.

Every process holds the same global batch of row indices (drawn as one process draws them,
from the run's seeded generator, so the batches do not depend on the number of processes),
takes its contiguous share of the rows, and runs the encoder on them under
DistributedDataParallel. The embeddings and anchor logits of all processes are then gathered
with their gradients (torch's functional `all_gather_single`, the pattern of open_clip's
`gather_with_grad`) and every process computes the objective over the *global* batch: every
contrastive term sees every stay of the step as a candidate, exactly as one process would.

Why the gradients equal one process's: each process computes the same global loss L; the
backward of the all-gather sums, over the W processes, the gradient that reaches its own rows,
giving W·∂L/∂z_local; DDP then averages the parameter gradients over the processes, which
divides the W back out. The losses keep their global normalisers (anchors with a positive,
active triplets, informative columns), which a sum of per-process losses could not. The cost:
the B×B similarity matrix is computed on every process, small beside the encoder.

Randomness: what the objective draws for the batch (channel dropout, the second view's noise,
k-random positives, the segment cuts of SSL) is drawn over the global batch from the same
generators on every process, so every process sees the same draws. The encoder's own dropout
is drawn per process (`local_rng`), so ranks get different masks and the shared generators
stay in step; with dropout > 0 a run on W processes therefore draws other masks than a run on
one (as every data-parallel trainer does); with dropout 0 it matches it step for step.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn


@dataclass(frozen=True)
class World:
    """This process's place among the training processes (one process: rank 0 of 1)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def active(self) -> bool:
        return self.size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 writes the run directory, its logs and the resume checkpoint."""
        return self.rank == 0

    @property
    def device(self) -> torch.device:
        """This process's GPU when there is one (one per process), else the CPU."""
        if self.active and torch.cuda.is_available():
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    def rows(self, n: int) -> slice:
        """This process's contiguous share of a global batch of n rows (sizes differ by at
        most one, the larger first, as `torch.tensor_split` cuts)."""
        sizes = share_sizes(n, self.size)
        start = sum(sizes[: self.rank])
        return slice(start, start + sizes[self.rank])


def share_sizes(n: int, world_size: int) -> list[int]:
    """Rows of each process in a global batch of n rows."""
    base, extra = divmod(n, world_size)
    return [base + (r < extra) for r in range(world_size)]


def backend_for(device: torch.device) -> str:
    """NCCL between GPUs, gloo between CPU processes."""
    return "nccl" if device.type == "cuda" else "gloo"


def current_world() -> World:
    """The initialised process group's world, or one process when there is none."""
    if not (dist.is_available() and dist.is_initialized()):
        return World()
    return World(dist.get_rank(), dist.get_world_size(),
                 int(os.environ.get("LOCAL_RANK", dist.get_rank())))


def init_from_env() -> World:
    """Join the process group torchrun describes (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_*);
    a plain process (no WORLD_SIZE, or 1) stays alone."""
    if dist.is_available() and dist.is_initialized():
        return current_world()
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    world = World(int(os.environ["RANK"]), size, local)
    if world.device.type == "cuda":
        torch.cuda.set_device(world.device)
    dist.init_process_group(backend_for(world.device))
    return current_world()


def leave() -> None:
    """Leave the process group, if this process joined one (NCCL warns at exit otherwise)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def gather_rows(local: Tensor, world: World, n: int) -> Tensor:
    """The global batch [n, ...] from every process's rows, keeping gradients.

    Shares may differ by one row: each is padded to the largest before the all-gather (which
    needs equal shapes) and the padding is cut off again, so it carries no gradient.
    """
    if not world.active:
        return local
    from torch.distributed import _functional_collectives as funcol

    sizes = share_sizes(n, world.size)
    pad = sizes[0] - local.shape[0]
    if pad:
        local = torch.cat((local, local.new_zeros(pad, *local.shape[1:])))
    # torch's all-gather with autograd (its backward sums each process's gradient of the rows)
    parts = funcol.all_gather_single(local.contiguous(), 0, dist.group.WORLD)
    return torch.cat([p[:s] for p, s in zip(parts.split(sizes[0]), sizes, strict=True)])


def agree(flag: bool, world: World) -> bool:
    """True on every process when it is True on any (e.g. a stop request seen by one)."""
    if not world.active:
        return flag
    t = torch.tensor([int(flag)], device=world.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def barrier(world: World) -> None:
    if world.active:
        dist.barrier()


@contextlib.contextmanager
def local_rng(world: World, key: tuple[int, ...]) -> Iterator[None]:
    """Draws inside use a generator of this process and `key` (seed, phase, epoch, step: the
    encoder's dropout); the shared generators are restored after, so every process keeps them
    in step."""
    if not world.active:
        yield
        return
    devices = [world.device] if world.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(hash((*key, world.rank)) % (2**63))
        yield


class ViewsForward(nn.Module):
    """The model's forward over several views of this process's rows in one call, so that
    DistributedDataParallel reduces the gradients of a step once, however many views it has.

    `embed` is the name of the model's method to call (`forward` for (z, logits), or
    `pretrain_embedding` for the pre-training embedding).
    """

    def __init__(self, model: nn.Module, embed: str) -> None:
        super().__init__()
        self.model, self.embed = model, embed

    def forward(self, views: list[tuple[Tensor, Tensor]], static: Tensor) -> list[object]:
        fn = getattr(self.model, self.embed)
        return [fn(x, lengths, static) for x, lengths in views]


def data_parallel(model: nn.Module, embed: str, world: World,
                  unused_parameters: bool) -> nn.Module:
    """`ViewsForward` wrapped in DistributedDataParallel (gradients averaged over processes).

    Built per phase, after the phase has frozen what it freezes: DDP reduces the parameters
    that require a gradient when it is built. `unused_parameters`: the phase leaves some
    trainable parameters out of the loss (the anchor head while pre-training).
    """
    from torch.nn.parallel import DistributedDataParallel

    ids = [world.local_rank] if world.device.type == "cuda" else None
    return DistributedDataParallel(ViewsForward(model, embed), device_ids=ids,
                                   find_unused_parameters=unused_parameters)


def manifest_note(world_size: int, batch_size: int) -> str:
    """The manifest's and the model card's line on how the model was trained."""
    if world_size == 1:
        return f"{TRAINING_NOTE} 1 process, batch {batch_size} stays"
    per = share_sizes(batch_size, world_size)
    share = f"{per[0]}" if per[0] == per[-1] else f"{per[-1]}-{per[0]}"
    return (f"{TRAINING_NOTE} {world_size} processes (torch.distributed), global batch "
            f"{batch_size} stays ({share} per process); every contrastive term over the global "
            "batch")


#: The start of the manifest note `manifest_note` writes (the model card shows that note).
TRAINING_NOTE = "training:"
