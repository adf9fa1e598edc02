#!/usr/bin/env python3
"""Joins `dsv41kv bench --device cuda --read --json` and bench/peers/flashmla_sparse.py's JSON into
one side-by-side table: a line per workload (op, heads, keys, batch, tokens) and record, dsv41kv's
and FlashMLA's time, TFLOPS and wrong count, and the speedup (FlashMLA's time / ours). Lines only
one side has get '-' on the other (FlashMLA reads only the 584 record; the dsv41kv API has no
1024-wide top-k; the indexer has no FlashMLA peer).

usage: join_read.py OURS.json FLASHMLA.json [--json OUT.json]
"""
import argparse
import json
import sys


def key(r):
    if r["op"] == "decode":
        return ("decode", r["heads"], r["swa_keys"], r["cmp_keys"], r["batch"], r["record"])
    if r["op"] == "prefill":
        return ("prefill", r["heads"], 0, r["cmp_keys"], r["tokens"], r["record"])
    return ("indexer", r.get("role", ""), r["n_c"], 0, r["batch"], r["record"])


def label(k):
    if k[0] == "decode":
        return f"decode h{k[1]} {k[2]}+{k[3]} b{k[4]} {k[5]}"
    if k[0] == "prefill":
        return f"prefill h{k[1]} {k[3]} keys {k[4] // 1024}K tok"
    return f"indexer {k[1]} n_c {k[2] // 1024}K b{k[4]}"


def join(ours, peer):
    o = {key(r): r for r in ours["rows"]}
    p = {key(r): r for r in peer["rows"]}
    keys = list(o) + [k for k in p if k not in o]
    lines = []
    for k in keys:
        a, b = o.get(k), p.get(k)
        lines.append({"line": label(k), "ours_us": a and a["us"], "flashmla_us": b and b["us"],
                      "ours_TFLOPS": a and a["TFLOPS"], "flashmla_TFLOPS": b and b["TFLOPS"],
                      "ours_GBps": a and a["GBps"], "flashmla_GBps": b and b["GBps"],
                      "speedup": (b["us"] / a["us"]) if a and b and a["us"] > 0 else None,
                      "ours_wrong": a and a["wrong"], "flashmla_wrong": b and b["wrong"]})
    return lines


def fmt(v, spec):
    """v in `spec` (e.g. '>10.1f'), or '-' right-aligned in the same width."""
    if v is not None:
        return format(v, spec)
    width = "".join(c for c in spec.split(".")[0] if c.isdigit())
    return format("-", ">" + width)


def table(ours, peer, lines):
    out = [f"device {ours.get('device')}: copy {ours['copy_GBps']:.0f} GB/s (dsv41kv run), "
           f"{peer['copy_GBps']:.0f} GB/s (FlashMLA run)",
           f"{'line':<40}{'ours_us':>10}{'fmla_us':>10}{'speedup':>9}{'ours_TF':>9}{'fmla_TF':>9}"
           f"{'ours_GB/s':>10}{'fmla_GB/s':>10}{'wrong':>7}{'fwrong':>7}"]
    for l in lines:
        out.append(f"{l['line']:<40}{fmt(l['ours_us'], '>10.1f')}{fmt(l['flashmla_us'], '>10.1f')}"
                   + (f"{l['speedup']:>8.2f}x" if l["speedup"] is not None else f"{'-':>9}")
                   + f"{fmt(l['ours_TFLOPS'], '>9.1f')}{fmt(l['flashmla_TFLOPS'], '>9.1f')}"
                   f"{fmt(l['ours_GBps'], '>10.0f')}{fmt(l['flashmla_GBps'], '>10.0f')}"
                   f"{fmt(l['ours_wrong'], '>7d')}{fmt(l['flashmla_wrong'], '>7d')}")
    out.append("speedup = FlashMLA's time / dsv41kv's; FLOPs 2*h_q*tokens*keys*1024, bytes as "
               "bench/read_path_model.hpp counts them (both sides)")
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description="side-by-side table of the read-path benches")
    p.add_argument("ours")
    p.add_argument("flashmla")
    p.add_argument("--json", help="also write the joined lines here")
    a = p.parse_args(argv)
    docs = []
    for path, impl in ((a.ours, "dsv41kv"), (a.flashmla, "flashmla")):
        try:
            with open(path) as f:
                d = json.load(f)
        except (OSError, ValueError) as e:
            print(f"join_read.py: {path}: {e}", file=sys.stderr)
            return 2
        if d.get("impl") != impl or not isinstance(d.get("rows"), list):
            print(f"join_read.py: {path}: not a {impl} read-bench JSON (impl {d.get('impl')!r})", file=sys.stderr)
            return 2
        docs.append(d)
    lines = join(*docs)
    print(table(docs[0], docs[1], lines))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(lines, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
