#!/usr/bin/env python3
"""Merges read-bench JSONs of one implementation (dsv41kv's `bench --read --json` run per op, or
flashmla_sparse.py run per op) into one: the first file's header, every file's rows, the sum of
their wrong counts. A file that is missing, empty or not JSON is reported on stderr and left out
(its command failed: its log says why). With --table, prints the merged rows as a table.

usage: merge_read.py OUT.json IN.json... [--table]
"""
import argparse
import json
import sys


def merge(paths):
    docs = []
    for p in paths:
        try:
            with open(p) as f:
                docs.append(json.load(f))
        except (OSError, ValueError) as e:
            print(f"merge_read.py: {p}: left out ({e})", file=sys.stderr)
    if not docs:
        return None
    impls = {d.get("impl") for d in docs}
    if len(impls) != 1:
        raise SystemExit(f"merge_read.py: files of different implementations: {sorted(map(str, impls))}")
    rows = [r for d in docs for r in d["rows"]]
    return dict(docs[0], rows=rows, total_wrong=sum(r["wrong"] for r in rows))


def table(m):
    out = [f"{m['impl']} on {m['device']}: copy {m['copy_GBps']:.0f} GB/s",
           f"{'op':<8}{'h':>4}{'keys':>10} {'record':<10}{'role':<19}{'batch':>6}{'us':>11}{'TFLOPS':>8}{'GB/s':>8}"
           f"{'copy%':>7}{'wrong':>7}{'iters':>6}"]
    for r in m["rows"]:
        keys = (f"{r['swa_keys']}+{r['cmp_keys']}" if r["op"] == "decode"
                else f"{r['n_c'] // 1024}K" if r["op"] == "indexer" else f"{r['cmp_keys']}x{r['tokens'] // 1024}K")
        out.append(f"{r['op']:<8}{r['heads']:>4}{keys:>10} {r['record']:<10}{r['role'] or '-':<19}{r['batch']:>6}"
                   f"{r['us']:>11.1f}{r['TFLOPS']:>8.1f}{r['GBps']:>8.0f}{100 * r['copy_fraction']:>6.1f}%"
                   f"{r['wrong']:>7}{r.get('iters', '-'):>6}")
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description="merge read-bench JSONs")
    p.add_argument("out")
    p.add_argument("inputs", nargs="+")
    p.add_argument("--table", action="store_true")
    a = p.parse_args(argv)
    m = merge(a.inputs)
    if m is None:
        print("merge_read.py: no input could be read", file=sys.stderr)
        return 2
    with open(a.out, "w") as f:
        json.dump(m, f, indent=1)
    if a.table:
        print(table(m))
    return 0


if __name__ == "__main__":
    sys.exit(main())
