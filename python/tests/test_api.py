"""The package's surface: every op of the extension has a docstring and a type stub, and the
package imports without numpy or torch."""
import inspect
import os
import subprocess
import sys

import dsv41kv
from dsv41kv import _core


def public_functions():
    return sorted(n for n, v in vars(_core).items() if not n.startswith("_") and callable(v) and not inspect.isclass(v))


def test_every_function_is_documented():
    missing = [n for n in public_functions() if not (getattr(_core, n).__doc__ or "").strip()]
    assert not missing


def test_array_ops_document_their_shapes():
    for n in ["fused_save_compress_norm", "rope_quant_insert", "compress_insert", "gather", "save_ring_rows",
              "swa_insert_q_rope", "build_ring_slots", "indexer_topk", "sparse_decode", "sparse_prefill"]:
        doc = getattr(_core, n).__doc__
        assert "[" in doc and ("i64" in doc or "f32" in doc or "bf16" in doc), n


def test_stubs_ship_and_cover_every_function():
    pyi = os.path.join(os.path.dirname(_core.__file__), "_core.pyi")
    assert os.path.exists(pyi), "the type stubs are not installed beside the extension"
    text = open(pyi).read()
    missing = [n for n in public_functions() if f"def {n}(" not in text]
    assert not missing, missing
    assert os.path.exists(os.path.join(os.path.dirname(_core.__file__), "py.typed"))


def test_import_needs_neither_numpy_nor_torch():
    code = ("import sys; sys.modules['numpy'] = None; sys.modules['torch'] = None; import dsv41kv; "
            "print(dsv41kv.ring_capacity(0))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert r.returncode == 0 and r.stdout.strip() == "8", r.stderr


def test_version():
    assert dsv41kv.__version__ == "0.1.0"
