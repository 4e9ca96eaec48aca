#!/usr/bin/env python3
"""Compiles every C++ snippet of README.md and docs/*.md, as pasted.

A block opened with ```cpp is a whole translation unit and is compiled as it
is. A block opened with ```cpp fragment is a piece of a coroutine body: it is
compiled inside `asio::awaitable<void> fragment() { ... co_return; }`, after
every public header and `using namespace std::chrono_literals;` (so it must
declare the names it uses). Each snippet is compiled with -fsyntax-only and the
library's flags; a failure names the file and line of the block.
Usage: check_snippets.py SOURCE_DIR -- COMPILER... FLAGS...   (run by `meson test`)"""
import concurrent.futures
import pathlib
import re
import subprocess
import sys
import tempfile

FENCE = re.compile(r"^```cpp( fragment)?\s*$")


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
            yield md.relative_to(root), start + 1, bool(m.group(1)), "\n".join(lines[start:end])
            i = end + 1


def wrap(code: str, root: pathlib.Path) -> str:
    headers = sorted(h.relative_to(root / "include").as_posix() for h in (root / "include").rglob("*.hpp"))
    prelude = "".join(f"#include <{h}>\n" for h in headers)
    return (prelude + "using namespace std::chrono_literals;\n"
            "[[maybe_unused]] asio::awaitable<void> fragment() {\n" + code + "\nco_return;\n}\n")


def main() -> int:
    root = pathlib.Path(sys.argv[1])
    sep = sys.argv.index("--")
    compiler = sys.argv[sep + 1:]
    found = list(snippets(root))
    if not found:
        print("no C++ snippets found: the extractor is broken")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        def check(n_snippet):
            n, (md, line, fragment, code) = n_snippet
            src = pathlib.Path(tmp) / f"snippet_{n}.cpp"
            src.write_text(f'#line 1 "{md}:{line}"\n' + (wrap(code, root) if fragment else code) + "\n")
            p = subprocess.run([*compiler, "-fsyntax-only", "-I", str(root / "include"), str(src)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            return md, line, fragment, p

        failed = 0
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            for md, line, fragment, p in pool.map(check, enumerate(found)):
                kind = "fragment" if fragment else "program"
                if p.returncode == 0:
                    print(f"ok   {md}:{line} ({kind})")
                else:
                    failed += 1
                    print(f"FAIL {md}:{line} ({kind}) does not compile:\n{p.stdout}")
    print(f"{len(found) - failed} of {len(found)} snippets compile")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
