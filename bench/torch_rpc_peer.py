"""PyTorch RPC (Debian's python3-torch 1.13, TensorPipe) between two ranks:
rpc_sync p50 of an empty Python function, rpc_async calls/s with 64 in
flight, and remote() + to_here() p50. Start it with two ranks:

  build/tools/corodist-run --nproc 2 -- /usr/bin/python3 bench/torch_rpc_peer.py [--samples S] [--calls C]

Rank 0 measures and prints one JSON object per figure; rank 1 serves.
"""
import argparse
import collections
import json
import os
import statistics
import time

import torch.distributed.rpc as rpc


def noop():
    return None


def one():
    return 1


def p50_us(fn, n):
    for _ in range(max(n // 10, 10)):
        fn()
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        lat.append(time.perf_counter() - t0)
    return statistics.median(lat) * 1e6


def async_calls_per_s(to, calls, depth):
    """A window of `depth` calls in flight: wait for the oldest, issue the next."""
    window = collections.deque(rpc.rpc_async(to, one) for _ in range(depth))
    t0 = time.perf_counter()
    issued = depth
    done = 0
    while window:
        if window.popleft().wait() != 1:
            raise RuntimeError("wrong result")
        done += 1
        if issued < calls:
            window.append(rpc.rpc_async(to, one))
            issued += 1
    return done / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=5000)
    ap.add_argument("--calls", type=int, default=50000)
    ap.add_argument("--depth", type=int, default=64)
    a = ap.parse_args()
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=16, rpc_timeout=120,
                                           init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}")
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=world, rpc_backend_options=opts)
    if rank == 0:
        to = "w1"
        sync = p50_us(lambda: rpc.rpc_sync(to, noop), a.samples)
        print(json.dumps({"op": "rpc_sync_empty", "p50_us": sync}), flush=True)
        calls = async_calls_per_s(to, a.calls, a.depth)
        print(json.dumps({"op": "rpc_async_x64", "ops_per_s": calls, "in_flight": a.depth}), flush=True)
        remote = p50_us(lambda: rpc.remote(to, one).to_here(), max(a.samples // 2, 10))
        print(json.dumps({"op": "remote_to_here", "p50_us": remote}), flush=True)
    rpc.shutdown()  # graceful: waits for both ranks


if __name__ == "__main__":
    main()
