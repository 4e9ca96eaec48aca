"""PyTorch's own TCPStore client (Debian's python3-torch 1.13) against a
PyTorch master and against a corodist store server: p50 of set / get / add
from Python, and aggregate add/s with N client processes.

Usage: /usr/bin/python3 bench/torch_store_peer.py [--port P] [--clients N] [--samples S] [--adds A] [--json]
  --port P     a running corodist server (build/tools/corodist-store --port 0 serve);
               without it only the PyTorch master is measured
  --clients N  client processes for the aggregate (default 64)
  --samples S  timed operations per single-client p50 (default 20000)
  --adds A     adds per client process in the aggregate (default 2000)
  --json       one JSON object per figure (what corodist-bench reads) instead of a summary line
"""
import argparse
import datetime
import json
import multiprocessing as mp
import statistics
import time

import torch.distributed as dist

HOST = "127.0.0.1"
TIMEOUT = datetime.timedelta(seconds=60)


def p50_us(fn, n):
    for i in range(max(n // 10, 10)):  # warm-up
        fn(i)
    lat = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        lat.append(time.perf_counter() - t0)
    return statistics.median(lat) * 1e6


def adder(port, n, ready, go):
    s = dist.TCPStore(HOST, port, -1, False, TIMEOUT)
    s.add("agg_warm", 1)
    ready.wait()  # everyone connected
    go.wait()  # start together
    for _ in range(n):
        s.add("agg", 1)


def aggregate(port, clients, n):
    ready = mp.Barrier(clients + 1)
    go = mp.Barrier(clients + 1)
    procs = [mp.get_context("fork").Process(target=adder, args=(port, n, ready, go)) for _ in range(clients)]
    for p in procs:
        p.start()
    ready.wait(timeout=120)
    t0 = time.perf_counter()
    go.wait(timeout=120)
    for p in procs:
        p.join(timeout=300)
        if p.exitcode != 0:
            raise RuntimeError(f"an adder process ended with {p.exitcode}")
    return clients * n / (time.perf_counter() - t0)


def measure(master, port, a):
    s = dist.TCPStore(HOST, port, -1, False, TIMEOUT)
    s.set("k", "v" * 16)
    r = dict(set=p50_us(lambda i: s.set("k", "v" * 16), a.samples), get=p50_us(lambda i: s.get("k"), a.samples),
             add=p50_us(lambda i: s.add("c", 1), a.samples))
    agg = aggregate(port, a.clients, a.adds)
    if a.json:
        for op in ("set", "get", "add"):
            print(json.dumps({"master": master, "op": op, "p50_us": r[op]}), flush=True)
        print(json.dumps({"master": master, "op": f"add_{a.clients}_clients", "ops_per_s": agg,
                          "clients": a.clients}), flush=True)
    else:
        print(f"{master:>10}: set p50 {r['set']:6.1f} us  get p50 {r['get']:6.1f} us  add p50 {r['add']:6.1f} us  "
              f"{a.clients} clients {agg:9,.0f} add/s", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--adds", type=int, default=2000)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    master = dist.TCPStore(HOST, 0, -1, True, TIMEOUT, wait_for_workers=False)
    measure("pytorch", master.port, a)
    if a.port:
        measure("corodist", a.port, a)


if __name__ == "__main__":
    main()
