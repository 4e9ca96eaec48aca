"""PyTorch's DistributedDataParallel on gloo (Debian's python3-torch 1.13), the
peer of the `reducer` suite of corodist-bench.

The model is the suite's shape: a chain of 25 nn.Linear(1024, 1024) (100 MiB of
float32 parameters), each followed by a `delay` layer whose backward simulates
the rest of a backward pass: it waits (`wait`: a GPU computes, the host
thread waits until the layer's end on a fixed timeline that starts with the
backward) or spins on the CPU (`busy`) for --layer-ms. DDP with its
defaults (25 MiB buckets, the first 1 MiB, gradients copied into buckets).
A step is timed from loss.backward() to its return (DDP's allreduces end
inside it), after a barrier; forward passes are not timed. Rank 0 prints one
JSON line per mode: {"case": "step_rN_<mode>", "p50_us": ..., "compute_us": ...}
(compute_us: the same backward without DDP).

Usage: /usr/bin/python3 bench/torch_ddp_peer.py --ranks N [--iters K] [--warmup W] [--layer-ms MS]
"""
import argparse
import datetime
import json
import multiprocessing as mp
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

HOST = "127.0.0.1"
TIMEOUT = datetime.timedelta(minutes=30)
LAYERS, WIDTH = 25, 1024


class Delay(torch.autograd.Function):
    """wait: each delay layer's backward waits for its end on a fixed timeline
    that starts with the backward (as a GPU's kernels finish on their own
    schedule; corodist's reducer case does the same); busy: spins its time."""
    mode = "wait"
    seconds = 0.008
    start = None  # the backward's start (set by its first delay layer)
    done = 0

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        if Delay.mode == "wait":
            now = time.perf_counter()
            if Delay.start is None:
                Delay.start, Delay.done = now, 0
            Delay.done += 1
            time.sleep(max(0.0, Delay.start + Delay.done * Delay.seconds - now))
        else:
            end = time.perf_counter() + Delay.seconds
            while time.perf_counter() < end:
                pass
        return g


class DelayLayer(nn.Module):
    def forward(self, x):
        return Delay.apply(x)


def percentile(samples, q):
    s = sorted(samples)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (pos - lo) * (s[hi] - s[lo])


def rank_main(port, rank, world, args, answers):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    store = dist.TCPStore(HOST, port, world, False, TIMEOUT)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=TIMEOUT)
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), DelayLayer()]
    model = nn.Sequential(*layers)
    ddp = DDP(model, bucket_cap_mb=25)
    x = torch.randn(1, WIDTH)
    Delay.seconds = args.layer_ms / 1000.0
    for mode in ("wait", "busy"):
        Delay.mode = mode
        steps, alone = [], []
        for i in range(args.warmup + args.iters):
            # The backward alone (no DDP), then a DDP step, each after a barrier.
            model.zero_grad(set_to_none=False)
            out = model(x).sum()
            dist.barrier()
            Delay.start = None
            t0 = time.perf_counter()
            out.backward()
            t1 = time.perf_counter()
            ddp.zero_grad(set_to_none=False)
            out = ddp(x).sum()
            dist.barrier()
            Delay.start = None
            t2 = time.perf_counter()
            out.backward()
            t3 = time.perf_counter()
            if i >= args.warmup:
                alone.append(t1 - t0)
                steps.append(t3 - t2)
        if rank == 0:
            answers.put(json.dumps({"case": f"step_r{world}_{mode}", "p50_us": percentile(steps, 0.5) * 1e6,
                                    "compute_us": percentile(alone, 0.5) * 1e6}))
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--layer-ms", type=float, default=8.0)
    a = ap.parse_args()
    master = dist.TCPStore(HOST, 0, a.ranks, True, TIMEOUT, wait_for_workers=False)
    answers = mp.Queue()
    procs = [mp.Process(target=rank_main, args=(master.port, r, a.ranks, a, answers)) for r in range(a.ranks)]
    for p in procs:
        p.start()
    for _ in range(2):
        print(answers.get(), flush=True)
    for p in procs:
        p.join(120)
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    if bad:
        raise SystemExit(f"ranks failed: {bad}")


if __name__ == "__main__":
    main()
