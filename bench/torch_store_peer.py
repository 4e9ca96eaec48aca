"""PyTorch's own TCPStore client (Debian's python3-torch 1.13) against a
PyTorch master and against a corodist store server: p50 of set / get / add
from Python, and aggregate add/s with N client processes.

With --rendezvous N: a rendezvous of N ranks through a PyTorch master in this
process, the ranks as threads of forked client processes (one per 2,048 ranks),
each doing what the store suite's ranks do: connect, add itself to
rdzv/arrived, set rdzv/rank/<r>, the last to arrive sets rdzv/done, all wait
on it. Prints rendezvous_s (release to the last process through), or how it
failed ("failure"), and exits 0 either way.

Usage: /usr/bin/python3 bench/torch_store_peer.py [--port P] [--clients N] [--samples S] [--adds A] [--json]
       /usr/bin/python3 bench/torch_store_peer.py --rendezvous N [--json]
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
import math
import multiprocessing as mp
import os
import select
import signal
import statistics
import threading
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


RDZV_RANKS_PER_PROCESS = 2048
RDZV_CONNECTS_IN_FLIGHT = 400  # per process, as the store suite's clients
RDZV_TIMEOUT = datetime.timedelta(seconds=40)  # each connect and wait
RDZV_DEADLINE_S = 50  # the whole rendezvous (the benchmark gives it 60 s)


def rdzv_client(index, first, count, world, go_r, out_w):
    """One forked client process: `count` rank threads, released by the port on `go_r`."""
    def say(line):
        os.write(out_w, (line.replace("\n", " ")[:1000] + "\n").encode())

    try:
        threading.stack_size(256 * 1024)
        released = threading.Event()
        port = []
        gate = threading.Semaphore(RDZV_CONNECTS_IN_FLIGHT)
        errors, stores = [], []

        def rank(r):
            released.wait()
            try:
                with gate:
                    s = dist.TCPStore(HOST, port[0], -1, False, RDZV_TIMEOUT, wait_for_workers=False)
                n = s.add("rdzv/arrived", 1)
                s.set(f"rdzv/rank/{r}", f"pid {os.getpid()}")
                if n == world:
                    s.set("rdzv/done", "1")
                s.wait(["rdzv/done"])
                stores.append(s)  # kept connected until the process ends
            except Exception as e:  # noqa: BLE001 - reported to the parent
                errors.append(f"rank {r}: {type(e).__name__}: {e}")

        threads = [threading.Thread(target=rank, args=(first + i,), daemon=True) for i in range(count)]
        for t in threads:
            t.start()
        say(f"ready {index}")
        data = b""
        while not data.endswith(b"\n"):
            chunk = os.read(go_r, 64)
            if not chunk:
                raise RuntimeError("no port from the parent")
            data += chunk
        port.append(int(data))
        t0 = time.perf_counter()
        released.set()
        for t in threads:
            t.join()
        say(f"error {index} {errors[0]} ({len(errors)} of {count} ranks failed)" if errors
            else f"ok {index} {time.perf_counter() - t0:.6f}")
        os.read(go_r, 1)  # EOF: the parent is done
    except Exception as e:  # noqa: BLE001
        say(f"error {index} {type(e).__name__}: {e}")
    os._exit(0)


def rss_bytes():
    """This process's resident set (the master's threads and connections live here)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def rendezvous(world, as_json):
    procs = max(1, math.ceil(world / RDZV_RANKS_PER_PROCESS))
    out_r, out_w = os.pipe()
    children, gos = [], []
    for i in range(procs):  # forked before the master's threads exist
        go_r, go_w = os.pipe()
        first, last = world * i // procs, world * (i + 1) // procs
        pid = os.fork()
        if pid == 0:
            os.close(out_r)
            os.close(go_w)
            for g in gos:
                os.close(g)
            rdzv_client(i, first, last - first, world, go_r, out_w)
        os.close(go_r)
        children.append(pid)
        gos.append(go_w)
    os.close(out_w)
    result = {"op": f"rendezvous_{world}", "ranks": world, "client_processes": procs}
    buf = b""
    deadline = time.monotonic() + RDZV_DEADLINE_S

    def lines():
        nonlocal buf
        while True:
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                yield line.decode(errors="replace")
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if not select.select([out_r], [], [], min(left, 1.0))[0]:
                continue
            chunk = os.read(out_r, 65536)
            if not chunk:
                return
            buf += chunk

    reader = lines()
    failure = None
    try:
        ready = 0
        for line in reader:
            if line.startswith("error "):
                failure = line.split(" ", 2)[2]
                break
            ready += line.startswith("ready ")
            if ready == procs:
                break
        if failure is None and ready < procs:
            failure = "the client processes did not all start"
        if failure is None:
            rss_before = rss_bytes()
            master = dist.TCPStore(HOST, 0, -1, True, RDZV_TIMEOUT, wait_for_workers=False)
            t0 = time.perf_counter()
            for g in gos:
                os.write(g, f"{master.port}\n".encode())
            through = 0
            for line in reader:
                if line.startswith("error "):
                    failure = line.split(" ", 2)[2]
                    break
                through += line.startswith("ok ")
                if through == procs:
                    result["rendezvous_s"] = time.perf_counter() - t0
                    # The master's growth with every rank connected (they stay until the end).
                    result["server_rss_per_conn"] = (rss_bytes() - rss_before) / world
                    break
            if failure is None and "rendezvous_s" not in result:
                failure = f"{through} of {procs} client processes through after {time.perf_counter() - t0:.0f} s"
    except Exception as e:  # noqa: BLE001 - e.g. the master cannot listen
        failure = f"{type(e).__name__}: {e}"
    if failure is not None:
        result["failure"] = failure
    for pid in children:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    if as_json:
        print(json.dumps(result), flush=True)
    else:
        print(f"rendezvous of {world} ranks: " + (f"{result['rendezvous_s']:.3f} s" if failure is None
                                                 else f"failed: {failure}"), flush=True)
    os._exit(0)  # the master's threads and thousands of connections: no orderly teardown


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--adds", type=int, default=2000)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--rendezvous", type=int, metavar="N", help="time a rendezvous of N ranks instead")
    a = ap.parse_args()
    if a.rendezvous:
        rendezvous(a.rendezvous, a.json)
    master = dist.TCPStore(HOST, 0, -1, True, TIMEOUT, wait_for_workers=False)
    measure("pytorch", master.port, a)
    if a.port:
        measure("corodist", a.port, a)


if __name__ == "__main__":
    main()
