"""PyTorch's gloo (Debian's python3-torch 1.13), the peer of corodist-bench's
`allreduce`, `p2p` and `all_to_all` suites, which drive it through
stdin/stdout so that it takes turns with corodist's ranks on the same machine.

Ranks are processes on one PyTorch TCPStore master, as init_process_group("gloo")
makes them. Protocol (one line each way):
    READY                  printed once every rank has joined
    RUN <bytes> <iters> [<warmup> [<kind> [<window>]]]
                           one block of <iters> timed operations on <bytes>
                           (after <warmup> untimed ones, default --warmup, the
                           first time it sees <bytes> and <kind>), by --op:
                           all_reduce: dist.all_reduce of a float32 tensor of
                             zeros (<kind> and further words are for
                             corodist's ranks);
                           p2p (2 ranks), <kind> 0: rank 0 dist.send then
                             dist.recv, rank 1 the mirror, rank 0 times each
                             round trip; <kind> 1: a stream, rank 0 keeps
                             <window> dist.isend in flight, rank 1 <window>
                             dist.irecv and times their completions from the
                             first to the last (one sample per block: the time
                             per message); uint8 tensors;
                           all_to_all: dist.all_to_all_single of a float32
                             tensor of zeros, <kind> 0 even, 1 skewed (rank r
                             sends rank j a block proportional to
                             ((r + j) % n) + 1, as the suite's skewed_elements);
                           ended by a barrier (p2p) and answered "DONE"
    QUIT                   answered with "RESULT <bytes> <p50_us> <p99_us>
                           <samples>" per size (all_reduce) or "RESULT <kind>
                           <bytes> <p50_us> <p99_us> <samples>" per kind and
                           size (p2p, all_to_all), from the rank that timed
                           them, and for the p2p ping-pong and all_to_all from
                           every rank "SWITCHES <kind> <bytes> 0 <switches>
                           <calls> <cpu_us>" (its process's voluntary context
                           switches, i.e. thread wake-ups, and CPU time), then
                           exit

ProcessGroupGloo's allreduce (AsyncAllreduceWork) leaves the algorithm of its
gloo::AllreduceOptions unset, which gloo::allreduce runs as the ring: the ring
at every size and rank count.

Usage: /usr/bin/python3 bench/torch_allreduce_peer.py --ranks N [--op OP] [--warmup W]
"""
import argparse
import collections
import ctypes
import datetime
import multiprocessing as mp
import os
import resource
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


def skewed_elements(n, count, src, dst):
    """Elements rank src sends rank dst under the skew (bench/all_to_all_suite.cpp's skewed_elements)."""
    total_weight = n * (n + 1) // 2
    given = sum(count * ((src + j) % n + 1) // total_weight for j in range(n))
    return count * ((src + dst) % n + 1) // total_weight + (1 if dst < count - given else 0)


class Block:
    """The buffers and timed operations of one op; run(...) runs one block, returns the samples (seconds)."""

    def __init__(self, op, rank, world):
        self.op, self.rank, self.world = op, rank, world
        self.buffers = {}
        # p2p ping-pong, all_to_all: (kind, bytes) -> [voluntary context switches, calls, CPU us]
        self.switches = {}

    def tensors(self, key, make):
        if key not in self.buffers:
            # Sizes come one after another: the last one's buffers are done with.
            self.buffers.clear()
            self.buffers[key] = make()
        return self.buffers[key]

    def run(self, nbytes, iters, warmup, kind, window):
        if self.op == "all_reduce":
            t = self.tensors((nbytes,), lambda: torch.zeros(nbytes // 4, dtype=torch.float32))
            return timed(lambda: dist.all_reduce(t), iters, warmup)
        if self.op == "all_to_all":
            return self.all_to_all(nbytes, iters, warmup, kind)
        if kind == 0:
            return self.pingpong(nbytes, iters, warmup)
        return self.stream(nbytes, iters, warmup, window)

    def all_to_all(self, nbytes, iters, warmup, kind):
        n, count = self.world, nbytes // 4
        if kind == 0:
            ins, outs = None, None
            out_count = count
        else:
            ins = [skewed_elements(n, count, self.rank, j) for j in range(n)]
            outs = [skewed_elements(n, count, j, self.rank) for j in range(n)]
            out_count = sum(outs)
        inp = self.tensors((nbytes,), lambda: torch.zeros(count, dtype=torch.float32))
        out = torch.empty(out_count, dtype=torch.float32)
        return self.counted((kind, nbytes), lambda: timed(lambda: dist.all_to_all_single(out, inp, outs, ins), iters,
                                                          warmup), warmup + iters)

    def counted(self, key, run, calls):
        """run(), counting this process's voluntary context switches and CPU time (all its threads) against
        `calls`."""
        before = resource.getrusage(resource.RUSAGE_SELF)
        result = run()
        after = resource.getrusage(resource.RUSAGE_SELF)
        counted = self.switches.setdefault(key, [0, 0, 0.0])
        counted[0] += after.ru_nvcsw - before.ru_nvcsw
        counted[1] += calls
        counted[2] += (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1e6
        return result

    def pingpong(self, nbytes, iters, warmup):
        t = self.tensors((nbytes, 1), lambda: torch.zeros(nbytes, dtype=torch.uint8))
        other = 1 - self.rank
        if self.rank == 0:
            def round_trip():
                dist.send(t, other)
                dist.recv(t, other)
        else:
            def round_trip():
                dist.recv(t, other)
                dist.send(t, other)
        lat = self.counted((0, nbytes), lambda: timed(round_trip, iters, warmup), warmup + iters)
        return lat if self.rank == 0 else []  # rank 0 times the round trips

    def stream(self, nbytes, messages, warmup, window):
        bufs = self.tensors((nbytes, window), lambda: [torch.zeros(nbytes, dtype=torch.uint8) for _ in range(window)])
        other = 1 - self.rank
        post = dist.isend if self.rank == 0 else dist.irecv
        samples = []
        for n in ([window] if warmup else []) + [messages]:  # a stream of `window` messages warms a new size up
            in_flight, first = collections.deque(), None
            for i in range(n):
                if len(in_flight) == window:
                    in_flight.popleft().wait()
                    first = first or time.perf_counter()
                in_flight.append(post(bufs[i % window], other))
            while in_flight:
                in_flight.popleft().wait()
                first = first or time.perf_counter()
            if n == messages and n > 1:
                samples = [(time.perf_counter() - first) / (n - 1)]
        return samples if self.rank == 1 else []  # the receiver times the stream


def timed(call, iters, warmup):
    for _ in range(warmup):
        call()
    lat = []
    for _ in range(iters):
        t0 = time.perf_counter()
        call()
        lat.append(time.perf_counter() - t0)
    return lat


def rank_main(op, port, rank, world, warmup, commands, answers):
    die_with_parent()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    store = dist.TCPStore(HOST, port, world, False, TIMEOUT)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=TIMEOUT)
    if rank == 0:
        answers.put("READY")
    block, samples = Block(op, rank, world), {}
    while True:
        cmd = torch.zeros(6, dtype=torch.int64)  # run?, bytes, iters, warmup, kind, window
        if rank == 0:
            cmd = torch.tensor(commands.get(), dtype=torch.int64)
        dist.broadcast(cmd, src=0)  # untimed: passes the command on
        run, nbytes, iters, first_warmup, kind, window = cmd.tolist()
        if not run:
            break
        key = nbytes if op == "all_reduce" else (kind, nbytes)
        fresh = key not in samples
        lat = samples.setdefault(key, [])
        lat += block.run(nbytes, iters, (first_warmup if first_warmup >= 0 else warmup) if fresh else 0, kind,
                         max(window, 1))
        if op == "p2p":
            dist.barrier()  # both sides are done before corodist's turn
        if rank == 0:
            answers.put("DONE")
    for key, lat in samples.items():
        if not lat or (op != "p2p" and rank != 0):  # rank 0 reports, but the p2p stream's receiver
            continue
        figures = f"{percentile(lat, 0.5) * 1e6} {percentile(lat, 0.99) * 1e6} {len(lat)}"
        answers.put(f"RESULT {key} {figures}" if op == "all_reduce" else f"RESULT {key[0]} {key[1]} {figures}")
    for (kind, nbytes), (switches, calls, cpu_us) in block.switches.items():
        answers.put(f"SWITCHES {kind} {nbytes} 0 {switches} {calls} {cpu_us}")
    if rank != 0:  # mp.Queue writes from a feeder thread: flushed before the barrier, so before rank 0's END
        answers.close()
        answers.join_thread()
    dist.barrier()
    if rank == 0:
        answers.put("END")
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--op", choices=("all_reduce", "p2p", "all_to_all"), default="all_reduce")
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    master = dist.TCPStore(HOST, 0, a.ranks, True, TIMEOUT, wait_for_workers=False)
    commands, answers = mp.Queue(), mp.Queue()
    procs = [mp.Process(target=rank_main, args=(a.op, master.port, r, a.ranks, a.warmup, commands, answers))
             for r in range(a.ranks)]
    for p in procs:
        p.start()
    print(answers.get(), flush=True)  # READY
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["RUN"]:
            rest = [int(w) for w in words[1:6]]
            defaults = [0, 0, -1, 0, 1]  # bytes, iters, warmup (-1: --warmup), kind, window
            commands.put([1] + rest + defaults[len(rest):])
            print(answers.get(), flush=True)  # DONE
        elif words[:1] == ["QUIT"]:
            break
    commands.put([0, 0, 0, 0, 0, 0])
    while (answer := answers.get()) != "END":
        print(answer, flush=True)
    for p in procs:
        p.join(60)
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    if bad:
        raise SystemExit(f"ranks failed: {bad}")


if __name__ == "__main__":
    main()
