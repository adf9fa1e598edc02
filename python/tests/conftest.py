"""Shared fixtures: where the conformance files and the C++ tool are."""
import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def conformance_dir():
    d = pathlib.Path(os.environ.get("DSV41KV_CONFORMANCE_DIR", REPO.parent / "shared" / "conformance"))
    if not d.is_dir():
        pytest.skip(f"no conformance files at {d} (set DSV41KV_CONFORMANCE_DIR)")
    return d


@pytest.fixture(scope="session")
def cli():
    """The C++ tool (DSV41KV_CLI, else build/dsv41kv), or None."""
    p = os.environ.get("DSV41KV_CLI", str(REPO / "build" / "dsv41kv"))
    return p if os.access(p, os.X_OK) else None
