#!/usr/bin/env python3
"""The build's check of corodist's layering, run by meson at configure time; exits
1 naming each violation:
* a layer includes only itself and the layers below it (include/corodist/<layer>/
  and src/<layer>/, public and private headers alike);
* a layer's detail/ headers (include/corodist/<layer>/detail/) are included only
  by that layer: they are its implementation, not an interface for the others;
* tools/ includes only public headers (<corodist/...> outside any detail/, or
  its own files): see tools_use_public_headers() and ENFORCE_TOOLS_RULE.
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
    "metrics": {"core", "net", "metrics"},
    "store": {"core", "net", "metrics", "store"},
    "rpc": {"core", "net", "metrics", "store", "rpc"},
    "rref": {"core", "net", "metrics", "store", "rpc", "rref"},
    "collective": {"core", "net", "metrics", "store", "collective"},
    "ddp": {"core", "net", "metrics", "store", "collective", "ddp"},
    "ft": {"core", "net", "metrics", "store", "collective", "ft"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](?:corodist/)?([a-z_]+)/')
# A header of a layer's detail/ folder: the layer it belongs to.
DETAIL_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]corodist/([a-z_]+)/detail/')
# Any include: its path.
ANY_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')
# Whether tools_use_public_headers() fails the check (True) or only reports
# what it finds (False, printed as notes; the exit code ignores them).
ENFORCE_TOOLS_RULE = True


def includes(f: pathlib.Path):
    """(line number, line) of each line of `f`."""
    return enumerate(f.read_text(errors="replace").splitlines(), 1)


def tools_use_public_headers(root: pathlib.Path) -> list:
    """tools/ (the launcher) is a client of the library like any user: it
    includes public headers only, never src/<layer>/ (private) nor a detail/
    header. Its own files (found next to the includer) are fine."""
    bad = []
    tools = root / "tools"
    if not tools.exists():
        return bad
    for f in sorted(tools.rglob("*.[hc]pp")):
        for n, line in includes(f):
            m = ANY_INCLUDE.match(line)
            if not m:
                continue
            path = m.group(1)
            first = path.split("/", 1)[0]
            where = f"{f.relative_to(root)}:{n}"
            if path.startswith("corodist/") and "/detail/" in path:
                bad.append(f"{where}: tools/ includes {path} (a detail/ header)")
            elif first in ALLOWED and "/" in path and not (f.parent / path).exists():
                bad.append(f"{where}: tools/ includes src/{path} (private to {first}/)")
    return bad


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
                for n, line in includes(f):
                    m = INCLUDE.match(line)
                    if m and m.group(1) in ALLOWED and m.group(1) not in allowed:
                        bad.append(f"{f.relative_to(root)}:{n}: {layer}/ includes {m.group(1)}/ (above it)")
                    d = DETAIL_INCLUDE.match(line)
                    if d and d.group(1) != layer:
                        bad.append(f"{f.relative_to(root)}:{n}: {layer}/ includes {d.group(1)}/detail/ "
                                   f"(private to {d.group(1)}/)")
    tools = tools_use_public_headers(root)
    if ENFORCE_TOOLS_RULE:
        bad += tools
    else:
        for t in tools:
            print(f"note (tools rule not enforced yet): {t}", file=sys.stderr)
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
