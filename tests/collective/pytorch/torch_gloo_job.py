"""PyTorch (Debian's python3-torch 1.13) ranks of a gloo process group that a
corodist C++ rank joins (tests/collective/test_torch_interop.cpp).

Usage: torch_gloo_job.py MODE WORLD [PORT]
  pytorch-master  a PyTorch TCPStore master on a free port (printed as
                  "PORT <n>"); ranks 0 .. WORLD-2 are PyTorch processes that
                  call init_process_group("gloo") with the layout of an
                  init_method URL (PrefixStore "default_pg"); the C++ rank is
                  WORLD-1
  cpp-master      the store is corodist's server at PORT; ranks 1 .. WORLD-1
                  are PyTorch processes that pass store= (no prefix); the C++
                  rank is 0
  --subgroups     (last) run subgroups() instead of collectives()
Every rank runs the same collectives as run_job() (or run_subgroups()) in the
C++ test, checks the results, and the job prints "OK" when all passed.
"""
import datetime
import multiprocessing as mp
import os
import sys

import torch
import torch.distributed as dist

HOST = "127.0.0.1"
TIMEOUT = datetime.timedelta(seconds=60)


def collectives(rank, world, cpp_rank):
    """The sequence the C++ rank runs too (same order: Gloo tags 0, 1, 2, ...)."""
    # 0: allreduce sum, float32
    t = torch.full((1000,), float(rank + 1))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((1000,), float(world * (world + 1) // 2))), t
    # 1: broadcast int64 from the C++ rank
    t = torch.zeros(17, dtype=torch.int64)
    dist.broadcast(t, src=cpp_rank)
    assert torch.equal(t, torch.arange(17, dtype=torch.int64) * 3), t
    # 2: allgather float64
    parts = [torch.zeros(5, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(parts, torch.full((5,), float(rank), dtype=torch.float64))
    for r, p in enumerate(parts):
        assert torch.equal(p, torch.full((5,), float(r), dtype=torch.float64)), parts
    # 3: barrier
    dist.barrier()
    # 4: allreduce max, int32
    t = torch.tensor([rank, -rank, 7 * rank], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    assert torch.equal(t, torch.tensor([world - 1, 0, 7 * (world - 1)], dtype=torch.int32)), t
    # 5: broadcast float32 from rank 0
    t = torch.full((3,), 42.0) if rank == 0 else torch.zeros(3)
    dist.broadcast(t, src=0)
    assert torch.equal(t, torch.full((3,), 42.0)), t
    # 6: a 1 MiB allreduce
    t = torch.arange(262144, dtype=torch.float32) * (rank + 1)
    dist.all_reduce(t)
    assert torch.equal(t, torch.arange(262144, dtype=torch.float32) * float(world * (world + 1) // 2))
    dist.barrier()  # 7
    exchanges(rank, world, cpp_rank)


def exchanges(rank, world, cpp_rank):
    """Point-to-point, all-to-all, gather, scatter and reduce, as run_exchanges() in C++."""
    # A ring of isend/irecv (tag 5; sends and receives take no collective tag).
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    out = torch.arange(6, dtype=torch.float32) + 100 * rank
    inp = torch.zeros(6)
    for req in [dist.isend(out, nxt, tag=5), dist.irecv(inp, prv, tag=5)]:
        req.wait()
    assert torch.equal(inp, torch.arange(6, dtype=torch.float32) + 100 * prv), inp
    # 8: all_to_all_single even, int64: rank r's block for j holds r * 10 + j
    t = torch.tensor([rank * 10 + j for j in range(world) for _ in range(2)], dtype=torch.int64)
    o = torch.zeros(2 * world, dtype=torch.int64)
    dist.all_to_all_single(o, t)
    assert torch.equal(o, torch.tensor([j * 10 + rank for j in range(world) for _ in range(2)])), o
    # 9: uneven: rank s sends (s + d) % 3 + 1 elements of s * 100 + d to rank d
    ins = [(rank + d) % 3 + 1 for d in range(world)]
    outs = [(s + rank) % 3 + 1 for s in range(world)]
    t = torch.cat([torch.full((ins[d],), float(rank * 100 + d)) for d in range(world)])
    o = torch.zeros(sum(outs))
    dist.all_to_all_single(o, t, outs, ins)
    assert torch.equal(o, torch.cat([torch.full((outs[s],), float(s * 100 + rank)) for s in range(world)])), o
    # 10: gather float64 x 4 to the C++ rank
    t = torch.full((4,), float(rank), dtype=torch.float64)
    if rank == cpp_rank:
        parts = [torch.zeros(4, dtype=torch.float64) for _ in range(world)]
        dist.gather(t, parts, dst=cpp_rank)
    else:
        dist.gather(t, dst=cpp_rank)
    # 11: scatter int32 x 3 from rank 0: rank j gets j * 7
    o = torch.zeros(3, dtype=torch.int32)
    if rank == 0:
        dist.scatter(o, [torch.full((3,), j * 7, dtype=torch.int32) for j in range(world)], src=0)
    else:
        dist.scatter(o, src=0)
    assert torch.equal(o, torch.full((3,), rank * 7, dtype=torch.int32)), o
    # 12: reduce sum, float32 x 1000, to the C++ rank
    t = torch.full((1000,), float(rank + 1))
    dist.reduce(t, dst=cpp_rank)
    # 13: reduce max, int64, to rank 0
    t = torch.tensor([rank, 5 - rank], dtype=torch.int64)
    dist.reduce(t, dst=0, op=dist.ReduceOp.MAX)
    if rank == 0:
        assert torch.equal(t, torch.tensor([world - 1, 5], dtype=torch.int64)), t
    dist.barrier()  # 14


def subgroup_lists(world, cpp_rank):
    """The rank lists of subgroups(), in creation order (PyTorch groups 1, 2, 3)."""
    return [
        sorted({cpp_rank, 1}),  # the C++ rank and one PyTorch rank
        [r for r in range(world) if r != cpp_rank],  # the C++ rank is not a member
        [0, 2, 3],
    ]


def subgroups(rank, world, cpp_rank):
    """new_group over subsets, each with an allreduce among its members; then
    one on the default group (as run_subgroups() in the C++ test)."""
    for ranks in subgroup_lists(world, cpp_rank):
        g = dist.new_group(ranks)  # every rank calls it, members or not
        if rank in ranks:
            t = torch.arange(8, dtype=torch.float32) * (rank + 1)
            dist.all_reduce(t, group=g)
            want = torch.arange(8, dtype=torch.float32) * float(sum(r + 1 for r in ranks))
            assert torch.equal(t, want), (ranks, t)
    t = torch.tensor([rank + 1], dtype=torch.int64)
    dist.all_reduce(t)
    assert t.item() == world * (world + 1) // 2, t


def rank_main(mode, port, rank, world, part):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    client = dist.TCPStore(HOST, port, world, False, TIMEOUT)
    if mode == "pytorch-master":
        # What init_process_group(init_method=...) does to the store.
        store, cpp_rank = dist.PrefixStore("default_pg", client), world - 1
    else:
        store, cpp_rank = client, 0
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=TIMEOUT)
    part(rank, world, cpp_rank)
    dist.destroy_process_group()


def main():
    args = sys.argv[1:]
    part = collectives
    if args and args[-1] == "--subgroups":
        part, args = subgroups, args[:-1]
    mode, world = args[0], int(args[1])
    if mode == "pytorch-master":
        master = dist.TCPStore(HOST, 0, world, True, TIMEOUT, wait_for_workers=False)
        port, ranks = master.port, range(0, world - 1)
        print(f"PORT {port}", flush=True)
    elif mode == "cpp-master":
        port, ranks = int(args[2]), range(1, world)
    else:
        sys.exit(f"unknown mode {mode}")
    procs = [mp.Process(target=rank_main, args=(mode, port, r, world, part)) for r in ranks]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    bad = [(r, p.exitcode) for r, p in zip(ranks, procs) if p.exitcode != 0]
    if bad:
        sys.exit(f"PyTorch ranks failed: {bad}")
    print("OK", flush=True)


if __name__ == "__main__":
    main()
