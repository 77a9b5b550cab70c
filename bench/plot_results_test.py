#!/usr/bin/env python3
"""Tests of bench/plot_results.py, run as a user runs it (a child process).

ctest runs this as bench.plot_results (label unit) with the Python of .venv,
where scripts/setup.sh installs matplotlib; exit status 77 (a skip, for
ctest) where that Python cannot import matplotlib.

  - every rmmd_bench results file in bench/results gives the charts of the
    sections it holds, each a non-empty PNG under 150 KB, and says which it
    skipped;
  - a file of sections a8, c2, g and h gives their charts;
  - a file without sections gives no chart and exits 0, saying why per chart;
  - bad input (a missing file, not JSON, not a bench result, a field of
    another type, bad arguments) exits non-zero with a message naming the
    file and writes nothing, even beside a good file;
  - every chart docs/benchmarks.md shows is committed in docs/images.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCRIPT = HERE / "plot_results.py"
# rmmd_bench's results (bench/python's files, of another schema, are not charted).
RESULTS = sorted(p for p in (HERE / "results").glob("*.json")
                 if json.loads(p.read_text()).get("schema") == "rmmd-bench/1")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MAX_PNG_BYTES = 150 * 1024
CHARTS = ("pairs", "fast-vs-pool", "processes", "memory", "scale", "mobility", "sharing")


def plot(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True,
                          text=True, timeout=240)  # all of results/ takes 95 s alone on 2 cores


def minimal_run(**sections) -> dict:
    run = {"schema": "rmmd-bench/1", "gpu": {"name": "Test GPU", "slug": "test-gpu"},
           "started_utc": "2026-11-23T00:00:00Z", "targets": []}
    run.update(sections)
    return run


class PlotResultsTest(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="rmmd-plot-test-")
        self.dir = Path(self.tmp.name)

    def tearDown(self) -> None:
        self.tmp.cleanup()

    def write(self, name: str, run: object) -> Path:
        path = self.dir / name
        path.write_text(run if isinstance(run, str) else json.dumps(run))
        return path

    def assert_png(self, path: Path) -> None:
        self.assertTrue(path.is_file(), f"{path} was not written")
        data = path.read_bytes()
        self.assertTrue(data.startswith(PNG_SIGNATURE), f"{path} is not a PNG")
        self.assertLess(len(data), MAX_PNG_BYTES, f"{path} is {len(data)} bytes")
        self.assertGreater(len(data), 2000, f"{path} is too small to be a chart")

    def test_committed_results(self) -> None:
        self.assertTrue(RESULTS, "no bench/results/*.json to plot")
        out = self.dir / "charts"
        result = plot(*RESULTS, "--out", out)
        self.assertEqual(result.returncode, 0, result.stderr)
        written = 0
        for path in RESULTS:
            run = json.loads(path.read_text())
            prefix = path.name.removesuffix(".json")
            expected = {
                "pairs": bool(run.get("pairs")),
                "fast-vs-pool": bool(run.get("fast_vs_pool")),
                "processes": bool(run.get("processes")),
                "memory": bool(run.get("daemon_rss") or run.get("scale")),
                "scale": bool(run.get("scale")),
                "mobility": bool(run.get("mobility")),
                "sharing": bool((run.get("sharing") or {}).get("cells")),
            }
            for chart, present in expected.items():
                png = out / f"{prefix}-{chart}.png"
                if present:
                    self.assert_png(png)
                    self.assertIn(f"{path.name}: {chart}: {png}", result.stdout)
                    written += 1
                else:
                    self.assertFalse(png.exists(), f"{png} written for an absent section")
                    self.assertRegex(result.stdout,
                                     rf"{re.escape(path.name)}: {chart}: skipped: no ")
        self.assertEqual(written, len(list(out.glob("*.png"))))
        self.assertGreaterEqual(written, 4)  # pairs, processes, memory of a full run; sharing

    def test_sections_a8_g_h(self) -> None:
        passing = {"target": "<= 100 ms", "pass": True}
        run = minimal_run(
            fast_vs_pool=[{"threads": t, "size_bytes": size, "rounds": 10,
                           "target": {"target": "<= 1.05 x", "pass": t == 1},
                           "fast_p50_us": 1.02 * t, "fast_p99_us": 1.5 * t,
                           "pool_p50_us": 1.0 * t, "pool_p99_us": 1.4 * t,
                           "bookkept_p50_us": 1.01 * t, "bookkept_over_pool": 1.01}
                          for t in (1, 8) for size in (256, 65536, 1 << 20)] +
                         # The default (automatic) lanes: carving_lanes 0.
                         [{"threads": t, "size_bytes": size, "rounds": 10, "carving_lanes": 0,
                           "target": {"target": "<= 1.05 x" if t == 1 else "<= 0.2 x",
                                      "pass": True},
                           "fast_p50_us": 1.02 if t == 1 else 1.6, "pool_p50_us": 1.0 * t,
                           "default_over_one_lane": 1.0 if t == 1 else 0.1}
                          for t in (1, 8) for size in (256, 65536, 1 << 20)],
            processes=[{"mode": "direct", "processes": n, "size_bytes": 256, "seconds_each": 2,
                        "aggregate_pairs_per_s": 2e4 * n ** 0.3} for n in (1, 16)] +
                      # Section c2's rows: one count each.
                      [{"mode": m, "processes": 16, "size_bytes": 256, "seconds_each": 2,
                        "aggregate_pairs_per_s": r}
                       for m, r in (("direct-1gpu", 2.4e4), ("direct-2gpu", 4.5e4))],
            daemon_side_pairs=[{"threads": 1, "pairs_per_s": 4e4}],
            mobility={"clients": 16, "slab_bytes": 64 << 20, "request_bytes": 256 << 20,
                      "trials": 5, "trial_ms": [3.0, 4.5, 2.2, 6.1, 3.3], "p50_ms": 3.3,
                      "refused": 0, "timeline": {"success_ms": 2.6, "clients": [
                          {"client": i, "asked_ms": 0.3, "gave_back_ms": 1.0 + i / 4}
                          if i < 4 else {"client": i} for i in range(16)]}},
            scale={
                "host_leases": {"pool": "host", "leases": 1000000, "per_lease_bytes": 94.0,
                                "target": {"target": "<= 128 B", "pass": True}},
                "cuda_leases": {"pool": "cuda", "leases": 100000, "per_lease_bytes": 130.0,
                                "target": {"target": "<= 128 B", "pass": False}},
                "sessions": {"sessions": 1000, "processes": 10, "per_session_bytes": 9000.0,
                             "per_session_target": {"target": "<= 16 KiB", "pass": True},
                             "setup_with_all_open": {"p50_us": 150, "p99_us": 700},
                             "setup_target": {"target": "<= 2 ms", "pass": True},
                             "get_stats_top": {"target": passing, "p50_ms": 2, "max_ms": 3},
                             "metrics_scrape": {"target": passing, "max_ms": 14, "bytes": 3e4}},
                "cuda_close": {"pool": "cuda", "leases": 100000, "max_ms": 20,
                               "target": {"target": "<= 50 ms", "pass": True}}})
        run["targets"] = [{"what": "g) idle slabs reach a request: p50", "unit": "ms",
                           "limit": "<= 50", "pass": True, "measured": 3.3}]
        # The 16-process direct row judged against b2's one-thread rate.
        run["processes"][1]["b2_target"] = {"target": ">= 0.75 x", "pass": False}
        result = plot(self.write("synthetic.json", run), "--out", self.dir)
        self.assertEqual(result.returncode, 0, result.stderr)
        for chart in ("fast-vs-pool", "processes", "memory", "scale", "mobility"):
            self.assert_png(self.dir / f"synthetic-{chart}.png")
        self.assertIn("pairs: skipped: no section a", result.stdout)
        self.assertIn("sharing: skipped: no section f", result.stdout)

    def test_no_sections(self) -> None:
        result = plot(self.write("empty.json", minimal_run()), "--out", self.dir / "charts",
                      "--prefix", "x")
        self.assertEqual(result.returncode, 0, result.stderr)
        for chart in CHARTS:
            self.assertRegex(result.stdout, rf"empty.json: {chart}: skipped: no section ")
        self.assertEqual(list((self.dir / "charts").glob("*")), [])

    def assert_refused(self, args: list, message: str, status: int = 1) -> None:
        out = self.dir / "charts"
        result = plot("--out", out, *args)
        self.assertEqual(result.returncode, status, result.stdout + result.stderr)
        self.assertIn(message, result.stderr)
        self.assertFalse(out.exists() and any(out.iterdir()), "a refused run wrote charts")

    def test_bad_input_writes_nothing(self) -> None:
        good = RESULTS[0]
        missing = self.dir / "missing.json"
        self.assert_refused([good, missing], f"{missing}: cannot read it")
        not_json = self.write("broken.json", '{"schema": "rmmd-bench/1",')
        self.assert_refused([good, not_json], f"{not_json}: not JSON (line 1, column")
        other = self.write("other.json", {"schema": "something-else/2"})
        self.assert_refused([good, other],
                            f"{other}: schema is 'something-else/2', not 'rmmd-bench/1'")
        odd = self.write("odd.json", minimal_run(fast_vs_pool=[
            {"threads": "eight", "size_bytes": 256, "fast_p50_us": 1.0, "pool_p50_us": 1.0}]))
        self.assert_refused([good, odd], f"{odd}: cannot draw its fast-vs-pool chart: ValueError")
        schemaless = self.write("python.json", {"gpu": {}, "torch": {}})
        self.assert_refused([good, schemaless], f"{schemaless}: no \"schema\" member")
        array = self.write("array.json", "[1, 2]")
        self.assert_refused([array], f"{array}: the JSON is a list, not an object")
        self.assert_refused([good, good, "--prefix", "p"], "--prefix names the charts of one file",
                            status=2)
        self.assert_refused([good, "--prefix", "../x"], "--prefix '../x': use letters", status=2)
        self.assert_refused([good, "--out", SCRIPT], "exists and is not a directory", status=2)

    def test_docs_show_committed_charts(self) -> None:
        docs = (ROOT / "docs" / "benchmarks.md").read_text()
        shown = re.findall(r"\]\((images/[^)]+\.png)\)", docs)
        self.assertTrue(shown, "docs/benchmarks.md shows no chart")
        for image in shown:
            self.assert_png(ROOT / "docs" / image)


if __name__ == "__main__":
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        print(f"plot_results tests: skipped: {sys.executable} cannot import matplotlib ({e}); "
              "scripts/setup.sh installs it into .venv")
        sys.exit(77)
    unittest.main(verbosity=2)
