#!/usr/bin/env python3
"""Runs FlashMLA's own sparse-decoding or sparse-prefill correctness cases against
dsv41kv.flash_mla (docs/python.md, "FlashMLA's tests"):

  scripts/run-flashmla-tests.py FLASHMLA_TESTS_DIR decode|prefill

FLASHMLA_TESTS_DIR is the tests/ folder of deepseek-ai/FlashMLA at 9241ae3 (kept in an ignored
folder, never committed). `import flash_mla` in those files resolves to dsv41kv.flash_mla. The
harness runs as FlashMLA ships it except for two edits, each checked to apply exactly as written
(a changed harness stops the run): its DeepSeek V3.2 cases (d_qk 576, 656-byte records: another
model's format, which dsv41kv does not read) and its performance cases (they time FlashMLA's
kernels by name) are left out. Exit status: the harness's (0 when every case passed).
"""
import os
import sys
import types

EDITS = {
    "decode": ("test_flash_mla_sparse_decoding.py", [
        ("for d_qk in [576, 512]", "for d_qk in [512]", 1),
        ("return correctness_cases + corner_cases + performance_cases", "return correctness_cases + corner_cases", 1),
    ]),
    "prefill": ("test_flash_mla_sparse_prefill.py", [
        ("for d_qk in [512, 576]", "for d_qk in [512]", 5),
        ("testcases = correctness_cases + correctness_cases_with_features + corner_cases + performance_cases",
         "testcases = correctness_cases + correctness_cases_with_features + corner_cases", 1),
    ]),
}


def main(argv):
    if len(argv) != 3 or argv[2] not in EDITS:
        print(__doc__, file=sys.stderr)
        return 2
    tests_dir, which = os.path.abspath(argv[1]), argv[2]
    name, edits = EDITS[which]
    path = os.path.join(tests_dir, name)
    src = open(path).read()
    for old, new, count in edits:
        if src.count(old) != count:
            print(f"run-flashmla-tests: {path}: expected {count} x {old!r}, found {src.count(old)}: not the harness "
                  "of FlashMLA 9241ae3", file=sys.stderr)
            return 2
        src = src.replace(old, new)
    import dsv41kv.flash_mla
    sys.modules["flash_mla"] = dsv41kv.flash_mla
    try:
        import rich.console  # noqa: F401  (the decode harness prints its summary table with rich)
    except ImportError:
        rich = types.ModuleType("rich")
        for sub in ("console", "table"):
            m = types.ModuleType(f"rich.{sub}")
            setattr(rich, sub, m)
            sys.modules[f"rich.{sub}"] = m
        class _Quiet:
            def __init__(self, *a, **k):
                pass
            def __getattr__(self, _):
                return lambda *a, **k: None
        rich.console.Console = rich.table.Table = _Quiet
        sys.modules["rich"] = rich
    sys.path.insert(0, tests_dir)
    sys.argv = [path]
    code = compile(src, path, "exec")
    try:
        exec(code, {"__name__": "__main__", "__file__": path})
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
