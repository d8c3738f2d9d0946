#!/usr/bin/env python3
"""Medians of bench/deliba-grid.sh's raw runs, a table with ratios, and summary.csv.

usage: deliba-summary.py RAW.csv SUMMARY.csv

summary.csv has one row per (peer, bs, rw): latency from the iodepth-1 runs
(p50, p99, mean in microseconds), IOPS and MB/s from the iodepth-32 runs,
each the median over the repetitions, plus n (runs that produced a number).
"""
import csv
import math
import statistics
import sys
from collections import defaultdict

PEER_ORDER = ["iolift", "iolift+cs", "iolift-poll", "qemu-nbd", "fio-rbd"]
RW_ORDER = ["read", "write", "randread", "randwrite"]


def med(xs):
    xs = [x for x in xs if not math.isnan(x)]
    return statistics.median(xs) if xs else float("nan")


def main():
    raw, out = sys.argv[1], sys.argv[2]
    cells = defaultdict(lambda: defaultdict(list))
    for r in csv.DictReader(open(raw)):
        key = (r["peer"], r["bs"], r["rw"])
        qd = int(r["iodepth"])
        c = cells[key]
        if qd == 1:
            c["p50"].append(float(r["lat_p50_us"]))
            c["p99"].append(float(r["lat_p99_us"]))
            c["mean"].append(float(r["lat_mean_us"]))
            c["n1"].append(1)
        else:
            c["iops"].append(float(r["iops"]))
            c["mbps"].append(float(r["mbps"]))
            c["n32"].append(1)
    peers = [p for p in PEER_ORDER if any(k[0] == p for k in cells)]
    peers += sorted({k[0] for k in cells} - set(peers))
    bss = sorted({k[1] for k in cells}, key=lambda b: int(b.rstrip("kKmM")) * (1024 if b[-1] in "mM" else 1))
    summ = {}
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["peer", "bs", "rw", "lat_p50_us", "lat_p99_us", "lat_mean_us", "iops", "mbps", "n_qd1", "n_qd32"])
        for p in peers:
            for bs in bss:
                for rw in RW_ORDER:
                    c = cells.get((p, bs, rw))
                    if not c:
                        continue
                    s = dict(p50=med(c["p50"]), p99=med(c["p99"]), mean=med(c["mean"]),
                             iops=med(c["iops"]), mbps=med(c["mbps"]),
                             n1=len(c["n1"]), n32=len(c["n32"]))
                    summ[(p, bs, rw)] = s
                    w.writerow([p, bs, rw, "%.1f" % s["p50"], "%.1f" % s["p99"], "%.1f" % s["mean"],
                                "%.0f" % s["iops"], "%.2f" % s["mbps"], s["n1"], s["n32"]])

    def g(p, bs, rw, k):
        return summ.get((p, bs, rw), {}).get(k, float("nan"))

    def ratio(a, b):
        return a / b if b and not math.isnan(a) and not math.isnan(b) else float("nan")

    print("DeLiBA grid: medians (latency at iodepth 1, IOPS and MB/s at iodepth 32)")
    print()
    hdr = "%-6s %-10s %-10s %9s %9s %9s %9s" % ("bs", "rw", "peer", "p50 us", "p99 us", "IOPS", "MB/s")
    print(hdr)
    print("-" * len(hdr))
    for bs in bss:
        for rw in RW_ORDER:
            for p in peers:
                if (p, bs, rw) not in summ:
                    continue
                print("%-6s %-10s %-10s %9.1f %9.1f %9.0f %9.1f" % (
                    bs, rw, p, g(p, bs, rw, "p50"), g(p, bs, rw, "p99"),
                    g(p, bs, rw, "iops"), g(p, bs, rw, "mbps")))
        print()

    print("Ratios (>1 is better for iolift in every column):")
    cols = []
    if "qemu-nbd" in peers:
        cols.append(("IOPS/qemu-nbd", lambda p, bs, rw: ratio(g(p, bs, rw, "iops"), g("qemu-nbd", bs, rw, "iops"))))
    if "fio-rbd" in peers:
        cols.append(("librbd p50/p50", lambda p, bs, rw: ratio(g("fio-rbd", bs, rw, "p50"), g(p, bs, rw, "p50"))))
        cols.append(("IOPS/librbd", lambda p, bs, rw: ratio(g(p, bs, rw, "iops"), g("fio-rbd", bs, rw, "iops"))))
    ours = [p for p in peers if p.startswith("iolift")]
    hdr = "%-6s %-10s %-10s " % ("bs", "rw", "peer") + " ".join("%15s" % c[0] for c in cols)
    print(hdr)
    print("-" * len(hdr))
    for bs in bss:
        for rw in RW_ORDER:
            for p in ours:
                if (p, bs, rw) in summ:
                    print("%-6s %-10s %-10s " % (bs, rw, p) + " ".join("%15.2f" % f(p, bs, rw) for _, f in cols))
    print()
    # Targets: >= 1.3x qemu-nbd's IOPS at 4k; iodepth-1 p50 latency within 10% of librbd.
    for p in ours:
        if "qemu-nbd" in peers and "4k" in bss:
            rs = [ratio(g(p, "4k", rw, "iops"), g("qemu-nbd", "4k", rw, "iops")) for rw in RW_ORDER]
            rs = [r for r in rs if not math.isnan(r)]
            if rs:
                print("target %-10s 4k IOPS >= 1.3x qemu-nbd: min %.2fx, max %.2fx -> %s" % (
                    p, min(rs), max(rs), "met" if min(rs) >= 1.3 else "NOT met in %d of %d" % (sum(r < 1.3 for r in rs), len(rs))))
        if "fio-rbd" in peers:
            rs = [ratio(g(p, bs, rw, "p50"), g("fio-rbd", bs, rw, "p50")) for bs in bss for rw in RW_ORDER]
            rs = [r for r in rs if not math.isnan(r)]
            if rs:
                print("target %-10s qd1 p50 within 10%% of librbd: worst %.2fx of librbd -> %s" % (
                    p, max(rs), "met" if max(rs) <= 1.10 else "NOT met in %d of %d" % (sum(r > 1.10 for r in rs), len(rs))))


if __name__ == "__main__":
    main()
