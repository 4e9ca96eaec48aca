"""Draws one corodist-bench run (its --json lines) as a PNG: latency per case
against the raw floor and the peers (log scale), the failure paths apart (how
long an error takes to surface), then the throughput cases (ops/s, and GB/s
for bulk transfers) with theirs. A peer figure that measures something else
(a peer_note) is drawn hatched, with its note. A --quick run says so in the
title. Needs matplotlib (Debian's python3-matplotlib, under /usr/bin/python3).

Usage: /usr/bin/python3 scripts/bench_plot.py RUN.jsonl [-o RUN.png]
"""
import argparse
import collections
import json
import math
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PEER_COLORS = {"pytorch": "#e6862e", "pytorch-client@corodist": "#f3c48f", "grpc": "#3b9c50"}
OURS = "#2f6db5"
THROUGHPUT_KEYS = ("in_flight", "clients", "connections")  # cases measured as ops/s with many in flight
MIB = 1 << 20


def load(path):
    """Cases in run order: (suite, case) -> {"rec": first line, "peers": [peer lines]}."""
    cases = collections.OrderedDict()
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            c = cases.setdefault((r["suite"], r["case"]), {"rec": r, "peers": []})
            if "peer" in r:
                c["peers"].append(r)
    return cases


def finite(v):
    return isinstance(v, (int, float)) and math.isfinite(v)


def size_of(r):
    for k in ("bytes", "argument_bytes", "message_bytes"):
        if finite(r.get(k)):
            return r[k]
    return 0


def kind(r, peers):
    if r.get("kind") == "error_path":
        return "errors"
    if finite(r.get("ops_per_s")) and (any(k in r for k in THROUGHPUT_KEYS) or
                                       any(finite(p.get("peer_ops_per_s")) for p in peers)):
        return "ops"
    if finite(r.get("gbytes_per_s")) and size_of(r) >= MIB:
        return "gbytes"
    if finite(r.get("p50_us")) or any(finite(p.get("peer_p50_us")) for p in peers):
        return "latency"
    return None  # rendezvous time, memory: not drawn


def bars(ax, rows, value_key, peer_key, fmt, log):
    """Grouped horizontal bars: per case, corodist then each peer; missing peers are labelled."""
    labels, y = [], 0.0
    seen = set()
    for name, r, peers in rows:
        if r.get("suite") == "raw":  # the floor's own cases: bare sockets, not corodist
            group = [("raw sockets", r.get(value_key), "#e8a09a", "", "")]
        else:
            group = [("corodist", r.get(value_key), OURS, "", "")]
        for p in peers:
            status = p.get("peer_status", "")
            group.append((p["peer"], p.get(peer_key), PEER_COLORS.get(p["peer"], "#999999"), status,
                          p.get("peer_note", "")))
        top = y
        for who, v, color, status, note in group:
            label = who if who not in seen else None
            if finite(v) and v > 0:
                # A figure of something else (e.g. a one-way send against our round trip): hatched, with its note.
                ax.barh(y, v, height=0.8, color=color, label=label, hatch="///" if note else None,
                        edgecolor="white" if note else None)
                ax.text(v, y, " " + fmt(v) + (f"  ({note}; not compared)" if note else ""), va="center", fontsize=7)
                seen.add(who)
            else:
                why = status or ("not yet" if who == "corodist" else "no figure")
                ax.text(ax.get_xlim()[0] if log else 0, y, f"  {who}: {why}", va="center", fontsize=7,
                        color="#666666")
            y += 1
        labels.append(((top + y - 1) / 2, name))
        y += 0.8
    ax.set_yticks([p for p, _ in labels])
    ax.set_yticklabels([n for _, n in labels], fontsize=8)
    ax.invert_yaxis()
    if log:
        ax.set_xscale("log")
    ax.grid(axis="x", alpha=0.3, which="both")
    return y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("json")
    ap.add_argument("-o", "--output")
    a = ap.parse_args()
    cases = load(a.json)
    if not cases:
        sys.exit(f"bench_plot: no records in {a.json}")
    groups = {"latency": [], "errors": [], "ops": [], "gbytes": []}
    for (suite, name), c in cases.items():
        k = kind(c["rec"], c["peers"])
        if k:
            groups[k].append((f"{suite} {name}", c["rec"], c["peers"]))
    first = next(iter(cases.values()))["rec"]
    panels = [k for k in ("latency", "errors", "ops", "gbytes") if groups[k]]
    heights = [max(2.0, 0.28 * sum(1 + len(p) for _, _, p in groups[k]) + 0.8) for k in panels]
    total = sum(heights) + 1.2
    fig, axes = plt.subplots(len(panels), 1, figsize=(13, total),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, k in zip(axes[:, 0], panels):
        rows = groups[k]
        if k == "latency":
            vals = [r.get("p50_us") for _, r, _ in rows] + [p.get("peer_p50_us") for _, _, ps in rows for p in ps]
            vals = [v for v in vals if finite(v) and v > 0]
            ax.set_xlim(min(vals + [first.get("raw_p50_us", 1)]) / 2, max(vals) * 4)
            bars(ax, rows, "p50_us", "peer_p50_us", lambda v: f"{v:.1f} µs", log=True)
            floor = first.get("raw_p50_us")
            if finite(floor):
                ax.axvline(floor, color="#c0392b", linestyle="--", linewidth=1.2,
                           label=f"raw floor {floor:.1f} µs (64 B TCP ping-pong)")
            ax.set_title("p50 latency (lower is better; log scale)", fontsize=10, loc="left")
            ax.set_xlabel("µs")
        elif k == "errors":
            vals = [r.get("p50_us") for _, r, _ in rows]
            vals = [v for v in vals if finite(v) and v > 0]
            ax.set_xlim(min(vals) / 2, max(vals) * 4)
            bars(ax, rows, "p50_us", "peer_p50_us", lambda v: f"{v:.1f} µs", log=True)
            ax.set_title("failure paths: how long until the error, or past the deadline (lower is better; log scale)",
                         fontsize=10, loc="left")
            ax.set_xlabel("µs (p50)")
        elif k == "ops":
            vals = [r.get("ops_per_s") for _, r, _ in rows] + [p.get("peer_ops_per_s") for _, _, ps in rows for p in ps]
            vals += [r.get("raw_fanin_ops_per_s") for _, r, _ in rows]
            vals = [v for v in vals if finite(v) and v > 0]
            ax.set_xlim(min(vals) / 2, max(vals) * 4)
            bars(ax, rows, "ops_per_s", "peer_ops_per_s", lambda v: f"{v:,.0f}/s", log=True)
            for i, (_, r, _) in enumerate(rows):
                if finite(r.get("raw_fanin_ops_per_s")):
                    ax.axvline(r["raw_fanin_ops_per_s"], color="#c0392b", linestyle=":", linewidth=1.2,
                               label=f"raw fan-in floor {r['raw_fanin_ops_per_s']:,.0f}/s (64 conns)")
            ax.set_title("throughput, many calls in flight (higher is better; log scale)", fontsize=10, loc="left")
            ax.set_xlabel("operations / s")
        else:
            vals = [r.get("gbytes_per_s") for _, r, _ in rows] + [p.get("peer_gbytes_per_s") for _, _, ps in rows
                                                                  for p in ps]
            vals = [v for v in vals if finite(v) and v > 0] + [first.get("raw_gbytes_per_s", 1)]
            ax.set_xlim(0, max(vals) * 1.3)
            bars(ax, rows, "gbytes_per_s", "peer_gbytes_per_s", lambda v: f"{v:.2f} GB/s", log=False)
            bulk = first.get("raw_gbytes_per_s")
            if finite(bulk):
                ax.axvline(bulk, color="#c0392b", linestyle="--", linewidth=1.2, label=f"raw bulk {bulk:.2f} GB/s")
            ax.set_title("bulk transfer (higher is better)", fontsize=10, loc="left")
            ax.set_xlabel("GB/s (1e9 bytes / s)")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    quick = first.get("mode") == "quick"
    title = (f"corodist-bench — {first.get('backend', '?')}, pinned={'yes' if first.get('pinned') else 'no'}; "
             "peers measured in the same run with the same pinning")
    if quick:
        title = "QUICK RUN (--quick: fewer samples, a smoke test, not figures to compare) — " + title
    fig.suptitle(title, fontsize=10, y=1 - 0.15 / total, va="top", color="#c0392b" if quick else "black")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.55 / total))  # room for the title above the first panel
    out = a.output or a.json.rsplit(".", 1)[0] + ".png"
    fig.savefig(out, dpi=110, bbox_inches="tight")
    print(f"bench_plot: wrote {out}")


if __name__ == "__main__":
    main()
