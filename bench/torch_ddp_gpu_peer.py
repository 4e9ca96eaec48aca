"""PyTorch's DistributedDataParallel on CUDA, the peer of the `gpu` suite of
corodist-bench (its reducer_<backend>_r<n> cases).

The model is the suite's: a chain of 25 nn.Linear(1024, 1024) (100 MiB of
float32 parameters) on cuda:0, each followed by a `delay` layer whose backward
waits until the layer's end on a fixed timeline that starts with the backward
(--layer-ms per layer: the host thread waits while the GPU computes, as the
suite's simulated backward does). DDP with bucket_cap_mb=25 (the first bucket
1 MiB, DDP's default), gradients copied into buckets, on `--backend nccl`
(world size 1) or `gloo` (world size 2, both ranks on cuda:0: ProcessGroupGloo
stages CUDA tensors through host memory). Timed after a barrier, from
loss.backward() to torch.cuda.synchronize() after it: `p50_us` the DDP step,
`compute_us` the same backward without DDP, `nocompute_us` the DDP step with
no delay (only the real, small backward kernels). Rank 0 prints one JSON line:
{"case": "reducer_<backend>_r<n>", "p50_us": ..., "compute_us": ..., "nocompute_us": ...}

--probe prints {"case": "probe", "torch": ..., "device": ...} when torch has
CUDA here, else {"case": "probe", "unavailable": "<why>"}.

Usage: /usr/bin/python3 bench/torch_ddp_gpu_peer.py --backend nccl|gloo --ranks N [--iters K] [--warmup W] [--layer-ms MS]
       /usr/bin/python3 bench/torch_ddp_gpu_peer.py --probe
"""
import argparse
import datetime
import json
import multiprocessing as mp
import os
import time

import torch

HOST = "127.0.0.1"
TIMEOUT = datetime.timedelta(minutes=10)
LAYERS, WIDTH = 25, 1024


def percentile(samples, q):
    s = sorted(samples)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (pos - lo) * (s[hi] - s[lo])


def rank_main(port, rank, world, args, answers):
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    class Delay(torch.autograd.Function):
        seconds = 0.002
        active = True
        start = None  # the backward's start (set by its first delay layer)
        done = 0

        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            if Delay.active:
                now = time.perf_counter()
                if Delay.start is None:
                    Delay.start, Delay.done = now, 0
                Delay.done += 1
                time.sleep(max(0.0, Delay.start + Delay.done * Delay.seconds - now))
            return g

    class DelayLayer(nn.Module):
        def forward(self, x):
            return Delay.apply(x)

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.cuda.set_device(0)
    store = dist.TCPStore(HOST, port, world, False, TIMEOUT)
    dist.init_process_group(args.backend, store=store, rank=rank, world_size=world, timeout=TIMEOUT)
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), DelayLayer()]
    model = nn.Sequential(*layers).cuda(0)
    ddp = DDP(model, device_ids=[0], bucket_cap_mb=25)
    x = torch.randn(1, WIDTH, device="cuda:0")
    Delay.seconds = args.layer_ms / 1000.0

    def timed_backward(module, active):
        module.zero_grad(set_to_none=False)
        out = module(x).sum()
        torch.cuda.synchronize()
        dist.barrier()
        Delay.active, Delay.start = active, None
        t0 = time.perf_counter()
        out.backward()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    steps, alone, nocompute = [], [], []
    for i in range(args.warmup + args.iters):
        a = timed_backward(model, True)
        n = timed_backward(ddp, False)
        s = timed_backward(ddp, True)
        if i >= args.warmup:
            alone.append(a)
            nocompute.append(n)
            steps.append(s)
    if rank == 0:
        answers.put(json.dumps({"case": f"reducer_{args.backend}_r{world}", "p50_us": percentile(steps, 0.5) * 1e6,
                                "compute_us": percentile(alone, 0.5) * 1e6,
                                "nocompute_us": percentile(nocompute, 0.5) * 1e6}))
    dist.barrier()
    dist.destroy_process_group()


def probe():
    if not torch.cuda.is_available():
        why = f"torch {torch.__version__} has no usable CUDA (torch.cuda.is_available() is False)"
        print(json.dumps({"case": "probe", "unavailable": why}), flush=True)
        return
    import torch.distributed as dist
    if not dist.is_nccl_available():
        print(json.dumps({"case": "probe", "unavailable": f"torch {torch.__version__} has no NCCL"}), flush=True)
        return
    print(json.dumps({"case": "probe", "torch": torch.__version__, "device": torch.cuda.get_device_name(0)}),
          flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", action="store_true")
    ap.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--layer-ms", type=float, default=2.0)
    a = ap.parse_args()
    if a.probe:
        probe()
        return
    import torch.distributed as dist
    master = dist.TCPStore(HOST, 0, a.ranks, True, TIMEOUT, wait_for_workers=False)
    ctx = mp.get_context("spawn")  # CUDA in children: never fork
    answers = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(master.port, r, a.ranks, a, answers)) for r in range(a.ranks)]
    for p in procs:
        p.start()
    import queue
    while True:  # rank 0's line, unless a rank fails first
        try:
            print(answers.get(timeout=2), flush=True)
            break
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:
                for p in procs:
                    p.kill()
                raise SystemExit(f"ranks failed: {dead}")
    for p in procs:
        p.join(120)
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    if bad:
        raise SystemExit(f"ranks failed: {bad}")


if __name__ == "__main__":
    main()
