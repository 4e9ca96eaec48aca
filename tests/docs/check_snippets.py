#!/usr/bin/env python3
"""Compiles every C++ snippet of README.md and docs/*.md as pasted, and runs
the ones that are whole programs.

A block opened with ```cpp is a whole translation unit and is compiled as it
is. A block opened with ```cpp fragment is a piece of a coroutine body: it is
compiled inside `asio::awaitable<void> fragment() { ... co_return; }`, after
every public header and `using namespace std::chrono_literals;` (so it must
declare the names it uses). Each snippet is compiled with -fsyntax-only and the
library's flags; a failure names the file and line of the block.

With --run, every whole program (a block with `int main`) is also built
against the library and run, and must exit 0 within RUN_TIMEOUT seconds, so
that a snippet that compiles but throws fails the test. Words after `cpp` in
the fence say how it runs:
  (none)            alone
  ranks=N           as N ranks under corodist-run (RANK, WORLD_SIZE, MASTER_ADDR,
                    MASTER_PORT set, rank 0 hosting the store)
  pytorch-ranks=N   as the last rank of a job whose N other ranks are PyTorch
                    processes (tests/docs/torch_gloo_ranks.py: they make the
                    TCPStore master on MASTER_ADDR:MASTER_PORT and allreduce
                    1000 ones); skipped, saying so, where PyTorch is missing
  norun             compiled only (say in the text around it why it cannot run)
Usage: check_snippets.py SOURCE_DIR [--run LIBDIR CORODIST_RUN PYTHON] -- COMPILER... FLAGS...
(run by `meson test`)"""
import concurrent.futures
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile

FENCE = re.compile(r"^```cpp((?:[ \t]+[\w-]+(?:=\S+)?)*)[ \t]*$")
RUN_TIMEOUT = 120


def attributes(text: str) -> dict:
    out = {}
    for word in text.split():
        key, _, value = word.partition("=")
        out[key] = value
    return out


def snippets(root: pathlib.Path):
    for md in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        lines = md.read_text().splitlines()
        i = 0
        while i < len(lines):
            m = FENCE.match(lines[i])
            if not m:
                i += 1
                continue
            start = i + 1
            end = start
            while end < len(lines) and lines[end].strip() != "```":
                end += 1
            yield md.relative_to(root), start + 1, attributes(m.group(1)), "\n".join(lines[start:end])
            i = end + 1


def wrap(code: str, root: pathlib.Path) -> str:
    headers = sorted(h.relative_to(root / "include").as_posix() for h in (root / "include").rglob("*.hpp"))
    prelude = "".join(f"#include <{h}>\n" for h in headers)
    return (prelude + "using namespace std::chrono_literals;\n"
            "[[maybe_unused]] asio::awaitable<void> fragment() {\n" + code + "\nco_return;\n}\n")


def torch_available(python: str) -> bool:
    try:
        return subprocess.run([python, "-c", "import torch.distributed as d; assert d.is_gloo_available()"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def run_bounded(cmd: list, env: dict):
    """Runs cmd for at most RUN_TIMEOUT s; returns (exit status or None on timeout, output). On
    timeout it gets SIGTERM first (corodist-run passes it to its ranks), then SIGKILL."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        out = p.communicate(timeout=RUN_TIMEOUT)[0]
        return p.returncode, out
    except subprocess.TimeoutExpired:
        p.terminate()
        try:
            return None, p.communicate(timeout=15)[0]
        except subprocess.TimeoutExpired:
            p.kill()
            return None, ""


def run_program(exe: str, attrs: dict, run: dict, root: pathlib.Path):
    """Runs one built snippet as its fence says; returns (ok, what, output), ok None when skipped."""
    env = dict(os.environ)
    if "ranks" in attrs:
        n = attrs["ranks"]
        rc, out = run_bounded([run["corodist_run"], "--nproc-per-node", n, "--", exe], env)
        return rc == 0, f"{n} ranks under corodist-run, " + ending(rc), out
    if "pytorch-ranks" in attrs:
        if not torch_available(run["python"]):
            return None, f"skipped: {run['python']} cannot import torch with gloo", ""
        n = int(attrs["pytorch-ranks"])
        # A session of their own: the ranks are the script's children, and all go together.
        peers = subprocess.Popen([run["python"], str(root / "tests/docs/torch_gloo_ranks.py"), str(n)],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 start_new_session=True)

        def stop():
            try:
                os.killpg(peers.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        try:
            first = peers.stdout.readline()
            if not first.startswith("PORT "):
                stop()
                return False, "the PyTorch ranks did not start", first + peers.communicate()[0]
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=first.split()[1])
            rc, out = run_bounded([exe], env)
            if rc != 0:  # the PyTorch ranks would wait for it until their own timeout
                stop()
            try:
                rest = peers.communicate(timeout=RUN_TIMEOUT)[0]
            except subprocess.TimeoutExpired:
                stop()
                rest = peers.communicate()[0]
        finally:
            stop()
        return (rc == 0 and peers.returncode == 0,
                f"rank {n} beside {n} PyTorch ranks, {ending(rc)} (PyTorch ranks: exit status {peers.returncode})",
                out + "--- PyTorch ranks:\n" + first + rest)
    rc, out = run_bounded([exe], env)
    return rc == 0, "alone, " + ending(rc), out


def ending(rc) -> str:
    return f"did not finish within {RUN_TIMEOUT} s" if rc is None else f"exit status {rc}"


def main() -> int:
    root = pathlib.Path(sys.argv[1])
    sep = sys.argv.index("--")
    compiler = sys.argv[sep + 1:]
    run = None
    if "--run" in sys.argv[:sep]:
        i = sys.argv.index("--run")
        run = {"libdir": sys.argv[i + 1], "corodist_run": sys.argv[i + 2],
               "python": os.environ.get("CORODIST_TEST_PYTHON", sys.argv[i + 3])}
    found = list(snippets(root))
    if not found:
        print("no C++ snippets found: the extractor is broken")
        return 1
    failed = ran = 0
    with tempfile.TemporaryDirectory() as tmp:
        def check(n_snippet):
            n, (md, line, attrs, code) = n_snippet
            fragment = "fragment" in attrs
            src = pathlib.Path(tmp) / f"snippet_{n}.cpp"
            src.write_text(f'#line 1 "{md}:{line}"\n' + (wrap(code, root) if fragment else code) + "\n")
            runnable = run is not None and not fragment and "norun" not in attrs and "int main" in code
            if runnable:
                exe = str(pathlib.Path(tmp) / f"snippet_{n}")
                cmd = [*compiler, "-O0", "-I", str(root / "include"), str(src), "-o", exe, "-L", run["libdir"],
                       "-Wl,-rpath," + run["libdir"], "-lcorodist", "-pthread"]
            else:
                exe = None
                cmd = [*compiler, "-fsyntax-only", "-I", str(root / "include"), str(src)]
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            return md, line, attrs, fragment, exe if p.returncode == 0 else None, p

        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            built = list(pool.map(check, enumerate(found)))
        for md, line, attrs, fragment, exe, p in built:
            kind = "fragment" if fragment else "program"
            if p.returncode != 0:
                failed += 1
                print(f"FAIL {md}:{line} ({kind}) does not compile:\n{p.stdout}")
                continue
            if exe is None:
                print(f"ok   {md}:{line} ({kind})")
                continue
            ok, what, output = run_program(exe, attrs, run, root)
            if ok is None:
                print(f"ok   {md}:{line} ({kind}; not run, {what})")
            elif ok:
                ran += 1
                print(f"ok   {md}:{line} ({kind}; ran {what})")
            else:
                failed += 1
                print(f"FAIL {md}:{line} ({kind}) compiles but its run failed: {what}; its output:\n{output}")
    print(f"{len(found) - failed} of {len(found)} snippets compile" + (f" ({ran} programs run)" if run else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
