"""examples/: the SWA-layer script passes its own check with numpy arrays (and torch tensors when
torch is installed), through the ops and through one AttentionLayer call per step."""
import pathlib
import subprocess
import sys

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "swa_layer.py"


@pytest.mark.parametrize("mode", ["numpy", "torch", "layer", "layer-torch"])
def test_swa_layer_example(mode):
    if "torch" in mode:
        pytest.importorskip("torch")
    flags = (["--torch"] if "torch" in mode else []) + (["--layer"] if "layer" in mode else [])
    r = subprocess.run([sys.executable, str(EXAMPLE)] + flags,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr
