"""Prints one closing line, 'N passed, N failed', counting Boost.Test cases
across all suites of a `meson test` run (from meson-logs/testlog.json)."""
import json
import re
import sys

passed = failed = skipped = 0
for line in open(sys.argv[1]):
    t = json.loads(line)
    out = (t.get("stdout") or "") + (t.get("stderr") or "")
    m = re.search(r"(\d+) test cases? out of (\d+) passed", out)
    f = re.search(r"(\d+) test cases? out of \d+ failed", out)
    s = re.search(r"(\d+) test cases? out of \d+ skipped", out)
    if m:
        passed += int(m.group(1))
        failed += int(f.group(1)) if f else 0
        skipped += int(s.group(1)) if s else 0
    elif t.get("result") == "OK":
        passed += 1
    elif t.get("result") == "SKIP":
        skipped += 1
    else:
        failed += 1
print(f"{passed} passed, {failed} failed, {skipped} skipped")
