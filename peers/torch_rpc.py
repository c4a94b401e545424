"""Times PyTorch's TensorPipe RPC, the peer of `tandem bench rpc`.

usage: torch_rpc.py [PORT]   (PORT 0 or none: a free one)

Two workers, each a process of its own on loopback: w0 calls, w1 answers.
The first rank prints

    bytes=B    median_s=S    GBps=G     rpc_sync echo of a float32 tensor of B
                                        bytes (4 B to 16 MiB): the median
                                        round trip, and 2B/S in GB/s
    async_calls_per_s R                 rpc_async echoes of a one-element
                                        tensor, 64 in flight, 20000 in all
    remote_to_here_s S                  the median of rpc.remote(echo of 16
                                        elements) followed by to_here()

measured as `tandem bench rpc` measures them.
"""

import sys
import time

import peerlib

SIZES = [4, 4 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20]
ASYNC_CALLS = 20000
IN_FLIGHT = 64
REMOTES = 200


def echo(x):
    """The callee's function: returns its argument."""
    return x


def echo_iterations(nbytes):
    return max(20, min(1000, (256 << 20) // max(nbytes, 1)))


# Untimed calls of each size first, as many as `tandem bench rpc` makes.
ECHO_WARMUP = 50


def time_echo(rpc, torch, nbytes):
    x = torch.ones(max(nbytes // 4, 1), dtype=torch.float32)
    for _ in range(ECHO_WARMUP):
        rpc.rpc_sync("w1", echo, args=(x,))
    times = []
    for _ in range(echo_iterations(nbytes)):
        t0 = time.perf_counter()
        rpc.rpc_sync("w1", echo, args=(x,))
        times.append(time.perf_counter() - t0)
    return peerlib.median(times)


def time_async(rpc, torch):
    """Calls a second with IN_FLIGHT calls outstanding, ASYNC_CALLS in all."""
    import threading

    x = torch.ones(1, dtype=torch.float32)
    slots = threading.Semaphore(IN_FLIGHT)
    errors = []

    def done(fut):
        try:
            fut.wait()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
        slots.release()

    t0 = time.perf_counter()
    for _ in range(ASYNC_CALLS):
        slots.acquire()
        rpc.rpc_async("w1", echo, args=(x,)).add_done_callback(done)
    for _ in range(IN_FLIGHT):
        slots.acquire()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return ASYNC_CALLS / elapsed


def time_remote(rpc, torch):
    x = torch.ones(16, dtype=torch.float32)
    times = []
    for i in range(-5, REMOTES):
        t0 = time.perf_counter()
        ref = rpc.remote("w1", echo, args=(x,))
        ref.to_here()
        if i >= 0:
            times.append(time.perf_counter() - t0)
    return peerlib.median(times)


def rank_main(rank, port):
    torch = peerlib.setup_torch()
    import torch.distributed.rpc as rpc

    opts = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://{peerlib.LOCALHOST}:{port}")
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=2, rpc_backend_options=opts)
    try:
        if rank == 0:
            print("# TensorPipe rpc_sync echo round trip, float32", flush=True)
            for nbytes in SIZES:
                med = time_echo(rpc, torch, nbytes)
                print(f"bytes={nbytes}\tmedian_s={med:.7f}\tGBps={2 * nbytes / med / 1e9:.3f}", flush=True)
            print(f"async_calls_per_s {time_async(rpc, torch):.1f}", flush=True)
            print(f"remote_to_here_s {time_remote(rpc, torch):.7f}", flush=True)
    finally:
        rpc.shutdown()  # waits for both workers


def main(argv):
    port = int(argv[1]) if len(argv) > 1 else 0
    peerlib.blas_warning()
    import torch.multiprocessing as mp

    mp.spawn(rank_main, args=(port or peerlib.free_port(),), nprocs=2, join=True)


if __name__ == "__main__":
    main(sys.argv)
