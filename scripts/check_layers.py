#!/usr/bin/env python3
"""The build's check of corodist's layering: a layer includes only itself and the
layers below it (include/corodist/<layer>/ and src/<layer>/, public and private
headers alike), and tools/ include only public headers. Run by meson at configure time; exits 1 naming each violation.
With --config-include (the test), also checks that every public header includes
corodist/core/config.hpp. Also prints the public headers, one per line, relative to include/ (the list the
build installs and compiles one by one) when given --list-headers."""
import pathlib
import re
import sys

# Each layer and the layers it may use (itself included).
ALLOWED = {
    "core": {"core"},
    "net": {"core", "net"},
    "store": {"core", "net", "store"},
    "rpc": {"core", "net", "store", "rpc"},
    "rref": {"core", "net", "store", "rpc", "rref"},
    "collective": {"core", "net", "store", "collective"},
    "ddp": {"core", "net", "store", "collective", "ddp"},
    "ft": {"core", "net", "store", "collective", "ft"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](?:corodist/)?([a-z_]+)/')


def main() -> int:
    root = pathlib.Path(__file__).resolve().parent.parent
    if "--list-headers" in sys.argv:
        for h in sorted((root / "include").glob("corodist/**/*.hpp")):
            print(h.relative_to(root / "include").as_posix())
        return 0
    bad = []
    for layer, allowed in ALLOWED.items():
        for base in (root / "include" / "corodist" / layer, root / "src" / layer):
            if not base.exists():
                continue
            for f in sorted(base.rglob("*.[hc]pp")):
                for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                    m = INCLUDE.match(line)
                    if m and m.group(1) in ALLOWED and m.group(1) not in allowed:
                        bad.append(f"{f.relative_to(root)}:{n}: {layer}/ includes {m.group(1)}/ (above it)")
    # tools/ are programs built on the installed interface: only public
    # headers (include/corodist/...), and their own files by a relative name.
    for f in sorted((root / "tools").rglob("*.[hc]pp")):
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m or m.group(1) not in ALLOWED:
                continue
            path = re.match(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', line).group(1)
            if not path.startswith("corodist/") or not (root / "include" / path).is_file():
                bad.append(f"{f.relative_to(root)}:{n}: tools/ includes the private header {path} "
                           "(tools/ use only the public headers, <corodist/LAYER/...>)")
    if "--config-include" in sys.argv:
        # Every public header includes core/config.hpp (its C++20 and flag checks) itself.
        for h in sorted((root / "include").glob("corodist/**/*.hpp")):
            if h.name == "config.hpp" and h.parent.name == "core":
                continue
            if "#include <corodist/core/config.hpp>" not in h.read_text(errors="replace"):
                bad.append(f"{h.relative_to(root)}: does not include <corodist/core/config.hpp>")
    for b in bad:
        print(b, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
