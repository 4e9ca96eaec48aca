#!/usr/bin/env python3
"""Draws a corodist timeline (the trace-event JSON of corodist-run --timeline
or store::timeline_json) as a PNG: one row per rank and recorder, each
entry's span a bar, gradient marks and other instants as ticks, RPC flows
(caller -> callee) as arrows.

  /usr/bin/python3 scripts/plot_timeline.py trace.json out.png [--last-ms 5]
      [--from-ms A --to-ms B] [--tracks REGEX] [--title TEXT]

Times are milliseconds from the trace's origin (otherData.time_origin_unix_ns).
Needs matplotlib (Debian's python3-matplotlib)."""
import argparse
import json
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"failed": "#d62728", "started": "#ff7f0e"}
OP_COLORS = {"call": "#1f77b4", "serve": "#2ca02c", "bucket": "#9467bd", "allreduce": "#8c564b",
             "wait": "#7f7f7f", "get": "#bcbd22", "set": "#17becf", "add": "#e377c2"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("png")
    ap.add_argument("--from-ms", type=float)
    ap.add_argument("--to-ms", type=float)
    ap.add_argument("--last-ms", type=float, help="only the last N ms of the trace")
    ap.add_argument("--tracks", help="only the tracks whose name ('rank N: layer name') matches this regex")
    ap.add_argument("--title", default="")
    a = ap.parse_args()

    doc = json.load(open(a.trace))
    events = doc["traceEvents"]
    names = {}
    for e in events:
        if e["ph"] == "M" and e["name"] == "thread_name":
            names[(e["pid"], e["tid"])] = "rank %d: %s" % (e["pid"], e["args"]["name"])
    spans = [e for e in events if e["ph"] == "X"]
    instants = [e for e in events if e["ph"] == "i"]
    if not spans and not instants:
        sys.exit("no events in " + a.trace)
    end = max([(e["ts"] + e["dur"]) / 1e3 for e in spans] + [e["ts"] / 1e3 for e in instants])
    lo, hi = a.from_ms, a.to_ms
    if a.last_ms is not None:
        lo, hi = end - a.last_ms, end
    lo = lo if lo is not None else 0.0
    hi = hi if hi is not None else end

    def keep(e, t0, t1):
        key = (e["pid"], e["tid"])
        if a.tracks and not re.search(a.tracks, names.get(key, "")):
            return False
        return t1 >= lo and t0 <= hi

    spans = [e for e in spans if keep(e, e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3)]
    instants = [e for e in instants if keep(e, e["ts"] / 1e3, e["ts"] / 1e3)]
    rows = sorted({(e["pid"], e["tid"]) for e in spans + instants})
    if not rows:
        sys.exit("no events in the window")
    y = {k: i for i, k in enumerate(rows)}

    fig, ax = plt.subplots(figsize=(14, 0.55 * len(rows) + 1.6))
    for e in spans:
        t0 = max(e["ts"] / 1e3, lo)
        t1 = min((e["ts"] + e["dur"]) / 1e3, hi)
        state = e["args"].get("state", "")
        color = COLORS.get(state) or OP_COLORS.get(e.get("cat", ""), "#aec7e8")
        ax.broken_barh([(t0, max(t1 - t0, (hi - lo) * 1e-4))], (y[(e["pid"], e["tid"])] - 0.35, 0.7),
                       facecolors=color, edgecolors="black", linewidth=0.3)
        if t1 - t0 > (hi - lo) / 25:
            ax.text((t0 + t1) / 2, y[(e["pid"], e["tid"])], e["name"], ha="center", va="center", fontsize=6,
                    clip_on=True)
    for e in instants:
        t = e["ts"] / 1e3
        ax.plot([t, t], [y[(e["pid"], e["tid"])] - 0.35, y[(e["pid"], e["tid"])] + 0.35], color="black",
                linewidth=0.8)
    # Flows: "s" at the caller's span, "f" at the callee's, sharing an id.
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    for f in (e for e in events if e["ph"] == "f"):
        s = starts.get(f["id"])
        if not s or (s["pid"], s["tid"]) not in y or (f["pid"], f["tid"]) not in y:
            continue
        ts, tf = s["ts"] / 1e3, f["ts"] / 1e3
        if not (lo <= ts <= hi and lo <= tf <= hi):
            continue
        ax.annotate("", xy=(tf, y[(f["pid"], f["tid"])]), xytext=(ts, y[(s["pid"], s["tid"])]),
                    arrowprops=dict(arrowstyle="->", color="#444444", linewidth=0.6))
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([names.get(k, str(k)) for k in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(lo, hi)
    ax.set_xlabel("ms since the trace's origin (one clock for all ranks: %s)" %
                  ", ".join("rank %d offset %.3f ms +- %.3f" % (r["rank"], r["clock_offset_ns"] / 1e6,
                                                                 r["offset_error_ns"] / 1e6)
                            for r in doc.get("otherData", {}).get("ranks", [])[:4]), fontsize=8)
    ax.grid(axis="x", linewidth=0.3)
    if a.title:
        ax.set_title(a.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(a.png, dpi=130)
    print("%s: %d spans, %d instants, %d tracks, %.3f-%.3f ms" % (a.png, len(spans), len(instants), len(rows), lo, hi))


if __name__ == "__main__":
    main()
