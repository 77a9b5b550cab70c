#!/usr/bin/env python3
"""The rules rmmd's code holds itself to, checked (CI runs this).

    scripts/check-structure.py [--root DIR]

1. Sizes, in daemon/, client/, bench/, rmmctl/, common/, harness/, include/:
   no C++ file over 800 lines, no function over 120 lines (a function's
   length as lizard measures it: from its first line to its closing brace).
2. Include directions: each folder includes only what docs/architecture.md
   says it may (RULES below). An include is one of ours when it names a
   folder of this tree ("daemon/core/...", "client/detail/...") or a
   generated or third-party header we police ("rmmd/v1/...", gRPC,
   protobuf).

Prints one line per breach ("path:line: ...") and a summary; exits 1 on any.
Needs lizard (scripts/setup.sh installs it into .venv).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 120
SIZED = ["daemon", "client", "bench", "rmmctl", "common", "harness", "include"]
SOURCES = (".cpp", ".hpp", ".h", ".cu")

# What an include names, reduced to the "room" it belongs to.
ROOMS = [
    (re.compile(r"^daemon/([a-z_]+)/"), lambda m: f"daemon/{m.group(1)}"),
    (re.compile(r"^daemon/[a-z_]+\.hpp$"), lambda m: "daemon"),  # log.hpp, version.hpp
    (re.compile(r"^client/detail/"), lambda m: "client/detail"),
    (re.compile(r"^client/"), lambda m: "client"),
    (re.compile(r"^rmmd/v1/"), lambda m: "proto"),
    (re.compile(r"^rmmd/detail/"), lambda m: "include/detail"),
    (re.compile(r"^rmmd/"), lambda m: "include"),
    (re.compile(r"^grpcpp?/|^grpc/"), lambda m: "grpc"),
    (re.compile(r"^google/protobuf/"), lambda m: "protobuf"),
    (re.compile(r"^(common|harness|bench|rmmctl|tests)/"), lambda m: m.group(1)),
]

DAEMON_ANY = {"daemon/" + r for r in
              ["core", "backends", "wire", "config", "metrics", "peering", "service",
               "session", "restart", "startup"]} | {"daemon"}

# Folder (longest prefix wins) -> rooms it may include besides its own.
# "hpp:" entries narrow what its headers may include.
RULES: dict[str, set[str]] = {
    "daemon/core": {"common"},
    # A kind's entry (pool_kinds.hpp) makes its pools from their settings.
    "daemon/backends": {"daemon/core", "daemon/config", "daemon", "common"},
    "daemon/wire": {"daemon/core", "daemon", "proto", "grpc", "protobuf"},
    "daemon/config": {"daemon/core", "daemon", "common", "proto", "protobuf"},
    "daemon/metrics": {"daemon/core", "daemon"},
    "daemon/restart": {"daemon/core", "daemon/wire", "daemon", "common", "proto", "protobuf"},
    "daemon/peering": {"daemon/core", "daemon/wire", "daemon/config", "daemon", "common",
                       "proto", "grpc", "protobuf"},
    "daemon/service": {"daemon/core", "daemon/wire", "daemon/metrics", "daemon", "common",
                       "proto", "grpc", "protobuf"},
    "daemon/session": {"daemon/core", "daemon/wire", "daemon/metrics", "daemon", "common",
                       "proto", "protobuf"},
    "daemon/startup": DAEMON_ANY | {"common", "proto", "grpc", "protobuf"},
    "daemon": DAEMON_ANY | {"common", "proto", "grpc", "protobuf"},
    "client": {"client/detail", "include", "include/detail", "common", "proto", "grpc",
               "protobuf"},
    "include": {"include/detail"},
    "rmmctl": {"include", "common", "proto", "protobuf"},
    "bench": {"include", "common", "harness", "proto", "protobuf"},
    "common": set(),
    "harness": {"common", "include", "proto"},
}
# Headers whose includes are narrower than their folder's .cpp files.
HEADER_RULES: dict[str, set[str]] = {
    "harness": {"common", "include"},
}

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')


def room_of(path: str) -> str | None:
    for pattern, name in ROOMS:
        m = pattern.match(path)
        if m:
            return name(m)
    return None


def folder_rule(rel: str) -> tuple[str, set[str]] | None:
    best = None
    for folder in RULES:
        if rel == folder or rel.startswith(folder + "/"):
            if best is None or len(folder) > len(best):
                best = folder
    if best is None:
        return None
    allowed = RULES[best]
    if rel.endswith((".hpp", ".h")) and best in HEADER_RULES:
        allowed = HEADER_RULES[best]
    return best, allowed


def own_rooms(folder: str) -> set[str]:
    own = {folder}
    if folder == "include":
        own.add("include/detail")
    if folder == "client":
        own.add("client/detail")
    return own


def check_includes(root: Path, files: list[Path]) -> list[str]:
    problems = []
    for f in files:
        rel = f.relative_to(root).as_posix()
        rule = folder_rule(rel)
        if rule is None:
            continue
        folder, allowed = rule
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            room = room_of(m.group(1))
            if room is None or room in own_rooms(folder) or room in allowed:
                continue
            problems.append(f"{rel}:{n}: {folder} may not include {m.group(1)} ({room})")
    return problems


def check_sizes(root: Path, files: list[Path]) -> list[str]:
    import lizard  # noqa: PLC0415 (only this check needs it)

    problems = []
    for f in files:
        rel = f.relative_to(root).as_posix()
        text = f.read_text(errors="replace")
        lines = text.count("\n")
        if lines > MAX_FILE_LINES:
            problems.append(f"{rel}:1: {lines} lines (at most {MAX_FILE_LINES}): split it")
        info = lizard.analyze_file.analyze_source_code(str(f), text)
        for fn in info.function_list:
            if fn.length > MAX_FUNCTION_LINES:
                problems.append(f"{rel}:{fn.start_line}: {fn.name} is {fn.length} lines "
                                f"(at most {MAX_FUNCTION_LINES}): name its steps")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    root = parser.parse_args().root.resolve()
    files = sorted(p for d in SIZED for p in (root / d).rglob("*")
                   if p.suffix in SOURCES and p.is_file())
    problems = check_sizes(root, files) + check_includes(root, files)
    for p in problems:
        print(p)
    print(f"check-structure: {len(files)} files, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
