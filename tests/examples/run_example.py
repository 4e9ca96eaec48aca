#!/usr/bin/env python3
"""Runs an example (examples/) and checks its output: exit status 0 and COUNT
lines matching PATTERN (a regex, searched in each line). A bounded run: the
example is killed after 20 s (each takes well under a second: a
longer run is a hang, e.g. a loop kept busy by a forgotten timer).
Usage: run_example.py PATTERN COUNT -- COMMAND...   (run by `meson test`)"""
import re
import subprocess
import sys


def main() -> int:
    pattern, count, sep, *cmd = sys.argv[1:]
    assert sep == "--" and cmd, __doc__
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=20, text=True)
    except subprocess.TimeoutExpired as e:
        print(f"{cmd[0]} did not finish within 20 s; its output:\n{e.output or ''}")
        return 1
    print(p.stdout, end="")
    if p.returncode != 0:
        print(f"FAIL: exit status {p.returncode}")
        return 1
    found = [line for line in p.stdout.splitlines() if re.search(pattern, line)]
    if len(found) != int(count):
        print(f"FAIL: {len(found)} lines match '{pattern}', expected {count}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
