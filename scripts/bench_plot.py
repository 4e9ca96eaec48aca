"""Draws one corodist-bench run (its --json lines) as a PNG: latency per case
against the raw floor and the peers (log scale), the failure paths apart (how
long an error takes to surface), then the throughput cases (ops/s, and GB/s
for bulk transfers) with theirs. A peer figure that measures something else
(a peer_note) is drawn hatched, with its note. A --quick run says so in the
title. Needs matplotlib (Debian's python3-matplotlib, under /usr/bin/python3).

When the run has cases at several rank counts (the store suite's
rendezvous_N_ranks, the allreduce suite's gloo_rN_SIZE, the all_to_all
suite's even_rN_SIZE), a second PNG beside the first (RUN-scaling.png) draws
how they grow, log-log, ours and the peer: rendezvous time and the store
server's memory per connection against ranks (with Meta's published figure
for PyTorch's libuv TCPStore, 96K ranks in about 100 s, as an anchor
measured on another machine), and the allreduce and all_to_all_single p50
against ranks per size.

Cases with a raw figure of their own (the p2p suite's ping-pong and stream,
against the raw ping-pong and bulk transfer of the same size) get a red tick
at it on their bar; the run's floor line is the 64 B ping-pong / bulk.

Usage: /usr/bin/python3 scripts/bench_plot.py RUN.jsonl [-o RUN.png]
"""
import argparse
import collections
import json
import math
import re
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


def peer_value(r, p, key):
    """The peer line `p`'s figure `key` for case `r`; a collective's peer GB/s is its algbw, from its p50."""
    v = p.get(key)
    if key == "peer_gbytes_per_s" and not finite(v) and finite(p.get("peer_p50_us")) and size_of(r) > 0:
        v = size_of(r) / p["peer_p50_us"] * 1e-3
    return v


def run_floor(r, key):
    """The run's floor (raw_p50_us or raw_gbytes_per_s) from record `r`: its own raw figure, unless the
    case has one of its own (the p2p suite's, of the same size), which carries the run's as floor_*."""
    own = r.get(key.replace("raw_", "floor_"))
    return own if finite(own) else r.get(key)


def bars(ax, rows, value_key, peer_key, fmt, log, raw_key=None):
    """Grouped horizontal bars: per case, corodist then each peer; missing peers are labelled. A case
    with a raw figure of its own (`raw_key`, where the case carries the run's floor as floor_*: the p2p
    suite's raw ping-pong and bulk transfer of the same size) gets a red tick there on its corodist bar."""
    labels, y = [], 0.0
    seen = set()
    for name, r, peers in rows:
        own_raw = r.get(raw_key) if raw_key and finite(r.get(raw_key.replace("raw_", "floor_"))) else None
        if finite(own_raw) and own_raw > 0:
            label = "raw sockets, same size" if "raw sockets, same size" not in seen else None
            ax.plot([own_raw], [y], marker="|", markersize=11, markeredgewidth=2, color="#c0392b", linestyle="",
                    label=label)
            seen.add("raw sockets, same size")
        if r.get("suite") == "raw":  # the floor's own cases: bare sockets, not corodist
            group = [("raw sockets", r.get(value_key), "#e8a09a", "", "")]
        else:
            group = [("corodist", r.get(value_key), OURS, "", "")]
        for p in peers:
            status = p.get("peer_status", "")
            group.append((p["peer"], peer_value(r, p, peer_key), PEER_COLORS.get(p["peer"], "#999999"), status,
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


LIBUV_ANCHOR = (96 * 1024, 100.0)  # PyTorch's libuv TCPStore: ~100 s for 96K ranks (Meta's figure, another machine)
IDLE_TARGET_BYTES = 4096  # the target: <= 4 KB of server memory per idle connection


def scaling_rows(cases, suite_name, pattern):
    """Records of `suite_name` whose case matches `pattern` (groups: ranks, size), by size then ranks;
    only sizes measured at more than one rank count."""
    by_size = collections.defaultdict(dict)
    for (suite, name), c in cases.items():
        r = c["rec"]
        m = re.fullmatch(pattern, name)
        if suite == suite_name and m and finite(r.get("p50_us")):
            by_size[m.group(2)][int(m.group(1))] = r
    return {k: v for k, v in by_size.items() if len(v) > 1}


def rendezvous_rows(cases):
    """The store suite's rendezvous records by ranks."""
    rdzv = {}
    for (suite, name), c in cases.items():
        m = re.fullmatch(r"rendezvous_(\d+)_ranks", name)
        if suite == "store" and m:
            rdzv[int(m.group(1))] = c["rec"]
    return rdzv


def line(ax, xs, ys, **kw):
    pts = [(x, y) for x, y in zip(xs, ys) if finite(y) and y > 0]
    if pts:
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", **kw)
    return pts


def draw_scaling(cases, out, title):
    rdzv = rendezvous_rows(cases)
    collectives = {  # panel: (suite, case pattern with groups ranks and size, title)
        "allreduce": ("allreduce", r"gloo_r(\d+)_(\w+)", "Gloo allreduce p50 against ranks (dashed: PyTorch)"),
        "all_to_all": ("all_to_all", r"even_r(\d+)_(\w+)",
                       "Gloo all_to_all_single (even splits) p50 against ranks (dashed: PyTorch)"),
    }
    measured = {k: scaling_rows(cases, suite, pattern) for k, (suite, pattern, _) in collectives.items()}
    panels = (["time", "memory"] if len(rdzv) > 1 else []) + [k for k in collectives if measured[k]]
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 5), squeeze=False)
    for ax, k in zip(axes[0], panels):
        ranks = sorted(rdzv)
        if k == "time":
            line(ax, ranks, [rdzv[n].get("rendezvous_s") for n in ranks], color=OURS, label="corodist")
            line(ax, ranks, [rdzv[n].get("peer_rendezvous_s") for n in ranks], color=PEER_COLORS["pytorch"],
                 label="PyTorch 1.13 TCPStore (legacy)")
            top = max([v for n in ranks for v in (rdzv[n].get("rendezvous_s"), rdzv[n].get("peer_rendezvous_s"))
                       if finite(v)] + [LIBUV_ANCHOR[1]])
            for n in ranks:  # sizes without a figure: say why at the top
                r = rdzv[n]
                if not finite(r.get("rendezvous_s")):
                    ax.annotate("corodist: not run here" if "not runnable" in r.get("error", "") else "corodist: failed",
                                (n, top), fontsize=7, rotation=90, va="top", ha="center", color=OURS)
                p = next((p for p in cases[("store", f"rendezvous_{n}_ranks")]["peers"]), None)
                if p and p.get("peer_status") and not finite(r.get("peer_rendezvous_s")):
                    ax.plot([n], [top], marker="x", color=PEER_COLORS["pytorch"])
                    ax.annotate("PyTorch: " + p["peer_status"][:40], (n, top), fontsize=7, rotation=90, va="top",
                                ha="right", color=PEER_COLORS["pytorch"])
            ax.plot([LIBUV_ANCHOR[0]], [LIBUV_ANCHOR[1]], marker="*", markersize=12, color="#7f7f7f", linestyle="",
                    label="PyTorch libuv TCPStore, published (other machine)")
            ax.set_title("store rendezvous: time against ranks", fontsize=10, loc="left")
            ax.set_ylabel("s (lower is better)")
        elif k == "memory":
            line(ax, ranks, [rdzv[n].get("server_rss_per_conn") for n in ranks], color=OURS,
                 label="corodist server (a wait pending)")
            line(ax, ranks, [rdzv[n].get("peer_server_rss_per_conn") for n in ranks], color=PEER_COLORS["pytorch"],
                 label="PyTorch 1.13 master")
            ax.axhline(IDLE_TARGET_BYTES, color="#c0392b", linestyle="--", linewidth=1,
                       label="4 KB per idle connection (target)")
            ax.set_title("store server memory per connection against ranks", fontsize=10, loc="left")
            ax.set_ylabel("bytes of RSS per connection (lower is better)")
        else:
            suite, pattern, panel_title = collectives[k]
            by_size = measured[k]
            sizes = sorted(by_size, key=lambda s: size_of(next(iter(by_size[s].values()))))
            if len(sizes) > 4:  # the smallest, the largest and two between
                sizes = [sizes[round(i * (len(sizes) - 1) / 3)] for i in range(4)]
            cmap = plt.get_cmap("viridis")
            for i, size in enumerate(sizes):
                by = by_size[size]
                n = sorted(by)
                color = cmap(i / max(1, len(sizes) - 1))
                line(ax, n, [by[x].get("p50_us") for x in n], color=color, label=f"{size} corodist")
                peers = [next((p.get("peer_p50_us") for p in cases[(suite, by[x]["case"])]["peers"]), None)
                         for x in n]
                line(ax, n, peers, color=color, linestyle="--", alpha=0.7, label=f"{size} PyTorch gloo")
            ax.set_title(panel_title, fontsize=10, loc="left")
            ax.set_ylabel("µs (lower is better)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("ranks")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.14), ncol=2, borderaxespad=0)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110, bbox_inches="tight")
    return out


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
            vals += [r.get("raw_p50_us") for _, r, _ in rows]
            vals = [v for v in vals if finite(v) and v > 0]
            ax.set_xlim(min(vals + [run_floor(first, "raw_p50_us") or 1]) / 2, max(vals) * 4)
            bars(ax, rows, "p50_us", "peer_p50_us", lambda v: f"{v:.1f} µs", log=True, raw_key="raw_p50_us")
            floor = run_floor(first, "raw_p50_us")
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
            vals = [r.get("gbytes_per_s") for _, r, _ in rows] + [peer_value(r, p, "peer_gbytes_per_s")
                                                                  for _, r, ps in rows for p in ps]
            vals += [r.get("raw_gbytes_per_s") for _, r, _ in rows]
            vals = [v for v in vals if finite(v) and v > 0] + [run_floor(first, "raw_gbytes_per_s") or 1]
            ax.set_xlim(0, max(vals) * 1.3)
            bars(ax, rows, "gbytes_per_s", "peer_gbytes_per_s", lambda v: f"{v:.2f} GB/s", log=False,
                 raw_key="raw_gbytes_per_s")
            bulk = run_floor(first, "raw_gbytes_per_s")
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
    scaled = draw_scaling(cases, out.rsplit(".", 1)[0] + "-scaling.png", "scaling — " + title)
    if scaled:
        print(f"bench_plot: wrote {scaled}")


if __name__ == "__main__":
    main()
