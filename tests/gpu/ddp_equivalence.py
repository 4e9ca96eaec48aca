"""DDP equivalence with PyTorch on CUDA (check 3 of scripts/gpu_check.sh).

Runs corodist-gpu-ddp-check (the reducer on CUDA buffers: world size 1 on
nccl_group, 2 on the staged gloo_group, each checked against its own
single-process replay), which writes its data, initial parameters and final
parameters; then trains the same model (nn.Linear(16, 4), MSE, SGD) on the
same data from the same start with PyTorch's DistributedDataParallel on cuda:0
(world size 1 on nccl, 2 on gloo with both ranks on cuda:0, each rank on its
shard of the batch), and compares the final parameters: equal within 1e-6
(relative to max(1, |value|)). Prints OK or the differences; exit 0 when
equal, 1 otherwise, 77 (skipped, with the reason) when there is no GPU or
PyTorch has no CUDA.

Usage: /usr/bin/python3 tests/gpu/ddp_equivalence.py PATH/corodist-gpu-ddp-check [--steps N]
"""
import argparse
import array
import datetime
import multiprocessing as mp
import os
import queue
import subprocess
import sys
import tempfile

TOLERANCE = 1e-6
SKIP = 77


def floats(path):
    a = array.array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    return list(a)


def rank_main(port, rank, world, backend, data_dir, meta, answers):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    samples, inputs, outputs, steps, lr = meta
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.cuda.set_device(0)
    store = dist.TCPStore("127.0.0.1", port, world, False, datetime.timedelta(seconds=120))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    dev = torch.device("cuda", 0)
    x = torch.tensor(floats(os.path.join(data_dir, "x.f32")), dtype=torch.float32).view(samples, inputs)
    y = torch.tensor(floats(os.path.join(data_dir, "y.f32")), dtype=torch.float32).view(samples, outputs)
    shard = samples // world
    x = x[rank * shard:(rank + 1) * shard].to(dev)
    y = y[rank * shard:(rank + 1) * shard].to(dev)
    model = nn.Linear(inputs, outputs).to(dev)
    if rank == 0:  # the others start elsewhere: DDP broadcasts rank 0's parameters
        with torch.no_grad():
            model.weight.copy_(torch.tensor(floats(os.path.join(data_dir, "w0.f32"))).view(outputs, inputs))
            model.bias.copy_(torch.tensor(floats(os.path.join(data_dir, "b0.f32"))))
    ddp = DDP(model, device_ids=[0])
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    if rank == 0:
        answers.put((model.weight.detach().cpu().flatten().tolist(), model.bias.detach().cpu().tolist()))
    dist.barrier()
    dist.destroy_process_group()


def torch_ddp(backend, world, data_dir, meta):
    """Rank 0's final (weight, bias) of PyTorch DDP, or raises."""
    import torch.distributed as dist
    master = dist.TCPStore("127.0.0.1", 0, world, True, datetime.timedelta(seconds=120), wait_for_workers=False)
    ctx = mp.get_context("spawn")  # CUDA in children: never fork
    answers = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(master.port, r, world, backend, data_dir, meta, answers))
             for r in range(world)]
    for p in procs:
        p.start()
    try:
        while True:
            try:
                result = answers.get(timeout=2)
                break
            except queue.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"PyTorch ranks failed: exit codes {dead}")
        for p in procs:
            p.join(60)
        bad = [p.exitcode for p in procs if p.exitcode != 0]
        if bad:
            raise RuntimeError(f"PyTorch ranks failed: exit codes {bad}")
        return result
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()


def torch_cuda_unavailable():
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return f"PyTorch is not installed ({e.__class__.__name__}: {e})"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} has no usable CUDA (torch.cuda.is_available() is False)"
    import torch.distributed as dist
    if not dist.is_nccl_available():
        return f"torch {torch.__version__} has no NCCL"
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("program", help="path of corodist-gpu-ddp-check")
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="corodist_gpu_ddp_") as d:
        run = subprocess.run([a.program, "--out", d, "--steps", str(a.steps)], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=300)
        sys.stdout.write(run.stdout)
        if run.returncode == SKIP:  # its last line says why
            return SKIP
        if run.returncode != 0:
            print(f"FAILED: corodist-gpu-ddp-check exited with {run.returncode}")
            return 1
        why = torch_cuda_unavailable()
        if why:
            print(f"skipped: the PyTorch comparison: {why} (the reducer's own replay check passed)")
            return SKIP
        with open(os.path.join(d, "meta.txt")) as f:
            fields = f.read().split()
        meta = (int(fields[0]), int(fields[1]), int(fields[2]), int(fields[3]), float(fields[4]))
        configs = fields[5:]
        failures = 0
        for expected in ("nccl_r1", "gloo_r2"):
            if expected not in configs:
                print(f"{expected}: FAILED: corodist-gpu-ddp-check wrote no result")
                failures += 1
        for name in configs:
            backend, world = name.split("_r")
            try:
                tw, tb = torch_ddp(backend, int(world), d, meta)
            except Exception as e:  # noqa: BLE001
                print(f"{name}: FAILED: PyTorch DDP: {e}")
                failures += 1
                continue
            ours = floats(os.path.join(d, f"{name}_w.f32")) + floats(os.path.join(d, f"{name}_b.f32"))
            theirs = tw + tb
            diff = max(abs(o - t) / max(1.0, abs(t)) for o, t in zip(ours, theirs))
            if len(ours) != len(theirs) or diff > TOLERANCE:
                print(f"{name}: FAILED: max relative difference to PyTorch DDP {diff:.3g} > {TOLERANCE:g}")
                failures += 1
            else:
                print(f"{name}: OK: max relative difference to PyTorch DDP {diff:.3g} (<= {TOLERANCE:g})")
        return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
