"""The PyTorch side of docs/collective.md's "Joining a PyTorch job" program,
run by tests/docs/check_snippets.py: ranks 0 .. N-1 of a world of N+1 call
init_process_group("gloo", init_method="tcp://127.0.0.1:PORT") (rank 0 makes
the TCPStore master there) and allreduce 1000 ones, as the C++ rank N does.
Prints "PORT <n>" first (a free port), then "OK" when every rank saw N+1.
Usage: torch_gloo_ranks.py N   (Debian's python3-torch 1.13)"""
import datetime
import multiprocessing as mp
import os
import socket
import sys

import torch
import torch.distributed as dist


def rank_main(port, rank, world):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    t = torch.ones(1000)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((1000,), float(world))), t
    dist.destroy_process_group()


def main():
    n = int(sys.argv[1])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    print(f"PORT {port}", flush=True)
    procs = [mp.Process(target=rank_main, args=(port, r, n + 1)) for r in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(100)
    bad = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode != 0]
    for p in procs:
        if p.exitcode is None:
            p.kill()
    if bad:
        sys.exit(f"PyTorch ranks failed: {bad}")
    print("OK", flush=True)


if __name__ == "__main__":
    main()
