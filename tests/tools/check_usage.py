#!/usr/bin/env python3
"""Every program of examples/ and tools/ given as an argument: `PROGRAM --help`
prints its usage on stdout and exits 0; `PROGRAM --no-such-flag` prints an
error naming what is wrong on stderr and exits non-zero (not by a signal).
Neither may touch the network: the environment points MASTER_ADDR/MASTER_PORT
(and every launcher variable) at a listening socket of this script, which must
have no connection waiting once the program has ended."""
import os
import socket
import subprocess
import sys

BAD = "--no-such-flag"


def main() -> int:
    programs = sys.argv[1:]
    if not programs:
        print("usage: check_usage.py PROGRAM...", file=sys.stderr)
        return 2
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="2",
               LOCAL_RANK="0", LOCAL_WORLD_SIZE="2", TORCHELASTIC_USE_AGENT_STORE="True")
    failures = []
    for prog in programs:
        name = os.path.basename(prog)
        for args, want_ok in (([prog, "--help"], True), ([prog, BAD], False)):
            what = " ".join([name] + args[1:])
            try:
                r = subprocess.run(args, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                   timeout=60)
            except subprocess.TimeoutExpired:
                failures.append(f"{what}: still running after 60 s (waiting on the network?)")
                continue
            if want_ok:
                if r.returncode != 0:
                    failures.append(f"{what}: exit status {r.returncode}, want 0; stderr: {r.stderr!r}")
                if "usage" not in r.stdout.lower():
                    failures.append(f"{what}: no usage on stdout: {r.stdout!r}")
            else:
                if r.returncode <= 0:
                    failures.append(f"{what}: exit status {r.returncode}, want a non-zero status")
                if BAD not in r.stderr and "required" not in r.stderr:
                    failures.append(f"{what}: stderr does not say what is wrong: {r.stderr!r}")
                if r.stdout:
                    failures.append(f"{what}: wrote to stdout: {r.stdout!r}")
            try:
                conn, _ = listener.accept()
                conn.close()
                failures.append(f"{what}: connected to MASTER_ADDR:MASTER_PORT")
            except BlockingIOError:
                pass
            print(f"ok {what}: status {r.returncode}" if not failures or not failures[-1].startswith(what)
                  else f"FAILED {what}")
    for f in failures:
        print(f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
