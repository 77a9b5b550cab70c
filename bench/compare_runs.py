#!/usr/bin/env python3
"""Side by side, two rmmd_bench JSON files of the same run set (one binary
before a change, one after): section a's fast/pool and direct p50, section
a8's slab/pool median round ratio with its pool'/pool control, section c's
aggregate pairs/s. Each file's own RMM pool is its baseline, so a machine
that runs slower in one run moves both sides of a ratio alike.

    bench/compare_runs.py BEFORE.json AFTER.json
"""
import json
import sys


def main(before_path: str, after_path: str) -> None:
    with open(before_path) as f:
        before = json.load(f)
    with open(after_path) as f:
        after = json.load(f)

    print("section a: rmmd fast / in-process RMM pool (p50), and rmmd direct p50 in us")
    pairs_b = {(p["resource"], p["size_bytes"]): p for p in before["pairs"]}
    pairs_a = {(p["resource"], p["size_bytes"]): p for p in after["pairs"]}
    for size in sorted({s for (_, s) in pairs_b}):
        def ratio(pairs):
            return pairs[("rmmd_fast", size)]["p50_us"] / pairs[("rmm_pool", size)]["p50_us"]
        print(f"  {size:>9d} B  fast/pool {ratio(pairs_b):.3f} -> {ratio(pairs_a):.3f}"
              f"   direct {pairs_b[('rmmd_direct', size)]['p50_us']:8.1f} ->"
              f" {pairs_a[('rmmd_direct', size)]['p50_us']:8.1f}")

    print("section a8: slab/pool median round ratio (pool'/pool, the run's own noise)")
    def lanes(p: dict) -> int:
        return int(p.get("carving_lanes", 1))  # 0: the default, automatic lanes

    a8_a = {(p["threads"], p["size_bytes"], lanes(p)): p for p in after["fast_vs_pool"]}
    for p in before["fast_vs_pool"]:
        q = a8_a.get((p["threads"], p["size_bytes"], lanes(p)))
        if q is None:
            continue
        control = (f"  (pool'/pool {p['pool_again_over_pool']:.3f} / {q['pool_again_over_pool']:.3f})"
                   if "pool_again_over_pool" in p and "pool_again_over_pool" in q else "")
        print(f"  T={p['threads']} {p['size_bytes']:>8d} B lanes={lanes(p) or 'auto'}:"
              f" {p['median_round_ratio']:.3f} -> {q['median_round_ratio']:.3f}{control}")

    print("section c: aggregate pairs/s")
    c_a = {(p["mode"], p["processes"]): p for p in after["processes"]}
    for p in before["processes"]:
        q = c_a.get((p["mode"], p["processes"]))
        if q is None:
            continue
        b, a = p["aggregate_pairs_per_s"], q["aggregate_pairs_per_s"]
        print(f"  {p['mode']:12s} {p['processes']:3d}: {b:11.0f} -> {a:11.0f}  x{a / b:.3f}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
