"""examples/: the SWA-layer script passes its own check with numpy arrays (and torch tensors when
torch is installed)."""
import pathlib
import subprocess
import sys

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "swa_layer.py"


@pytest.mark.parametrize("mode", ["numpy", "torch"])
def test_swa_layer_example(mode):
    if mode == "torch":
        pytest.importorskip("torch")
    r = subprocess.run([sys.executable, str(EXAMPLE)] + (["--torch"] if mode == "torch" else []),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr
