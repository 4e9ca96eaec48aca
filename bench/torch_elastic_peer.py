"""PyTorch 1.13's answer to a worker's death, the peer of the `ft` suite of
corodist-bench: torchrun (`python3 -m torch.distributed.run --standalone
--max_restarts 3`) runs --ranks workers that train a small DDP model on gloo,
one step every --step-ms; once every rank has logged --kill-after steps, the
script kills rank 1 with SIGKILL, torchrun stops the other workers, restarts
them all, they rendezvous again and train on. The time measured is from the
kill to the first step completed after the restart (torchrun's semantics: the
whole job restarts; DDP has no state to recover here, so the figure is a lower
bound of a real job's). Prints one JSON line per run:
{"case": "kill9_to_step", "seconds": ..., "monitor_interval": ...}.

Usage: /usr/bin/python3 bench/torch_elastic_peer.py [--ranks N] [--runs K] [--monitor-interval S]
(the script runs itself with --worker under torchrun)
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time


def worker(log_dir, step_ms):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    with open(os.path.join(log_dir, f"pid.{rank}.{restart}"), "w") as f:
        f.write(str(os.getpid()))
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    log = open(os.path.join(log_dir, f"steps.{rank}.{restart}"), "a", buffering=1)
    step = 0
    while True:
        x = torch.randn(8, 64)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(step_ms / 1000.0)
        log.write(f"{step} {time.time()}\n")
        step += 1


def read_steps(path):
    try:
        with open(path) as f:
            return [line.split() for line in f if line.strip()]
    except FileNotFoundError:
        return []


def one_run(ranks, kill_after, step_ms, monitor_interval, deadline_s):
    with tempfile.TemporaryDirectory(prefix="corodist-elastic-") as d:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
               "--max_restarts=3", f"--monitor_interval={monitor_interval}",
               # 1, not the default 0: Python 3.11 reads "0" as None in 1.13 (Std.from_str)
               "--redirects=1", "--tee=1", os.path.abspath(__file__),
               "--worker", d, "--step-ms", str(step_ms)]
        env = dict(os.environ, OMP_NUM_THREADS="1", LOGLEVEL="ERROR")
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        try:
            start = time.time()
            while min(len(read_steps(os.path.join(d, f"steps.{r}.0"))) for r in range(ranks)) < kill_after:
                if time.time() - start > deadline_s or p.poll() is not None:
                    raise RuntimeError("the job never reached the kill point")
                time.sleep(0.005)
            with open(os.path.join(d, "pid.1.0")) as f:
                victim = int(f.read())
            killed = time.time()
            os.kill(victim, signal.SIGKILL)
            while True:
                firsts = [read_steps(os.path.join(d, f"steps.{r}.1")) for r in range(ranks)]
                done = [float(s[0][1]) for s in firsts if s]
                if done:
                    return min(done) - killed
                if time.time() - killed > deadline_s or p.poll() is not None:
                    raise RuntimeError("no step after the restart")
                time.sleep(0.005)
        finally:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--kill-after", type=int, default=10)
    ap.add_argument("--step-ms", type=float, default=20)
    ap.add_argument("--monitor-interval", type=float, default=0.5)
    ap.add_argument("--deadline", type=float, default=120)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker, a.step_ms)
        return
    for _ in range(a.runs):
        s = one_run(a.ranks, a.kill_after, a.step_ms, a.monitor_interval, a.deadline)
        print(json.dumps({"case": "kill9_to_step", "seconds": s, "monitor_interval": a.monitor_interval}),
              flush=True)


if __name__ == "__main__":
    main()
