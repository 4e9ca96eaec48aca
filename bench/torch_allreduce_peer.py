"""PyTorch's gloo allreduce (Debian's python3-torch 1.13), the peer of the
`allreduce` suite of corodist-bench, which drives it through stdin/stdout so
that it takes turns with corodist's ranks on the same machine.

Ranks are processes on one PyTorch TCPStore master, as init_process_group("gloo")
makes them. Protocol (one line each way):
    READY                  printed once every rank has joined
    RUN <bytes> <iters> [<warmup> [...]]
                           every rank times <iters> dist.all_reduce of a float32
                           tensor of zeros of <bytes> (after <warmup> untimed
                           ones, default --warmup, the first time it sees
                           <bytes>; further words are for corodist's ranks);
                           answered "DONE"
    QUIT                   answered with "RESULT <bytes> <p50_us> <p99_us>
                           <samples>" per size (rank 0's samples of all its
                           blocks), then exit

ProcessGroupGloo's allreduce (AsyncAllreduceWork) leaves the algorithm of its
gloo::AllreduceOptions unset, which gloo::allreduce runs as the ring: the ring
at every size and rank count.

Usage: /usr/bin/python3 bench/torch_allreduce_peer.py --ranks N [--warmup W]
"""
import argparse
import ctypes
import datetime
import multiprocessing as mp
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

HOST = "127.0.0.1"
TIMEOUT = datetime.timedelta(hours=1)  # includes corodist's turns


def percentile(samples, q):
    s = sorted(samples)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (pos - lo) * (s[hi] - s[lo])


def die_with_parent():
    """No rank outlives the job's process (killed when a run fails)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def rank_main(port, rank, world, warmup, commands, answers):
    die_with_parent()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    store = dist.TCPStore(HOST, port, world, False, TIMEOUT)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=TIMEOUT)
    if rank == 0:
        answers.put("READY")
    buffers, samples = {}, {}
    while True:
        cmd = torch.zeros(4, dtype=torch.int64)  # run?, bytes, iters, warmup
        if rank == 0:
            cmd = torch.tensor(commands.get(), dtype=torch.int64)
        dist.broadcast(cmd, src=0)  # untimed: passes the command on
        run, nbytes, iters, first_warmup = cmd.tolist()
        if not run:
            break
        if nbytes not in buffers:
            # Sizes come one after another: the last one's buffer is done with.
            buffers.clear()
            buffers[nbytes] = torch.zeros(nbytes // 4, dtype=torch.float32)
        if nbytes not in samples:
            samples[nbytes] = []
            for _ in range(first_warmup if first_warmup >= 0 else warmup):
                dist.all_reduce(buffers[nbytes])
        t, lat = buffers[nbytes], samples[nbytes]
        for _ in range(iters):
            t0 = time.perf_counter()
            dist.all_reduce(t)
            lat.append(time.perf_counter() - t0)
        if rank == 0:
            answers.put("DONE")
    if rank == 0:
        for nbytes, lat in samples.items():
            answers.put(f"RESULT {nbytes} {percentile(lat, 0.5) * 1e6} {percentile(lat, 0.99) * 1e6} {len(lat)}")
        answers.put("END")
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    master = dist.TCPStore(HOST, 0, a.ranks, True, TIMEOUT, wait_for_workers=False)
    commands, answers = mp.Queue(), mp.Queue()
    procs = [mp.Process(target=rank_main, args=(master.port, r, a.ranks, a.warmup, commands, answers))
             for r in range(a.ranks)]
    for p in procs:
        p.start()
    print(answers.get(), flush=True)  # READY
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["RUN"]:
            commands.put([1, int(words[1]), int(words[2]), int(words[3]) if len(words) > 3 else -1])
            print(answers.get(), flush=True)  # DONE
        elif words[:1] == ["QUIT"]:
            break
    commands.put([0, 0, 0, 0])
    while (answer := answers.get()) != "END":
        print(answer, flush=True)
    for p in procs:
        p.join(60)
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    if bad:
        raise SystemExit(f"ranks failed: {bad}")


if __name__ == "__main__":
    main()
