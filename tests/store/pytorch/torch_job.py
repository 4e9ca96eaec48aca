"""PyTorch (Debian's python3-torch 1.13) as the real peer of corodist's store.

Usage: torch_job.py MODE PORT [N]
  ops    N processes, each a PyTorch TCPStore client doing every operation
         against the server at PORT, all at once
  ddp    2 ranks: init_process_group("gloo", store=TCPStore(..., is_master=False)),
         an allreduce and a DDP training step
  rpc    2 ranks: torch.distributed.rpc initialised through the store at PORT
         (torchelastic's agent-store mode: every rank is a store client)
  master a PyTorch TCPStore master on a free port (PORT ignored): prints the
         port, then talks to a corodist client (see test_torch_compat.cpp)
  edges  the edge cases of ADD (values std::stoll reads leniently, a sum past
         int64, a value with no integer) against the server at PORT, or, with
         PORT 0, against a PyTorch master of this process: prints one line per
         case, for the test to compare the two servers' answers
  cas_wait  against the server at PORT: a WAIT on a key, then (after a line
         on stdin: the test saw the wait registered) a COMPARE_SET that
         creates the key, which wakes no waiter in PyTorch's master; the
         next SET does. Prints what the waiter saw
Prints "OK" and exits 0 when every check passed.
"""
import datetime
import multiprocessing as mp
import os
import sys
import time

import torch
import torch.distributed as dist

HOST = "127.0.0.1"
TIMEOUT = datetime.timedelta(seconds=30)


def client(port, world):
    return dist.TCPStore(HOST, port, world, False, TIMEOUT)


def ops_worker(port, i, n):
    s = client(port, n + 1)
    s.set(f"w{i}/k", f"v{i}")
    assert s.get(f"w{i}/k") == f"v{i}".encode()
    blob = bytes([0, 1, 255, 0]) * 100
    s.set(f"w{i}/bin", blob)
    assert s.get(f"w{i}/bin") == blob
    for _ in range(10):
        s.add("counter", 1)
    assert s.add(f"w{i}/c", 7) == 7 and s.add(f"w{i}/c", -2) == 5
    assert s.get(f"w{i}/c") == b"5"  # counters are decimal text
    assert s.compare_set(f"w{i}/k", "wrong", "x") == f"v{i}".encode()
    assert s.compare_set(f"w{i}/k", f"v{i}", "new") == b"new"
    assert s.compare_set(f"w{i}/fresh", "", "made") == b"made"
    assert s.compare_set(f"w{i}/absent", "e", "d") == b"e"  # PyTorch's answer for a missing key
    s.wait([f"w{i}/k", f"w{i}/bin"])
    assert s.num_keys() >= 4
    assert s.delete_key(f"w{i}/fresh") is True
    assert s.delete_key(f"w{i}/fresh") is False
    t0 = time.monotonic()
    try:
        s.wait([f"w{i}/never"], datetime.timedelta(milliseconds=300))
        raise AssertionError("wait for a missing key returned")
    except RuntimeError as e:
        assert "imeout" in str(e), e
    assert time.monotonic() - t0 < 5
    # A key another process sets later: get blocks until it exists.
    s.set(f"ring/{i}", str(i))
    assert s.get(f"ring/{(i + 1) % n}") == str((i + 1) % n).encode()
    assert s.get("from_native") == b"hello from corodist"
    s.set(f"from_py/{i}", "hello from pytorch")


def run_ops(port, n):
    procs = [mp.Process(target=ops_worker, args=(port, i, n)) for i in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    assert not bad, f"workers failed: {bad}"


def ddp_worker(port, rank, world):
    store = client(port, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=TIMEOUT)
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((4,), float(sum(range(1, world + 1))))), t
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    torch.manual_seed(100 + rank)  # different data on each rank
    ddp(torch.randn(8, 4)).sum().backward()
    opt.step()
    # DDP averaged the gradients: every rank holds the same parameters.
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    assert all(torch.allclose(g, gathered[0]) for g in gathered), gathered
    dist.barrier()
    dist.destroy_process_group()


def rpc_worker(port, rank, world):
    import torch.distributed.rpc as rpc
    os.environ.update(MASTER_ADDR=HOST, MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True",
                      TORCHELASTIC_RESTART_COUNT="0")
    opts = rpc.TensorPipeRpcBackendOptions(init_method="env://", rpc_timeout=30)
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=world, rpc_backend_options=opts)
    other = f"w{(rank + 1) % world}"
    r = rpc.rpc_sync(other, torch.add, args=(torch.ones(3), rank))
    assert torch.equal(r, torch.full((3,), 1.0 + rank)), r
    assert rpc.get_worker_info(other).name == other
    rpc.shutdown()


def run_ranks(target, port, world):
    procs = [mp.Process(target=target, args=(port, r, world)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(90)
    bad = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode != 0]
    assert not bad, f"ranks failed: {bad}"


def run_master():
    m = dist.TCPStore(HOST, 0, 2, True, TIMEOUT, wait_for_workers=False)
    print(m.port, flush=True)
    assert m.get("from_cpp") == b"hello from corodist"
    m.set("from_py", "hello from pytorch")
    m.wait(["done"])
    assert m.get("counter") == b"42", m.get("counter")
    assert m.get("multi/a") == b"A" and m.get("multi/b") == b"B"


def run_edges(port):
    master = None
    if port == 0:
        master = dist.TCPStore(HOST, 0, 1, True, TIMEOUT, wait_for_workers=False)
        port = master.port
    short = datetime.timedelta(seconds=10)
    for i, v in enumerate(["12abc", " 7", "+5", "-3x", "\t4", "0x10", str(2**63 - 1), "abc", "", "99999999999999999999"]):
        c = dist.TCPStore(HOST, port, 1, False, short)  # one connection a case: a bad value may close it
        key = f"edge/{i}"
        c.set(key, v)
        delta = 1
        try:
            got = c.add(key, delta)
            print(f"add {v!r} {delta}: {got} {c.get(key)!r}", flush=True)
        except RuntimeError:
            print(f"add {v!r} {delta}: error", flush=True)
    c = dist.TCPStore(HOST, port, 1, False, short)
    c.set("edge/max", str(2**63 - 1))
    print(f"add max {2**63 - 1}: {c.add('edge/max', 2**63 - 1)}", flush=True)
    del master


def run_cas_wait(port):
    short = datetime.timedelta(seconds=3)
    waiter = dist.TCPStore(HOST, port, 1, False, short)
    c = dist.TCPStore(HOST, port, 1, False, TIMEOUT)
    results = []

    def wait_for(key):
        try:
            waiter.wait([key])
            results.append("woken")
        except RuntimeError as e:
            results.append("timed out" if "imeout" in str(e) else f"error {e}")

    import threading
    t = threading.Thread(target=wait_for, args=("cas/created",))
    t.start()
    print("waiting", flush=True)
    sys.stdin.readline()  # the test saw the WAIT registered at the server
    print("compare_set", c.compare_set("cas/created", "", "v"), flush=True)
    t.join()
    print("first waiter", results[0], flush=True)
    # A key created by compare_set is there for a new WAIT.
    c.wait(["cas/created"])
    print("later wait returns", flush=True)
    w2 = dist.TCPStore(HOST, port, 1, False, TIMEOUT)
    t = threading.Thread(target=lambda: (w2.wait(["cas/second"]), results.append("woken")))
    t.start()
    print("waiting", flush=True)
    sys.stdin.readline()
    print("compare_set", c.compare_set("cas/second", "", "v"), flush=True)
    print("waiting", flush=True)
    sys.stdin.readline()  # the test saw the WAIT still pending
    c.set("cas/second", "w")
    t.join()
    print("second waiter after set", results[1], flush=True)


def main():
    mode, port = sys.argv[1], int(sys.argv[2])
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    if mode == "ops":
        run_ops(port, n)
    elif mode == "ddp":
        run_ranks(ddp_worker, port, 2)
    elif mode == "rpc":
        run_ranks(rpc_worker, port, 2)
    elif mode == "master":
        run_master()
    elif mode == "edges":
        run_edges(port)
    elif mode == "cas_wait":
        run_cas_wait(port)
    else:
        sys.exit(f"unknown mode {mode}")
    print("OK", flush=True)


if __name__ == "__main__":
    main()
