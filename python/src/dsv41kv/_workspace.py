"""Workspaces of the CUDA ops, from torch's caching allocator (capture-safe: a CUDA graph keeps its
own pool), shared by dsv41kv.torch and dsv41kv.flash_mla."""
from typing import Optional

import torch

from . import _core


def decode_workspace(sched, device) -> Optional[torch.Tensor]:
    """The split-K workspace a CUDA decode schedule needs; None when it needs none."""
    n = _core.sparse_decode_workspace_floats(sched)
    return torch.empty(n, dtype=torch.float32, device=device) if n > 0 else None
