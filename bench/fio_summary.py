#!/usr/bin/env python3
"""Summarises bench/nbd.sh results: fio --output-format=json files named
SERVER_REP_JOB.json plus SERVER_REP_JOB.cpu (server CPU clock ticks over
the job). Prints medians per server and iolift/nbdkit ratios, and checks the
targets (>= 1.5x nbdkit's IOPS at 4k QD32, QD1 p50 <= nbdkit's, server CPU
per I/O <= 0.7x nbdkit's).

usage: fio_summary.py DIR [--clk-tck 100] [--repeats R] [--json OUT]
"""

import argparse
import glob
import json
import os
import re
import statistics
import sys

SERVERS = ("iolift", "nbdkit")


def load(d, clk):
    """{(server, job): [ {iops, p50_us, p99_us, mbs, cpu_us_per_io} per rep ]}"""
    out = {}
    for f in sorted(glob.glob(os.path.join(d, "*.json"))):
        m = re.match(r"(iolift|nbdkit|alt)_(\d+)_(.+)\.json$", os.path.basename(f))
        if not m:
            continue
        srv, _rep, job = m.groups()
        with open(f) as fh:
            text = fh.read()
        # fio may print notes before the JSON object
        j = json.loads(text[text.index("{"):])
        jb = j["jobs"][0]
        side = "read" if jb["read"]["total_ios"] > 0 else "write"
        s = jb[side]
        ios = jb["read"]["total_ios"] + jb["write"]["total_ios"]
        pct = s.get("clat_ns", {}).get("percentile", {})
        cpu_file = f[:-5] + ".cpu"
        ticks = int(open(cpu_file).read().strip()) if os.path.exists(cpu_file) else None
        r = {
            "iops": s["iops"],
            "p50_us": pct.get("50.000000", 0) / 1000.0,
            "p99_us": pct.get("99.000000", 0) / 1000.0,
            "mbs": s["bw_bytes"] / 1e6,
            "ios": ios,
            "cpu_us_per_io": (ticks / clk * 1e6 / ios) if (ticks is not None and ios) else None,
            "errors": jb.get("error", 0),
            "fio_cpu_pct": jb.get("usr_cpu", 0) + jb.get("sys_cpu", 0),
        }
        out.setdefault((srv, job), []).append(r)
    return out


def med(rows, key):
    v = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(v) if v else None


def spread(rows, key):
    v = [r[key] for r in rows if r.get(key) is not None]
    return "%s-%s" % (fmt(min(v)), fmt(max(v))) if v else "-"


def fmt(x, nd=1):
    if x is None:
        return "-"
    if abs(x) >= 1000:
        return "%.0f" % x
    return "%.*f" % (nd, x)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--clk-tck", type=float, default=100.0)
    p.add_argument("--repeats", type=int, default=0)
    p.add_argument("--json", help="also write the medians here")
    p.add_argument("--alt-label", default="iolift --poll-us 0",
                   help="what the third server (files alt_*) is, for the header")
    a = p.parse_args()
    data = load(a.dir, a.clk_tck)
    if not data:
        sys.exit("no fio results in %s" % a.dir)
    jobs = []
    for (_, job) in data:
        if job not in jobs:
            jobs.append(job)
    order = ["randread_4k_qd1", "randwrite_4k_qd1", "randread_4k_qd32", "randwrite_4k_qd32",
             "randread_4k_qd32x2", "randwrite_4k_qd32x2", "seqread_128k_qd8", "seqwrite_128k_qd8"]
    jobs.sort(key=lambda j: order.index(j) if j in order else 99)

    rows = []
    summary = {}
    has_alt = any(k[0] == "alt" for k in data)
    for job in jobs:
        metrics = [("IOPS", "iops", True), ("CPU us/IO", "cpu_us_per_io", False)]
        if job.endswith("qd32"):
            metrics.append(("fio CPU %", "fio_cpu_pct", False))
        if job.endswith("qd1"):
            metrics[1:1] = [("p50 us", "p50_us", False), ("p99 us", "p99_us", False)]
        if job.startswith("seq"):
            metrics = [("MB/s", "mbs", True), ("CPU us/IO", "cpu_us_per_io", False)]
        for label, key, _higher_better in metrics:
            mi = med(data.get(("iolift", job), []), key)
            mk = med(data.get(("nbdkit", job), []), key)
            mp = med(data.get(("alt", job), []), key)
            ratio = (mi / mk) if (mi is not None and mk) else None
            pratio = (mp / mk) if (mp is not None and mk) else None
            nratio = (mi / mp) if (mi is not None and mp) else None
            n = min(len(data.get(("iolift", job), [])), len(data.get(("nbdkit", job), [])))
            row = (job, label, fmt(mi), fmt(mk), fmt(ratio, 2), str(n),
                   spread(data.get(("iolift", job), []), key),
                   spread(data.get(("nbdkit", job), []), key))
            if has_alt:
                row += (fmt(mp), fmt(pratio, 2), fmt(nratio, 2))
            rows.append(row)
            summary.setdefault(job, {})[key] = {"iolift": mi, "nbdkit": mk, "ratio": ratio,
                                                "alt": mp, "alt_ratio": pratio,
                                                "iolift_over_alt": nratio}

    hdr = ("job", "metric", "iolift", "nbdkit", "ratio", "runs", "iolift min-max",
           "nbdkit min-max")
    if has_alt:
        hdr += ("alt", "alt/nbdkit", "iolift/alt")
    w = [max(len(r[i]) for r in rows + [hdr]) for i in range(len(hdr))]
    line = "  ".join(h.ljust(w[i]) if i < 2 else h.rjust(w[i]) for i, h in enumerate(hdr))
    print("medians over repeats (ratio = iolift / nbdkit; min-max = spread over repeats%s)"
          % ("; alt = " + a.alt_label if has_alt else ""))
    print(line)
    print("-" * len(line))
    for r in rows:
        print("  ".join(c.ljust(w[i]) if i < 2 else c.rjust(w[i]) for i, c in enumerate(r)))

    # targets
    def get(job, key, who="ratio"):
        return summary.get(job, {}).get(key, {}).get(who)

    # (job, metric key, label, ratio is good when it is >= / <= this)
    targets = [(j, "iops", "IOPS >= 1.5x nbdkit", lambda r: r >= 1.5)
               for j in ("randread_4k_qd32", "randwrite_4k_qd32")]
    targets += [(j, "p50_us", "p50 <= nbdkit", lambda r: r <= 1.0)
                for j in ("randread_4k_qd1", "randwrite_4k_qd1")]
    targets += [(j, "cpu_us_per_io", "CPU/IO <= 0.7x nbdkit", lambda r: r <= 0.7)
                for j in ("randread_4k_qd32", "randwrite_4k_qd32")]
    print()
    print("targets (iolift with its defaults%s):" % ("; alt in brackets" if has_alt else ""))
    for job, key, label, good in targets:
        r = get(job, key)
        ok = r is not None and good(r)
        extra = "  [alt %s]" % fmt(get(job, key, "alt_ratio"), 2) if has_alt else ""
        print("  %-40s ratio %-6s %-8s%s" % ("%s %s" % (job, label), fmt(r, 2),
                                             "MET" if ok else "not met", extra))
    two = [(j, k) for j in ("randread_4k_qd32x2", "randwrite_4k_qd32x2")
           for k in ("iops", "cpu_us_per_io") if get(j, k) is not None]
    if two:
        print("two fio processes, one connection each (not a target; the totals):")
        for job, key in two:
            print("  %-40s ratio %s" % ("%s %s" % (job, "IOPS" if key == "iops" else "CPU/IO"),
                                        fmt(get(job, key), 2)))
    errs = sum(r["errors"] for rows_ in data.values() for r in rows_)
    if errs:
        print("WARNING: fio reported %d job errors" % errs)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(summary, fh, indent=1)


if __name__ == "__main__":
    main()
