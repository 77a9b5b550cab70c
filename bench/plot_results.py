#!/usr/bin/env python3
"""Turns rmmd_bench results into PNG charts (bench/README.md, "Charts").

  bench/plot_results.py RESULTS.json [RESULTS.json ...] [--out DIR] [--prefix P]

RESULTS.json is what rmmd_bench --out writes (bench/bench_results.proto,
message Run, in protobuf's JSON mapping). Each file gives the charts of the
sections it holds, named <prefix>-<chart>.png in DIR (docs/images by
default); the prefix is the file's name without ".json" (scripts/bench.sh
names a full run after the GPU, e.g. nvidia-h100-80gb-hbm3), or --prefix
with one file. The charts, and the section each reads:

  pairs         a   allocate+deallocate pair p50 (p99 dotted) by size per resource:
                    every resource on a log axis, the in-process ones on a linear one
  fast-vs-pool  a8  slab mode against RMM's pool in one process, per thread count
  processes     c   aggregate pairs/s by client process count per mode, with
                    section b2's one-thread rate (the driver's pace); c2's
                    16 direct processes on one GPU and over two as markers
  memory        e,h the daemon's resident memory; bytes per lease and per session
  scale         h   set-up, stats, scrape and reclaim times with many sessions
  mobility      g   the last trial's timeline (each client asked, gave back; the
                    answer) beside every trial's time, its p50 and the target
  sharing       f   shared buffer open p50 (p99 as a whisker) by size and consumer
                    count: rmmd against legacy CUDA IPC and a host copy

A target is drawn as a dashed line where its section has one. A chart whose
section is absent from the file is skipped with a line saying so; that is
not an error. Exit status: 0 when every file was read (whatever was
skipped), 1 when a file cannot be read, is not a bench result or holds a
field of another type than the schema's (nothing is written then), 2 on a
bad command line or without matplotlib (scripts/setup.sh installs it into
.venv).
"""

from __future__ import annotations

import argparse
import io
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from plot_support import (
    DPI, DEFAULT_OUT, RESOURCES, MODES, METHODS, ResultsError, Skip, fmt_bytes, fmt_rate,
    number, label_and_colour, parse_limit, load, gpu_title, pass_text, log_axis, limit_value,
    pair_series, ratio_targets, plot_p50_p99, size_axis, legend_below, IN_PROCESS, bar_panel,
)


def chart_pairs(run: dict, plt) -> Any:
    series = pair_series(run.get("pairs") or [])
    if not series:
        raise Skip("no section a (pairs) figures in this file")
    order = [r for r in RESOURCES if r in series] + sorted(set(series) - set(RESOURCES))
    carving = [r for r in order if r in IN_PROCESS]
    panels = [("every resource", order, True)]
    if carving and len(carving) < len(order):
        panels.append(("in-process carving (linear axis)", carving, False))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.4 * len(panels) + 1, 6.4), squeeze=False)
    for ax, (title, resources, logarithmic) in zip(axes[0], panels):
        sizes: set[float] = set()
        for i, res in enumerate(resources):
            label, colour = label_and_colour(RESOURCES, res, i)
            plot_p50_p99(ax, series[res], label, colour)
            sizes.update(p[0] for p in series[res])
        # Targets where they can be read: the linear panel, or the only one.
        for res, ref, limit, target_sizes, text in ratio_targets(run):
            if res not in resources or (logarithmic and len(panels) > 1):
                continue
            ref_points = {fmt_bytes(p[0]): p for p in series.get(ref, [])}
            pts = sorted(ref_points[s] for s in target_sizes if s in ref_points)
            if pts:
                ax.plot([p[0] for p in pts], [limit * p[1] for p in pts], "--",
                        color=label_and_colour(RESOURCES, res, 0)[1], lw=1.5,
                        label=f"target: {RESOURCES.get(res, (res,))[0]} {text}")
        size_axis(ax, sizes)
        if logarithmic:
            log_axis(ax)
        else:
            ax.set_ylim(bottom=0)
        ax.set_ylabel("allocate + deallocate pair (us)")
        ax.grid(True, which="major", alpha=0.3)
        ax.set_title(title, fontsize=10)
        legend_below(ax, title="solid: p50; dotted x: p99", title_fontsize=7.5)
    fig.suptitle(f"Section a: allocate+deallocate pair latency, one thread, {gpu_title(run)}",
                 fontsize=11)
    fig.tight_layout()
    return fig


def chart_fast_vs_pool(run: dict, plt) -> Any:
    rows = [r for r in run.get("fast_vs_pool") or [] if number(r.get("fast_p50_us")) is not None
            and number(r.get("pool_p50_us")) is not None and number(r.get("size_bytes"))]
    if not rows:
        raise Skip("no section a8 (fast_vs_pool) figures in this file")
    # A panel per thread count and carving lanes (absent: 1; 0: the default, automatic).
    panels = sorted({(int(r.get("threads") or 1), int(r.get("carving_lanes", 1))) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(5.4 * len(panels) + 1, 6.2), squeeze=False)
    for ax, (threads, lanes) in zip(axes[0], panels):
        mine = sorted((r for r in rows if int(r.get("threads") or 1) == threads
                       and int(r.get("carving_lanes", 1)) == lanes), key=lambda r: r["size_bytes"])
        sizes = {float(r["size_bytes"]) for r in mine}
        for res, key in (("rmmd_fast", "fast"), ("rmm_pool", "pool")):
            label, colour = RESOURCES[res]
            plot_p50_p99(ax, [(float(r["size_bytes"]), r[f"{key}_p50_us"],
                               number(r.get(f"{key}_p99_us"))) for r in mine], label, colour)
        # Both through rmm::device_async_resource_ref (newer runs): what the
        # target judges there.
        for res, key in (("rmmd_fast", "fast"), ("rmm_pool", "pool")):
            label, colour = RESOURCES[res]
            via_ref = [(float(r["size_bytes"]), number(r.get(f"ref_{key}_p50_us"))) for r in mine]
            via_ref = [(x, y) for x, y in via_ref if y is not None]
            if via_ref:
                ax.plot([x for x, _ in via_ref], [y for _, y in via_ref], "^-.", color=colour,
                        lw=1.2, ms=5, alpha=0.8, label=f"{label} p50 through resource_ref")
        # The pool plus slab mode's per-call bookkeeping (one lane, newer runs).
        bookkept = [(float(r["size_bytes"]), number(r.get("bookkept_p50_us"))) for r in mine]
        bookkept = [(x, y) for x, y in bookkept if y is not None]
        if bookkept:
            ax.plot([x for x, _ in bookkept], [y for _, y in bookkept], "s:", color="#7f7f7f",
                    lw=1.4, ms=5, label="RMM pool + slab mode's per-call work p50")
        limited = [(r, limit_value(r.get("target"))) for r in mine]
        limited = [(r, lv) for r, lv in limited if lv]
        if limited:
            passed = sum(1 for r, _ in limited if r["target"].get("pass"))
            # Newer runs judge the calls through resource_ref.
            ref = all(number(r.get("ref_pool_p50_us")) is not None for r, _ in limited)
            base = "ref_pool_p50_us" if ref else "pool_p50_us"
            ax.plot([float(r["size_bytes"]) for r, _ in limited],
                    [lv[1] * r[base] for r, lv in limited], "--", color="#1f77b4",
                    lw=1.5, label=f"{limited[0][1][1]:g}x pool p50{' through resource_ref' if ref else ''}; "
                    f"target: the rounds' median slab/pool {limited[0][1][0]} {limited[0][1][1]:g}x "
                    f"({passed} of {len(limited)} sizes pass)")
        size_axis(ax, sizes)
        ax.set_ylim(bottom=0)
        ax.set_ylabel("allocate + deallocate pair (us)")
        ax.grid(True, alpha=0.3)
        ax.set_title(f"{threads} thread{'s' if threads != 1 else ''} of one process"
                     + (f", slab mode with {lanes} carving lanes" if lanes > 1
                        else ", slab mode with its default (automatic) lanes" if lanes == 0
                        else ", slab mode with one carving lane"), fontsize=10)
        legend_below(ax, ncol=1, title="solid: p50; dotted x: p99", title_fontsize=7.5)
    fig.suptitle(f"Section a8: slab mode against RMM's pool in one process, {gpu_title(run)}",
                 fontsize=11)
    fig.tight_layout()
    return fig


def chart_processes(run: dict, plt) -> Any:
    rows = run.get("processes") or []
    series: dict[str, list] = {}
    for row in rows:
        rate = number(row.get("aggregate_pairs_per_s"))
        if rate is not None and row.get("processes"):
            series.setdefault(row.get("mode") or "?", []).append((row["processes"], rate))
    if not series:
        raise Skip("no section c (processes) figures in this file")
    fig, ax = plt.subplots(figsize=(8, 5.6))
    counts: set[int] = set()
    order = [m for m in MODES if m in series] + sorted(set(series) - set(MODES))
    for i, mode in enumerate(order):
        points = sorted(series[mode])
        label, colour = label_and_colour(MODES, mode, i)
        counts.update(p[0] for p in points)
        if len(points) == 1:  # one count (c2's): a marker, its rate in the legend
            ax.plot([points[0][0]], [points[0][1]], "D", color=colour, ms=7, ls="none",
                    label=f"{label} ({points[0][0]}): {fmt_rate(points[0][1])}/s")
            continue
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-", color=colour, label=label,
                lw=1.8)
        ax.annotate(fmt_rate(points[-1][1]) + "/s", points[-1], textcoords="offset points",
                    xytext=(6, -3), fontsize=8, color=colour)
    # Section b2: the daemon's CUDA work per direct pair on one thread, the driver's pace.
    b2 = {r.get("threads"): number(r.get("pairs_per_s"))
          for r in run.get("daemon_side_pairs") or []}
    b2_rate = b2.get(1)
    if b2_rate:
        ax.axhline(b2_rate, color="#d62728", ls=":", lw=1.2,
                   label="b2: daemon's CUDA work per direct pair, 1 thread "
                   f"({fmt_rate(b2_rate)}/s)")
    for row in rows:
        label, colour = label_and_colour(MODES, row.get("mode") or "?", 0)
        at = f"target, {label} at {row.get('processes')}"
        lv = limit_value(row.get("target"))
        if lv:
            ax.axhline(lv[1], color=colour, ls="--", lw=1.3,
                       label=f"{at}: {lv[0]} {fmt_rate(lv[1])} pairs/s: "
                       f"{pass_text(row['target'].get('pass'))}")
        lv = limit_value(row.get("b2_target"))
        if lv and b2_rate:  # stated against b2's one-thread rate of the same run
            ax.axhline(lv[1] * b2_rate, color=colour, ls="-.", lw=1.3,
                       label=f"{at}: {lv[0]} {lv[1]:g}x b2 = {fmt_rate(lv[1] * b2_rate)}/s: "
                       f"{pass_text(row['b2_target'].get('pass'))}")
    ax.set_xscale("log", base=2)
    log_axis(ax, fmt=fmt_rate)
    ax.set_xticks(sorted(counts), [str(c) for c in sorted(counts)])
    ax.minorticks_off()
    size, secs = rows[0].get("size_bytes") or 0, rows[0].get("seconds_each") or 0
    ax.set_xlabel("client processes at once")
    ax.set_ylabel("aggregate pairs/s (all processes)")
    ax.grid(True, which="major", alpha=0.3)
    legend_below(ax)
    ax.set_title(f"Section c: throughput by process count, {fmt_bytes(size)} pairs, "
                 f"{secs:g} s each\n{gpu_title(run)}", fontsize=11)
    fig.tight_layout()
    return fig


def chart_memory(run: dict, plt) -> Any:
    rss = run.get("daemon_rss") or {}
    scale = run.get("scale") or {}
    rss_keys = (("idle_fresh_bytes", "idle, at start"),
                ("idle_after_load_bytes", "idle, after a-d"),
                ("with_leases_bytes", f"with {rss.get('leases') or 0:,} leases"),
                ("after_free_bytes", "after freeing them"))
    rss_bars = [(name, number(rss.get(k)) / (1 << 20), k) for k, name in rss_keys
                if number(rss.get(k)) is not None]
    # Bytes per lease: section e's (10,000 direct CUDA leases), section h's.
    per_lease = []
    if number(rss.get("per_lease_bytes")) is not None:
        per_lease.append((f"e: CUDA pool, {rss.get('leases') or 0:,} leases",
                          rss["per_lease_bytes"], "e"))
    for key in ("host_leases", "cuda_leases"):
        part = scale.get(key) or {}
        if number(part.get("per_lease_bytes")) is not None:
            per_lease.append((f"h: {part.get('pool') or key} pool, {part.get('leases') or 0:,} "
                              "leases", part["per_lease_bytes"], key))
    sessions = scale.get("sessions") or {}
    per_session = number(sessions.get("per_session_bytes"))
    if not rss_bars and not per_lease and per_session is None:
        raise Skip("no section e (daemon_rss) or h (scale) memory figures in this file")
    # Section e alone: its per-lease figure goes in its panel's title, not a panel.
    lease_panel = any(key != "e" for *_, key in per_lease)
    panels = [p for p, shown in (("rss", rss_bars), ("lease", lease_panel),
                                 ("session", per_session is not None)) if shown]
    widths = {"rss": 5.2, "lease": 4.4, "session": 2.8}
    fig, axes = plt.subplots(1, len(panels), figsize=(1.6 + sum(widths[p] for p in panels), 5.6),
                             squeeze=False, width_ratios=[widths[p] for p in panels])
    for ax, panel in zip(axes[0], panels):
        if panel == "rss":
            bar_panel(ax, [(name, v, "") for name, v, _ in rss_bars], lambda v: f"{v:.1f}",
                      "#1f77b4")
            for key, style, text in (("cuda_context_process_bytes", ":",
                                      "bare process + CUDA context"),
                                     ("cuda_context_and_pool_process_bytes", "-.",
                                      "+ one exportable pool (the floor)")):
                v = number(rss.get(key))
                if v is not None:
                    ax.axvline(v / (1 << 20), color="#7f7f7f", ls=style, lw=1.2,
                               label=f"{text}: {v / (1 << 20):.1f} MiB")
            lv = limit_value(rss.get("target"))
            if lv:
                ax.axvline(lv[1] / (1 << 20), color="#d62728", ls="--", lw=1.4,
                           label=f"target with leases {lv[2]}: "
                           f"{pass_text(rss['target'].get('pass'))}")
            ax.set_xlabel("daemon resident memory, VmRSS (MiB)")
            v = number(rss.get("per_lease_bytes"))
            ax.set_title("Section e: daemon RSS" + (f" ({v:,.0f} B per lease)" if v else ""),
                         fontsize=10)
        elif panel == "lease":
            bar_panel(ax, [(name, v, "") for name, v, _ in per_lease], lambda v: f"{v:,.0f} B",
                      "#1f77b4")
            drawn = set()
            for key in ("host_leases", "cuda_leases"):
                part = scale.get(key) or {}
                lv = limit_value(part.get("target"))
                if lv and lv[1] not in drawn:
                    drawn.add(lv[1])
                    ax.axvline(lv[1], color="#d62728", ls="--", lw=1.4,
                               label=f"target per lease {lv[2]}")
            ax.set_xlim(0, max([v for _, v, _ in per_lease] + list(drawn)) * 1.3)
            ax.set_xlabel("bytes per live lease")
            ax.set_title("Daemon RSS above idle, per lease", fontsize=10)
        else:
            label = f"h: {sessions.get('sessions') or 0:,} sessions"
            if sessions.get("processes"):
                label += f"\nin {sessions['processes']:,} processes"
            bar_panel(ax, [(label, per_session / 1024, "")], lambda v: f"{v:,.1f} KiB", "#9467bd")
            lv = limit_value(sessions.get("per_session_target"))
            if lv:
                ax.axvline(lv[1] / 1024, color="#d62728", ls="--", lw=1.4,
                           label=f"target {lv[2]}: "
                           f"{pass_text(sessions['per_session_target'].get('pass'))}")
                ax.set_xlim(0, max(lv[1], per_session) / 1024 * 1.35)
            ax.set_xlabel("KiB per open session")
            ax.set_title("... per session", fontsize=10)
        if ax.get_legend_handles_labels()[0]:
            legend_below(ax)
    fig.suptitle(f"Daemon memory, {gpu_title(run)}", fontsize=11)
    fig.tight_layout()
    return fig


def chart_scale(run: dict, plt) -> Any:
    """Section h's timings with many sessions and leases, each against its target."""
    scale = run.get("scale") or {}
    sessions = scale.get("sessions") or {}
    n = f"{sessions.get('sessions') or 0:,}"
    rows = []  # (label, ms, target)

    def add(label: str, value: Any, target: Any) -> None:
        if number(value) is not None:
            rows.append((label, float(value), target))

    for key, text in (("setup_with_all_open", f"session set-up p99, {n} open"),
                      ("setup_ramp", f"session set-up p99, while opening {n}")):
        p99_us = number((sessions.get(key) or {}).get("p99_us"))
        target = sessions.get("setup_target") if key == "setup_with_all_open" else None
        add(text, p99_us / 1000 if p99_us is not None else None, target)
    for key, text in (("get_stats_top", "GetStats, top sessions"),
                      ("get_stats_all", "GetStats, every session"),
                      ("rmmctl_stats", "rmmctl stats (a process)"),
                      ("metrics_scrape", "/metrics scrape")):
        call = sessions.get(key) or {}
        size = number(call.get("bytes"))
        add(f"{text}, max{', ' + fmt_bytes(size) if size else ''}", call.get("max_ms"),
            call.get("target"))
    for key in ("host_close", "cuda_close"):
        close = scale.get(key) or {}
        most = number(close.get("max_ms"))
        add(f"SIGKILL to memory back, {close.get('pool') or key} pool,\n"
            f"{close.get('leases') or 0:,} leases, p50{f' (max {most:,.3g} ms)' if most else ''}",
            close.get("p50_ms"), close.get("target"))
    if not rows:
        raise Skip("no section h (scale) timings in this file")
    fig, ax = plt.subplots(figsize=(9, 2.2 + 0.5 * len(rows)))
    notes = []
    for _, _, target in rows:
        lv = limit_value(target)
        notes.append(f" ({lv[2]}: {pass_text(target.get('pass'))})" if lv else "")
    bar_panel(ax, [(label, v, note) for (label, v, _), note in zip(rows, notes)],
              lambda v: f"{v:,.3g} ms", "#1f77b4")
    marked = False
    for y, (_, _, target) in enumerate(rows):
        lv = limit_value(target)
        if lv:
            ax.plot([lv[1]], [y], marker="|", ms=22, mew=2.5, color="#d62728", ls="none",
                    label=None if marked else "target (each row's own)")
            marked = True
    log_axis(ax, "x", subs=(1.0,))
    ends = [v for _, v, _ in rows] + [lv[1] for lv in map(limit_value, (t for *_, t in rows)) if lv]
    ax.set_xlim(right=max(ends) * 30)  # room for each bar's text
    ax.set_xlabel("milliseconds (log)")
    if marked:
        legend_below(ax)
    ax.set_title(f"Section h: a busy node, {n} sessions\n{gpu_title(run)}", fontsize=11)
    fig.tight_layout()
    return fig


def find_mobility(run: dict) -> dict | None:
    """Section g's member of the results ("mobility", "memory_mobility", ...)."""
    for key, value in run.items():
        if "mobil" in key and isinstance(value, dict):
            return value
    return None


TIME_KEY = re.compile(r"^(.*?)_?(ms|us)$")


def times_of(event: dict) -> list[tuple[str, float]]:
    """An event's times in ms, by name: {"client": 3, "asked_ms": 0.4, "gave_back_us": 2100}
    -> [("asked", 0.4), ("gave back", 2.1)]."""
    out = []
    for k, v in event.items():
        m = TIME_KEY.match(k)
        if m and number(v) is not None:
            name = (m.group(1) or "at").replace("_", " ")
            out.append((name, float(v) / (1000 if m.group(2) == "us" else 1)))
    return out


def mobility_timeline(section: dict) -> tuple[float, float | None, list[dict]]:
    """(request ms, success ms or None, per-client events) of section g's one trial.

    Read without depending on the exact field names: the timeline is the
    section's `timeline` (or the section); its request and success times are
    its `request*` and `success*`/`granted*`/`served*` times; its events are
    the objects of its lists, each with a client, its times and its bytes.
    """
    timeline = section.get("timeline", section)
    if isinstance(timeline, list):
        timeline = {"events": timeline}
    request, success = 0.0, None
    for name, t in times_of(timeline):
        if name.startswith("request"):
            request = t
        elif name.startswith(("success", "granted", "served", "succeeded")):
            success = t
    events = [e for v in timeline.values() if isinstance(v, list) for e in v
              if isinstance(e, dict)]
    return request, success, events


def mobility_target(run: dict, section: dict) -> tuple[str, float, str] | None:
    """Section g's time target: its own, else the run's target row for it ("g) ... p50", ms)."""
    lv = limit_value(section.get("target"))
    if lv:
        return lv
    for t in run.get("targets") or []:
        what = (t.get("what") or "").lower()
        limit = parse_limit(t.get("limit") or "")
        if limit and t.get("unit") == "ms" and (what.startswith("g)") or "mobil" in what):
            return limit[0], limit[1], f"{t['limit']} ms"
    return None


def chart_mobility(run: dict, plt) -> Any:
    section = find_mobility(run)
    if section is None:
        raise Skip("no section g (memory mobility) in this file")
    request, success, events = mobility_timeline(section)
    slab = number(section.get("slab_bytes"))
    rows = []  # (who, [(name, t)], bytes); a client not asked has no times
    for e in events:
        who = next((e[k] for k in ("client", "session", "pid", "process", "index") if k in e),
                   f"#{len(rows)}")
        rows.append((str(who), times_of(e), number(e.get("bytes")) or slab))
    trials = [float(t) for t in section.get("trial_ms") or [] if number(t) is not None]
    if not any(times for _, times, _ in rows) and success is None and not trials:
        raise Skip("section g has neither a timeline nor trial times in this file")

    def order(row: tuple) -> tuple:
        return (0, int(row[0]), "") if row[0].isdigit() else (1, 0, row[0])

    rows.sort(key=order)
    lv = mobility_target(run, section)
    height = 2.6 + 0.22 * max(len(rows), 8)
    fig, (ax, tax) = plt.subplots(1, 2, figsize=(10.5, height), width_ratios=[3.2, 1])
    # Left: the last trial's timeline, a row per client.
    markers: dict[str, tuple[str, str]] = {}
    shapes = ["o", "s", "^", "D", "v"]
    colours = ["#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"]
    for y, (_, times, nbytes) in enumerate(rows):
        for name, t in times:
            if name not in markers:
                markers[name] = (shapes[len(markers) % 5], colours[len(markers) % 5])
            shape, colour = markers[name]
            ax.plot([t], [y], shape, color=colour, ms=5.5, ls="none")
        if times and nbytes:
            ax.annotate(fmt_bytes(nbytes), (max(t for _, t in times), y),
                        textcoords="offset points", xytext=(5, -3), fontsize=7)
    for name, (shape, colour) in markers.items():
        ax.plot([], [], shape, color=colour, ls="none", label=f"client {name}")
    ax.axvline(request, color="#444444", lw=1.5, label=f"request sent at {request:g} ms")
    if success is not None:
        ax.axvline(success, color="#1f77b4", lw=1.8, label=f"answered at {success:,.3g} ms")
    ax.set_yticks(range(len(rows)), [f"client {who}" + ("" if times else " (not asked)")
                                      for who, times, _ in rows],
                  fontsize=7 if len(rows) > 10 else 9)
    ax.set_ylim(max(len(rows), 1) - 0.3, -0.7)
    ax.set_xlabel("time since the request was sent (ms)")
    ax.grid(True, axis="x", alpha=0.3)
    legend_below(ax, below=0.1 if len(rows) > 8 else 0.15)
    what = [f"{section['clients']} slab clients" if section.get("clients") else "",
            f"{fmt_bytes(slab)} idle slab each" if slab else "",
            f"request {fmt_bytes(section['request_bytes'])}" if section.get("request_bytes")
            else ""]
    ax.set_title("the last trial" + (f": {', '.join(w for w in what if w)}" if any(what) else ""),
                 fontsize=9.5)
    # Right: every trial, request to answer, against the target.
    if trials:
        xs = [(i % 5 - 2) * 0.06 for i in range(len(trials))]
        tax.plot(xs, trials, "o", color="#1f77b4", ms=5, alpha=0.8, ls="none")
    p50 = number(section.get("p50_ms"))
    if p50 is not None:
        tax.axhline(p50, color="#1f77b4", lw=1.5, label=f"p50 {p50:,.3g} ms")
    if lv:
        tax.axhline(lv[1], color="#d62728", ls="--", lw=1.4,
                    label=f"target p50 {lv[2]}" + (f": {pass_text(p50 <= lv[1])}"
                                                   if p50 is not None else ""))
    refused = section.get("refused")
    tax.set_xlim(-0.5, 0.5)
    tax.set_xticks([])
    tax.set_ylim(bottom=0)
    tax.set_ylabel("request to answer (ms)")
    tax.grid(True, axis="y", alpha=0.3)
    tax.set_title(f"{len(trials)} trials" + (f", {refused} refused" if refused is not None
                                               else ""), fontsize=9.5)
    if tax.get_legend_handles_labels()[0]:
        legend_below(tax, below=0.04, ncol=1)
    fig.suptitle(f"Section g: memory that moves, {gpu_title(run)}", fontsize=11)
    fig.tight_layout()
    return fig


def chart_sharing(run: dict, plt) -> Any:
    sharing = run.get("sharing") or {}
    cells = [c for c in sharing.get("cells") or []
             if number((c.get("open") or {}).get("p50_us")) is not None]
    if not cells:
        raise Skip("no section f (shared buffers) figures in this file")
    groups = sorted({(number(c.get("size_bytes")) or 0, c.get("consumers") or 0) for c in cells})
    methods = [m for m in METHODS if any(c.get("method") == m for c in cells)]
    methods += sorted({c.get("method") for c in cells} - set(methods))
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(9, 5.2))
    for i, method in enumerate(methods):
        label, colour = label_and_colour(METHODS, method, i)
        xs, p50s, whisk = [], [], []
        for g, (size, consumers) in enumerate(groups):
            cell = next((c for c in cells if c.get("method") == method and
                         number(c.get("size_bytes")) == size and c.get("consumers") == consumers),
                        None)
            if cell is None:
                continue
            p50 = cell["open"]["p50_us"] / 1000
            p99 = number(cell["open"].get("p99_us"))
            xs.append(g - 0.4 + width * (i + 0.5))
            p50s.append(p50)
            whisk.append(max(0.0, p99 / 1000 - p50) if p99 is not None else 0.0)
        ax.bar(xs, p50s, width=width * 0.92, color=colour, label=label,
               yerr=[[0] * len(whisk), whisk], error_kw={"elinewidth": 0.8, "capsize": 2,
                                                         "ecolor": "#555555"})
    limits = {parse_limit((c.get("target") or {}).get("target", "")) for c in cells} - {None}
    for op, value in sorted(limits):
        unit_ms = value  # section f's open targets are in ms ("<= 1 ms")
        ax.axhline(unit_ms, color="#d62728", ls="--", lw=1.4,
                   label=f"target: rmmd open p50 {op} {value:g} ms")
    log_axis(ax, subs=(1.0,))
    ax.set_xticks(range(len(groups)),
                  [f"{fmt_bytes(s)}\n{n} consumer{'s' if n != 1 else ''}" for s, n in groups])
    ax.set_xlabel("buffer size, consumer processes at once")
    ax.set_ylabel("open to a usable pointer, p50 (ms; whisker: p99)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", framealpha=0.9)
    ax.set_title(f"Section f: opening a shared buffer\n{gpu_title(run)}", fontsize=11)
    fig.tight_layout()
    return fig


CHARTS: list[tuple[str, Callable]] = [
    ("pairs", chart_pairs),
    ("fast-vs-pool", chart_fast_vs_pool),
    ("processes", chart_processes),
    ("memory", chart_memory),
    ("scale", chart_scale),
    ("mobility", chart_mobility),
    ("sharing", chart_sharing),
]


def render(fig, plt) -> bytes:
    """The figure as a 256-colour PNG.

    A chart has a few flat colours: as a palette image it is a third of the
    size of matplotlib's RGBA PNG and looks the same, and the charts are
    committed (docs/images).
    """
    from PIL import Image  # matplotlib's own dependency

    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    finally:
        plt.close(fig)
    buffer.seek(0)
    image = Image.open(buffer).convert("RGB").quantize(
        colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return out.getvalue()


def write(path: Path, data: bytes) -> None:
    """Writes a chart through a temporary file: no half-written chart under its name."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as open() would make it, not mkstemp's 0600
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="plot_results.py",
        description="Turns rmmd_bench results JSON files into PNG charts.")
    parser.add_argument("results", nargs="+", type=Path, help="a file written by rmmd_bench --out")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="where to write the PNGs (default: docs/images of this checkout)")
    parser.add_argument("--prefix", help="the charts' name prefix (default: the file's name "
                        "without .json); only with one file")
    args = parser.parse_args(argv)
    if args.prefix is not None and len(args.results) != 1:
        parser.error("--prefix names the charts of one file; give one RESULTS.json with it")
    if args.prefix is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", args.prefix):
        parser.error(f"--prefix {args.prefix!r}: use letters, digits, '.', '_' and '-' only")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out}: exists and is not a directory")
    # Read every file and draw every chart before writing anything: a file that
    # cannot be read or drawn changes nothing.
    try:
        runs = [(path, load(path)) for path in args.results]
    except ResultsError as e:
        print(f"plot_results: {e}", file=sys.stderr)
        return 1
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"plot_results: cannot import matplotlib into {sys.executable} ({e}); "
              "scripts/setup.sh installs it into .venv", file=sys.stderr)
        return 2
    charts: list[tuple[str, Path, bytes]] = []
    for path, run in runs:
        prefix = args.prefix or path.name.removesuffix(".json")
        for name, chart in CHARTS:
            try:
                png = render(chart(run, plt), plt)
            except Skip as why:
                print(f"{path.name}: {name}: skipped: {why}")
                continue
            except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
                print(f"plot_results: {path}: cannot draw its {name} chart: "
                      f"{type(e).__name__}: {e} (a field of an unexpected type? "
                      "bench/bench_results.proto has the schema); nothing written",
                      file=sys.stderr)
                return 1
            charts.append((f"{path.name}: {name}", args.out / f"{prefix}-{name}.png", png))
    args.out.mkdir(parents=True, exist_ok=True)
    for what, target, data in charts:
        write(target, data)
        print(f"{what}: {target} ({len(data) / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
