"""Times gloo's all-reduce, the peer of `tandem bench allreduce`.

usage: torch_allreduce.py WORLD [PORT [SIZE...]]   (PORT 0 or none: a free one)

WORLD ranks, one process and one thread each, sum float32 tensors over TCP
on loopback. SIZEs are in bytes (4K, 1M, ...; default 4 KiB to 64 MiB by
factors of four). Every size is timed as `tandem bench allreduce` times
it: three warm-up calls, a barrier, then max(5, min(200, 2^24 / elements))
calls back to back, each timed on the first rank. For every size the first
rank prints one line, tab separated: bytes, the median time of one
all-reduce in seconds, and the algorithm and bus bandwidths in GB/s (bus =
algorithm * 2(WORLD-1)/WORLD, as nccl-tests count it).
"""

import sys
import time

import peerlib

DEFAULT_SIZES = [4 << 10 << (2 * i) for i in range(7)]  # 4 KiB .. 16 MiB
DEFAULT_SIZES.append(64 << 20)


def iterations(nbytes):
    """Timed calls for a size: many for small tensors, few for large ones."""
    return max(5, min(200, (1 << 24) // max(nbytes // 4, 1)))


def rank_main(rank, world, port, sizes):
    torch = peerlib.setup_torch()
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://{peerlib.LOCALHOST}:{port}",
                            rank=rank, world_size=world)
    try:
        if rank == 0:
            print(f"# gloo all_reduce, sum of float32, world={world}, one thread a rank, TCP loopback", flush=True)
            print("bytes\tmedian_s\talgbw_GBps\tbusbw_GBps", flush=True)
        for nbytes in sizes:
            x = torch.ones(max(nbytes // 4, 1), dtype=torch.float32)
            for _ in range(3):
                dist.all_reduce(x)
            dist.barrier()
            times = []
            for _ in range(iterations(nbytes)):
                t0 = time.perf_counter()
                dist.all_reduce(x)
                times.append(time.perf_counter() - t0)
            if rank == 0:
                med = peerlib.median(times)
                algbw = nbytes / med / 1e9
                busbw = algbw * 2 * (world - 1) / world
                print(f"{nbytes}\t{med:.7f}\t{algbw:.3f}\t{busbw:.3f}", flush=True)
    finally:
        dist.destroy_process_group()


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__.strip())
    world = int(argv[1])
    port = int(argv[2]) if len(argv) > 2 else 0
    port = port or peerlib.free_port()
    sizes = [peerlib.parse_size(s) for s in argv[3:]] or DEFAULT_SIZES
    if world < 1:
        sys.exit(f"torch_allreduce.py: WORLD {world}: need at least one rank")
    peerlib.blas_warning()
    import torch.multiprocessing as mp

    mp.spawn(rank_main, args=(world, port, sizes), nprocs=world, join=True)


if __name__ == "__main__":
    main(sys.argv)
