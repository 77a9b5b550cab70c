"""What bench/plot_results.py's charts share: the schema's names and colours,
reading a results file, number and target formats, and the axes and legends
every chart draws the same way. Imported by plot_results.py, never run.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Callable

SCHEMA = "rmmd-bench/1"
DPI = 100
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "docs" / "images"

# Section a's resources, in the order the bench runs them: label and colour.
RESOURCES = {
    "cuda_async": ("cuda_async (in-process baseline)", "#444444"),
    "rmmd_direct": ("rmmd direct (session socket)", "#d62728"),
    "rmmd_direct_grpc": ("rmmd direct (gRPC)", "#ff9896"),
    "rmmd_fast": ("rmmd fast (slab)", "#1f77b4"),
    "rmm_pool": ("RMM pool over cuda_async (in-process)", "#2ca02c"),
}
# Section c's modes.
MODES = {
    "fast": ("fast (slab)", "#1f77b4"),
    "direct": ("direct (session socket)", "#d62728"),
    "direct-grpc": ("direct (gRPC)", "#ff9896"),
    # Section c2 (two GPUs): 16 direct processes on GPU 0, then over GPUs 0 and 1.
    "direct-1gpu": ("c2: direct, all on GPU 0", "#8c564b"),
    "direct-2gpu": ("c2: direct, over GPUs 0 and 1", "#9467bd"),
}
# Section f's methods.
METHODS = {
    "rmmd": ("rmmd open (session socket)", "#1f77b4"),
    "rmmd_grpc": ("rmmd open (gRPC)", "#aec7e8"),
    "cuda_ipc": ("cudaIpcOpenMemHandle (legacy IPC)", "#2ca02c"),
    "host_copy": ("copy from pinned host memory", "#7f7f7f"),
}
FALLBACK_COLOURS = ["#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf"]


class ResultsError(Exception):
    """A results file that cannot be read or is not an rmmd_bench result."""


class Skip(Exception):
    """A chart whose section the file lacks; the message says why."""


def fmt_bytes(n: float) -> str:
    """256 -> '256 B', 65536 -> '64 KiB', 4294967296 -> '4 GiB'."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n:.0f} B"


def fmt_rate(v: float) -> str:
    """Pairs per second, short: 18.7 M, 23.3 k, 950."""
    if v >= 1e6:
        return f"{v / 1e6:.3g} M"
    if v >= 1e3:
        return f"{v / 1e3:.3g} k"
    return f"{v:.3g}"


def number(v: Any) -> float | None:
    """A measured figure, or None where the bench left it out."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def label_and_colour(table: dict, name: str, index: int) -> tuple[str, str]:
    if name in table:
        return table[name]
    return name, FALLBACK_COLOURS[index % len(FALLBACK_COLOURS)]


def parse_limit(text: str) -> tuple[str, float] | None:
    """'<= 1.5 x', '>= 5e+06 pairs/s', '<= 1' -> ('<=', 1.5) ... ; None if not a limit."""
    m = re.match(r"\s*(<=|>=|<|>)\s*([-+0-9.eE]+)", text or "")
    if not m:
        return None
    try:
        return m.group(1), float(m.group(2))
    except ValueError:
        return None


def load(path: Path) -> dict:
    """The results of one run, checked to be an rmmd_bench results file."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ResultsError(f"{path}: cannot read it: {e.strerror}") from None
    try:
        run = json.loads(text)
    except json.JSONDecodeError as e:
        raise ResultsError(
            f"{path}: not JSON (line {e.lineno}, column {e.colno}: {e.msg}); "
            "give a file written by rmmd_bench --out") from None
    if not isinstance(run, dict):
        raise ResultsError(f"{path}: the JSON is a {type(run).__name__}, not an object; "
                           "give a file written by rmmd_bench --out")
    if "schema" not in run:
        raise ResultsError(f"{path}: no \"schema\" member: not an rmmd_bench results file "
                           f"(bench/bench_results.proto; its files have \"schema\": {SCHEMA!r})")
    if run.get("schema") != SCHEMA:
        raise ResultsError(f"{path}: schema is {run.get('schema')!r}, not {SCHEMA!r}: "
                           "not an rmmd_bench results file (bench/bench_results.proto)")
    return run


def gpu_title(run: dict) -> str:
    """What ran it, for a title: the GPU's name (or the host's, without one) and the date."""
    gpu = run.get("gpu") or {}
    host = run.get("host") or {}
    name = gpu.get("name") or (f"no GPU (host {host['hostname']}, {host.get('cpus', '?')} CPUs)"
                               if host.get("hostname") else "unknown GPU")
    when = (run.get("started_utc") or "")[:10]
    quick = ", --quick" if run.get("quick") else ""
    return f"{name}{' (' + when + quick + ')' if when else ''}"


def targets_named(run: dict, *words: str) -> list[dict]:
    """The run's target rows whose `what` holds every word (case-insensitive)."""
    out = []
    for t in run.get("targets") or []:
        what = (t.get("what") or "").lower()
        if all(w.lower() in what for w in words):
            out.append(t)
    return out


def pass_text(ok: Any) -> str:
    return "pass" if ok else "MISS"


def log_axis(ax, which: str = "y", subs: tuple = (1.0, 2.0, 5.0),
             fmt: Callable[[float], str] | None = None) -> None:
    """A log axis labelled in plain numbers at subs x 10^n (1, 2, 5, 10, 20, ... by default)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    axis = ax.yaxis if which == "y" else ax.xaxis
    (ax.set_yscale if which == "y" else ax.set_xscale)("log")
    axis.set_major_locator(LogLocator(base=10, subs=subs))
    axis.set_major_formatter(FuncFormatter(lambda v, _: fmt(v) if fmt else f"{v:,.6g}"))
    axis.set_minor_locator(NullLocator())


# --- charts ------------------------------------------------------------------
# Each takes the run and matplotlib's pyplot and returns a figure, or raises
# Skip saying which section it lacks.


def limit_value(target: Any) -> tuple[str, float, str] | None:
    """A Target ({"target": "<= 16 KiB", "pass": ...}) as (op, value in its base unit, text).

    KiB, MiB and GiB become bytes; other units ("x", "ms", "pairs/s") stay.
    """
    text = target.get("target", "") if isinstance(target, dict) else ""
    limit = parse_limit(text)
    if not limit:
        return None
    scale = 1.0
    for unit, factor in (("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30)):
        if re.search(rf"\b{unit}\b", text):
            scale = float(factor)
    return limit[0], limit[1] * scale, text


def pair_series(rows: list) -> dict[str, list[tuple[float, float, float | None]]]:
    """Section a: resource -> [(size, p50, p99)] for the rows with a p50, by size."""
    series: dict[str, list] = {}
    for row in rows:
        p50 = number(row.get("p50_us"))
        size = number(row.get("size_bytes"))
        if p50 is None or not size:
            continue
        series.setdefault(row.get("resource") or "?", []).append(
            (size, p50, number(row.get("p99_us"))))
    for points in series.values():
        points.sort()
    return series


def ratio_targets(run: dict) -> list[tuple[str, str, float, set[str], str]]:
    """Section a's ratio targets: (resource, reference, limit, sizes, text).

    They read "fast p50 / cuda_async p50 at 256 B" (limit "<= 1.5"): the line
    to draw is limit x the reference's p50 at those sizes.
    """
    found: dict[tuple[str, str, float], tuple[set, str]] = {}
    for t in run.get("targets") or []:
        m = re.match(r"\s*(\S+) p50 / (\S+) p50 at (\d+ [KMG]?i?B)$", t.get("what") or "")
        limit = parse_limit(t.get("limit") or "")
        if not m or not limit:
            continue
        res = {"fast": "rmmd_fast", "direct": "rmmd_direct", "pool": "rmm_pool"}.get(
            m.group(1), m.group(1))
        ref = {"fast": "rmmd_fast", "pool": "rmm_pool"}.get(m.group(2), m.group(2))
        key = (res, ref, limit[1])
        sizes, _ = found.get(key, (set(), ""))
        sizes.add(m.group(3))
        found[key] = (sizes, f"{limit[0]} {limit[1]:g}x {ref} p50")
    return [(r, ref, lim, sizes, text) for (r, ref, lim), (sizes, text) in found.items()]


def plot_p50_p99(ax, points: list, label: str, colour: str) -> None:
    """A p50 line (solid, dots) and its p99 (dotted, crosses) in the same colour."""
    ax.plot([p[0] for p in points], [p[1] for p in points], "o-", color=colour,
            label=f"{label} p50", lw=1.8)
    p99 = [(p[0], p[2]) for p in points if p[2] is not None]
    if p99:
        ax.plot([p[0] for p in p99], [p[1] for p in p99], "x:", color=colour, alpha=0.55, lw=1.2,
                ms=5)


def size_axis(ax, sizes: set[float]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(sizes), [fmt_bytes(s) for s in sorted(sizes)])
    ax.minorticks_off()
    ax.set_xlabel("allocation size")


def legend_below(ax, below: float = 0.13, ncol: int = 2, **kwargs) -> None:
    """The legend under the axes (below: its top, in axes heights): lines may be anywhere."""
    ax.legend(fontsize=7.5, loc="upper center", bbox_to_anchor=(0.5, -below), ncol=ncol, **kwargs)


# The resources that carve in-process: their pairs cost about a microsecond,
# drawn again on a linear axis, where section a's ratio targets are read.
IN_PROCESS = ("cuda_async", "rmmd_fast", "rmm_pool")


def bar_panel(ax, rows: list[tuple[str, float, str]], unit: Callable[[float], str],
              colour: str) -> None:
    """Horizontal bars (name, value, note), top to bottom, each labelled with its value."""
    ys = list(range(len(rows)))
    ax.barh(ys, [v for _, v, _ in rows], color=colour, height=0.6)
    for y, (_, v, note) in zip(ys, rows):
        ax.text(v, y, f" {unit(v)}{note}", va="center", fontsize=8)
    ax.set_yticks(ys, [name for name, _, _ in rows], fontsize=8.5)
    ax.set_ylim(max(len(rows), 3) - 0.5, -0.5)  # top to bottom; one bar is not a wall
    ax.grid(True, axis="x", alpha=0.3)
