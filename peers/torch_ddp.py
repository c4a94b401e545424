"""Times a training step of an MLP, the peer of `tandem bench ddp` and
`tandem bench train`.

usage: torch_ddp.py WORLD [PORT]   (PORT 0 or none: a free one)

The model is an MLP 784-1024-1024-10 with ReLU between its layers, trained
with cross-entropy and plain SGD (learning rate 0.01) on a fixed random
batch of 64 samples a rank; each step drops the gradients first
(zero_grad(set_to_none=True)). At WORLD 1 the step runs in this process
without DDP and without a process group; at WORLD > 1 each rank is a
process of its own, one thread each, and the model is wrapped in
DistributedDataParallel over gloo on loopback. After ten warm-up steps
fifty are timed on the first rank, which prints one line:

    world=WORLD median_step_s=S samples_per_s=R last_loss=L

(R counts the samples of all ranks).
"""

import sys
import time

import peerlib

SIZES = (784, 1024, 1024, 10)
BATCH = 64
WARMUP = 10
STEPS = 50


def build_model(torch):
    layers = []
    for i in range(len(SIZES) - 1):
        layers.append(torch.nn.Linear(SIZES[i], SIZES[i + 1]))
        if i < len(SIZES) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def train(rank, world, port):
    """Runs the steps on one rank and returns (median step, last loss)."""
    torch = peerlib.setup_torch()
    torch.manual_seed(1234)  # every rank starts from the same weights
    model = build_model(torch)
    if world > 1:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo", init_method=f"tcp://{peerlib.LOCALHOST}:{port}",
                                rank=rank, world_size=world)
        model = DistributedDataParallel(model)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    x = torch.randn(BATCH, SIZES[0], generator=gen)
    y = torch.randint(0, SIZES[-1], (BATCH,), generator=gen)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    times = []
    loss = None
    try:
        for step in range(WARMUP + STEPS):
            t0 = time.perf_counter()
            # Dropping the gradients (PyTorch 2's default) rather than
            # clearing them: the backward pass then writes them fresh, as
            # Tandem's in-place gradients are written, and PyTorch 1.13's
            # step was faster so in 9 of 10 alternating runs here.
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            if step >= WARMUP:
                times.append(time.perf_counter() - t0)
    finally:
        if world > 1:
            torch.distributed.destroy_process_group()
    return peerlib.median(times), loss.item()


def report(world, step, loss):
    print(f"world={world} median_step_s={step:.6f} samples_per_s={BATCH * world / step:.0f} last_loss={loss:.4f}",
          flush=True)


def rank_main(rank, world, port):
    step, loss = train(rank, world, port)
    if rank == 0:
        report(world, step, loss)


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__.strip())
    world = int(argv[1])
    port = int(argv[2]) if len(argv) > 2 else 0
    if world < 1:
        sys.exit(f"torch_ddp.py: WORLD {world}: need at least one rank")
    peerlib.blas_warning()
    if world == 1:
        report(1, *train(0, 1, 0))
        return
    import torch.multiprocessing as mp

    mp.spawn(rank_main, args=(world, port or peerlib.free_port()), nprocs=world, join=True)


if __name__ == "__main__":
    main(sys.argv)
