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
    tracks = sorted({(e["pid"], e["tid"]) for e in spans + instants})
    if not tracks:
        sys.exit("no events in the window")
    # Spans of one track that overlap (two buckets' allreduces in flight) go on lanes of their own.
    lane_of = {}
    lanes = {k: [] for k in tracks}  # per track: each lane's end
    for e in sorted(spans, key=lambda e: e["ts"]):
        ends = lanes[(e["pid"], e["tid"])]
        for i, end_t in enumerate(ends):
            if end_t <= e["ts"]:
                ends[i] = e["ts"] + e["dur"]
                lane_of[id(e)] = i
                break
        else:
            ends.append(e["ts"] + e["dur"])
            lane_of[id(e)] = len(ends) - 1
    rows, base = [], {}
    for k in tracks:
        base[k] = len(rows)
        for i in range(max(1, len(lanes[k]))):
            rows.append(names.get(k, str(k)) if i == 0 else "")

    def row(e):
        return base[(e["pid"], e["tid"])] + lane_of.get(id(e), 0)

    fig, ax = plt.subplots(figsize=(14, 0.5 * len(rows) + 1.6))
    for e in spans:
        t0 = max(e["ts"] / 1e3, lo) - lo
        t1 = min((e["ts"] + e["dur"]) / 1e3, hi) - lo
        state = e["args"].get("state", "")
        color = COLORS.get(state) or OP_COLORS.get(e.get("cat", ""), "#aec7e8")
        ax.broken_barh([(t0, max(t1 - t0, (hi - lo) * 1e-4))], (row(e) - 0.35, 0.7),
                       facecolors=color, edgecolors="black", linewidth=0.3)
        if t1 - t0 > (hi - lo) / 25:
            peer = e["args"].get("peer", "")
            label = e["name"] + (" \u2192 " + peer if e.get("cat") == "call" and peer else "")
            ax.text((t0 + t1) / 2, row(e), label, ha="center", va="center", fontsize=6, clip_on=True)
    for e in instants:
        t = e["ts"] / 1e3 - lo
        ax.plot([t, t], [row(e) - 0.35, row(e) + 0.35], color="black", linewidth=0.8)
        ax.text(t, row(e) - 0.4, e["name"].replace("mark ", ""), ha="center", va="bottom", fontsize=6)
    # Flows: "s" at the caller's span, "f" at the callee's, sharing an id.
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    span_at = {(e["pid"], e["tid"], e["ts"]): e for e in spans}
    for f in (e for e in events if e["ph"] == "f"):
        s = starts.get(f["id"])
        src = span_at.get((s["pid"], s["tid"], s["ts"])) if s else None
        dst = span_at.get((f["pid"], f["tid"], f["ts"]))
        if not src or not dst:
            continue
        ts, tf = s["ts"] / 1e3, f["ts"] / 1e3
        if not (lo <= ts <= hi and lo <= tf <= hi):
            continue
        ax.annotate("", xy=(tf - lo, row(dst)), xytext=(ts - lo, row(src)),
                    arrowprops=dict(arrowstyle="->", color="#444444", linewidth=0.6))
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(rows, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, hi - lo)
    ax.set_xlabel("ms from %.3f ms after the trace's origin (clocks: %s)" % (lo,
                  ", ".join("rank %d offset %.3f ms +- %.3f" % (r["rank"], r["clock_offset_ns"] / 1e6,
                                                                 r["offset_error_ns"] / 1e6)
                            for r in doc.get("otherData", {}).get("ranks", [])[:4])), fontsize=8)
    ax.grid(axis="x", linewidth=0.3)
    if a.title:
        ax.set_title(a.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(a.png, dpi=130)
    print("%s: %d spans, %d instants, %d tracks, %.3f-%.3f ms" % (a.png, len(spans), len(instants), len(rows), lo, hi))


if __name__ == "__main__":
    main()
