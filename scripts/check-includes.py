#!/usr/bin/env python3
"""The layering rule of docs/architecture.md, checked on every quoted #include:

  src/<module>/...   the public API (dsv41kv/...), the shared foundation (core/..., formats/...)
                     and its own module's headers;
  tools/<tool>/...   the public API, its own folder's headers (quoted without a path), and the
                     benchmark library it drives (bench/...);
  bench/...          the public API, the foundation and bench's own headers;
  tests/<module>/... the public API, the foundation, the shared test helpers (support/...) and
                     the private headers of the module it tests (<module>/...);
  tests/support/...  the public API, the foundation and support's own headers.

Usage: scripts/check-includes.py [REPO_ROOT]   (exit 1 and one line per violation)
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCES = (".cpp", ".hpp", ".cu", ".cuh", ".h")


def allowed(rel, inc):
    parts = rel.split("/")
    top = parts[0]
    if inc.startswith("dsv41kv/"):
        return True
    if top == "src":
        return inc.split("/")[0] in ("core", "formats", parts[1])
    if top == "tools":
        return "/" not in inc or inc.startswith("bench/")
    first = inc.split("/")[0]
    if top == "bench":
        return first in ("bench", "core", "formats") or "/" not in inc
    if top == "tests":
        return first in ("support", "core", "formats", parts[1])
    return True


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    bad = []
    for top in ("src", "tools", "bench", "tests"):
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if not f.endswith(SOURCES):
                    continue
                path = os.path.join(d, f)
                rel = os.path.relpath(path, root)
                for m in INCLUDE.finditer(open(path, encoding="utf-8").read()):
                    if not allowed(rel, m.group(1)):
                        bad.append(f"{rel}: #include \"{m.group(1)}\"")
    for b in bad:
        print(b)
    if bad:
        print(f"{len(bad)} include(s) cross a module boundary (docs/architecture.md, Layering)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
