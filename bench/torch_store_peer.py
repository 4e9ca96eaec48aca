"""PyTorch's own TCPStore client (Debian's python3-torch 1.13) against a
PyTorch master and against a corodist store server: p50 of set / get / add
from Python, and aggregate add/s with N client processes.

Usage: /usr/bin/python3 bench/torch_store_peer.py [--port P] [--clients N]
  --port P   a running corodist server (build/tools/corodist-store --port 0 serve);
             without it only the PyTorch master is measured
"""
import argparse
import datetime
import multiprocessing as mp
import statistics
import time

import torch.distributed as dist

HOST = "127.0.0.1"
TIMEOUT = datetime.timedelta(seconds=30)


def p50_us(fn, n=2000):
    lat = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        lat.append(time.perf_counter() - t0)
    return statistics.median(lat) * 1e6


def adder(port, n, q):
    s = dist.TCPStore(HOST, port, -1, False, TIMEOUT)
    q.get()  # start together
    for _ in range(n):
        s.add("agg", 1)


def aggregate(port, clients, n=5000):
    q = mp.Queue()
    procs = [mp.Process(target=adder, args=(port, n, q)) for _ in range(clients)]
    for p in procs:
        p.start()
    time.sleep(1.0)  # all connected
    t0 = time.perf_counter()
    for _ in procs:
        q.put(1)
    for p in procs:
        p.join()
    return clients * n / (time.perf_counter() - t0)


def measure(name, port, clients):
    s = dist.TCPStore(HOST, port, -1, False, TIMEOUT)
    s.set("k", "v" * 64)
    r = dict(set=p50_us(lambda i: s.set("k", "v" * 64)), get=p50_us(lambda i: s.get("k")),
             add=p50_us(lambda i: s.add("c", 1)))
    agg = aggregate(port, clients)
    print(f"{name:>10}: set p50 {r['set']:6.1f} us  get p50 {r['get']:6.1f} us  add p50 {r['add']:6.1f} us  "
          f"{clients} clients {agg:9,.0f} add/s", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int)
    ap.add_argument("--clients", type=int, default=16)
    a = ap.parse_args()
    master = dist.TCPStore(HOST, 0, -1, True, TIMEOUT, wait_for_workers=False)
    measure("pytorch", master.port, a.clients)
    if a.port:
        measure("corodist", a.port, a.clients)


if __name__ == "__main__":
    main()
