"""A FlashMLA-compatible entry point (the sparse calls of FlashMLA's last Hopper release,
flash_mla/flash_mla_interface.py at 9241ae3) backed by dsv41kv's kernels, for engines that call
FlashMLA on Hopper today: `from dsv41kv import flash_mla` in place of `import flash_mla`.

  get_mla_metadata(*args, **kwargs) -> (FlashMLASchedMeta, None)
  flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                         num_splits=None, softmax_scale=None, causal=False, is_fp8_kvcache=False,
                         indices=None, attn_sink=None, extra_k_cache=None, extra_indices_in_kvcache=None,
                         topk_length=None, extra_topk_length=None, *, cache_format=None,
                         extra_cache_format=None) -> (out, softmax_lse)
  flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None)
      -> (out, max_logits, lse)

Sparse mode only, d_qk = d_v = 512 (DeepSeek V4.1; V3.2's 576-dim, 656-byte records are another
model's format and are refused). The KV cache records: FlashMLA's MODEL1 FP8 layout (k_cache
(num_blocks, block_size, 1, 584) e4m3 / uint8 over pages of block_size * 584 bytes padded to 576)
and, beyond what FlashMLA reads on Hopper, the 528-byte MXFP8 and 288-byte NVFP4 records and
plain bf16 rows, chosen by the last dimension (584, 528, 288 bytes; bf16 [.., 512]) or by
`cache_format` / `extra_cache_format`.

Semantics as FlashMLA's: indices are global slots (page * block_size + offset), -1 (or any
out-of-range value) masked; topk_length / extra_topk_length (decode: per batch; prefill: per
query) bound each row's list; the sink scales the output by exp(lse) / (exp(lse) + exp(sink))
and leaves lse alone; a row without a valid key has output 0 and lse +inf. The decode key lists
go through dsv41kv.sparse_decode in calls of up to 512 + 128 entries; lists that need more than
one call are merged by their log-sum-exp (each call without the sink, the sink applied once).
max_logits of flash_mla_sparse_fwd (which dsv41kv's kernel does not produce) is computed beside it
in binary64 from the same keys.
"""
import dataclasses
from typing import Optional, Tuple

import torch

from . import _core
from ._workspace import decode_workspace

_CMP_W, _SWA_W = 512, 128  # key widths of one sparse_decode call (compressed list, SWA list)
_BY_BYTES = {584: "v4_584", 528: "mxfp8_528", 288: "nvfp4_288"}


@dataclasses.dataclass
class FlashMLASchedMeta:
    """FlashMLA's scheduler metadata: the shapes fixed by the first call (checked on later ones)."""

    @dataclasses.dataclass
    class Config:
        b: int
        s_q: int
        h_q: int
        page_block_size: int
        h_k: int
        causal: bool
        is_fp8_kvcache: bool
        topk: Optional[int]
        extra_page_block_size: Optional[int]
        extra_topk: Optional[int]

    have_initialized: bool = False
    config: Optional[Config] = None
    tile_scheduler_metadata: Optional[torch.Tensor] = None
    num_splits: Optional[torch.Tensor] = None


def get_mla_metadata(*args, **kwargs) -> Tuple[FlashMLASchedMeta, None]:
    """An empty FlashMLASchedMeta (filled by the first flash_mla_with_kvcache call), and None."""
    return FlashMLASchedMeta(), None


def _cache(k: torch.Tensor, fmt: Optional[str], arg: str):
    """(format, states_per_page, dsv41kv cache view) of a FlashMLA-shaped cache, without copying."""
    if k.dim() != 4 or k.shape[2] != 1:
        raise ValueError(f"flash_mla: {arg}: shape {tuple(k.shape)}, expected (num_blocks, block_size, 1, bytes_per_token)")
    nb, bs, _, last = k.shape
    if fmt is None:
        if k.dtype == torch.bfloat16 and last == 512:
            fmt = "bf16"
        elif k.element_size() == 1 and last in _BY_BYTES:
            fmt = _BY_BYTES[last]
        elif k.element_size() == 1 and last == 656:
            raise ValueError(f"flash_mla: {arg}: 656-byte records are DeepSeek V3.2's (d_qk 576), not V4.1's; "
                             "dsv41kv reads 584 / 528 / 288-byte records and bf16 rows")
        else:
            raise ValueError(f"flash_mla: {arg}: dtype {k.dtype} with last dimension {last}: expected 584, 528 or 288 "
                             "bytes per token (uint8 / float8_e4m3fn) or bf16 rows of 512")
    if fmt == "bf16":
        view = k.as_strided((nb, bs, 512), (k.stride(0), k.stride(1), 1))
    else:
        rb = _core.record_info(fmt)["record_bytes"]
        if last != rb:
            raise ValueError(f"flash_mla: {arg}: {last} bytes per token, the {fmt} format has {rb}")
        u8 = k.view(torch.uint8) if k.dtype != torch.uint8 else k
        page = k.stride(0) if nb > 1 else bs * rb
        view = u8.as_strided((nb, bs * rb), (page, 1))
    return fmt, bs, view


def _lists(indices, lengths, b, s_q, T):
    """[T, K] int32 index rows and [T] int32 lengths (FlashMLA's decode lengths are per batch)."""
    idx = indices.reshape(T, indices.shape[-1]).to(torch.int32)
    if lengths is None:
        lens = torch.full((T,), idx.shape[1], dtype=torch.int32, device=idx.device)
    else:
        lens = lengths.to(torch.int32).repeat_interleave(s_q) if lengths.numel() == b else lengths.reshape(T).to(torch.int32)
    return idx, lens


def _rows(x):
    """x itself when its rows of 512 bf16 suit the CUDA kernels (inner stride 1, other strides
    multiples of 8 elements: 16-byte aligned rows), else a contiguous copy."""
    if x.stride(-1) == 1 and all(s % 8 == 0 for s in x.stride()[:-1]) and x.data_ptr() % 16 == 0:
        return x
    return x.contiguous()


def _pad(x, width):
    if x.shape[1] == width:
        return x.contiguous()
    out = torch.full((x.shape[0], width), -1, dtype=torch.int32, device=x.device)
    out[:, :x.shape[1]] = x
    return out


def _decode_calls(cache, idx, lens):
    """The calls of one key list: (cache, cmp part [T, 512], its lengths, swa part [T, 128] or None,
    its lengths). NVFP4 records serve only as compressed keys (SPEC 3.4): 512 entries a call."""
    calls = []
    width = _CMP_W if cache[0] == "nvfp4_288" else _CMP_W + _SWA_W
    K = idx.shape[1]
    for start in range(0, max(K, 1), width):
        chunk = idx[:, start:start + width]
        n = (lens - start).clamp(0, chunk.shape[1]).to(torch.int32)
        cmp = _pad(chunk[:, :_CMP_W], _CMP_W)
        swa = _pad(chunk[:, _CMP_W:], _SWA_W) if chunk.shape[1] > _CMP_W else None
        calls.append((cache, cmp, n.clamp(max=_CMP_W), swa, (n - _CMP_W).clamp(min=0)))
    return calls


def _run_decode(q3, sink, scale, calls):
    T, H, _ = q3.shape
    outs, lses = [], []
    for (fmt, S, view), cmp, cmp_len, swa, swa_len in calls:
        sched = _core.plan_decode_schedule("c1a", T, num_heads=H, s_q=1, block_size=S,
                                           device="cuda" if q3.is_cuda else "cpu")
        o = torch.empty((T, H, 512), dtype=torch.bfloat16, device=q3.device)
        lse = torch.empty((T, H), dtype=torch.float32, device=q3.device)
        swa_fmt, swa_S, swa_view = fmt, S, view
        if swa is None:  # no SWA part: an empty list over a one-record cache
            swa = torch.full((T, _SWA_W), -1, dtype=torch.int32, device=q3.device)
            swa_len = torch.zeros_like(cmp_len)
            swa_fmt, swa_S, swa_view = "v4_584", 1, torch.zeros((1, 1152), dtype=torch.uint8, device=q3.device)
        _core.sparse_decode(sched, q3, swa_view, swa, swa_len.contiguous(), sink, o, lse, swa_format=swa_fmt,
                            swa_states_per_page=swa_S, cmp_cache=view, cmp_indices=cmp, cmp_lens=cmp_len.contiguous(),
                            cmp_format=fmt, cmp_states_per_page=S, softmax_scale=scale,
                            workspace=decode_workspace(sched, q3.device))
        outs.append(o)
        lses.append(lse)
    return outs, lses


def _merge(outs, lses, sink):
    """Partial results without the sink, merged by log-sum-exp; then the sink, once."""
    part = torch.stack([torch.where(torch.isinf(l), torch.full_like(l, -torch.inf), l) for l in lses])  # [n, T, H]
    lse = torch.logsumexp(part, dim=0)
    w = torch.exp(part - lse.unsqueeze(0)).nan_to_num(0.0)
    o = sum(w[i].unsqueeze(-1) * outs[i].float() for i in range(len(outs)))
    none = torch.isneginf(lse)
    scale = 1.0 / (1.0 + torch.exp(sink.view(1, -1) - lse))
    o = torch.where(none.unsqueeze(-1), torch.zeros_like(o), o * scale.unsqueeze(-1))
    lse = torch.where(none, torch.full_like(lse, torch.inf), lse)
    return o.to(torch.bfloat16), lse


def flash_mla_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, block_table: Optional[torch.Tensor],
                           cache_seqlens: Optional[torch.Tensor], head_dim_v: int,
                           tile_scheduler_metadata: FlashMLASchedMeta, num_splits: None = None,
                           softmax_scale: Optional[float] = None, causal: bool = False, is_fp8_kvcache: bool = False,
                           indices: Optional[torch.Tensor] = None, attn_sink: Optional[torch.Tensor] = None,
                           extra_k_cache: Optional[torch.Tensor] = None,
                           extra_indices_in_kvcache: Optional[torch.Tensor] = None,
                           topk_length: Optional[torch.Tensor] = None,
                           extra_topk_length: Optional[torch.Tensor] = None, *, cache_format: Optional[str] = None,
                           extra_cache_format: Optional[str] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """FlashMLA's sparse decode: q (b, s_q, h_q, 512) bf16; k_cache (num_blocks, block_size, 1, bytes);
    indices (b, s_q, topk) int32 global slots; optional extra cache and indices; topk_length /
    extra_topk_length (b,) int32; attn_sink (h_q,) f32. Returns out (b, s_q, h_q, 512) bf16 and
    softmax_lse (b, h_q, s_q) f32."""
    sched_meta = tile_scheduler_metadata
    if not isinstance(sched_meta, FlashMLASchedMeta):
        raise TypeError("flash_mla_with_kvcache: tile_scheduler_metadata must be a FlashMLASchedMeta (get_mla_metadata)")
    if num_splits is not None:
        raise ValueError("flash_mla_with_kvcache: num_splits must be None")
    if indices is None:
        raise NotImplementedError("flash_mla_with_kvcache: dense attention is not provided by dsv41kv (sparse mode: pass indices)")
    if causal:
        raise ValueError("flash_mla_with_kvcache: causal must be False in sparse mode")
    if head_dim_v != 512 or q.shape[-1] != 512:
        raise ValueError(f"flash_mla_with_kvcache: head_dim_v = {head_dim_v}, q head dim {q.shape[-1]}: dsv41kv serves "
                         "d_qk = d_v = 512 (DeepSeek V4.1)")
    b, s_q, h_q, _ = q.shape
    cfg = FlashMLASchedMeta.Config(b, s_q, h_q, k_cache.shape[1], k_cache.shape[2], causal, is_fp8_kvcache,
                                   indices.shape[-1], extra_k_cache.shape[1] if extra_k_cache is not None else None,
                                   extra_indices_in_kvcache.shape[-1] if extra_indices_in_kvcache is not None else None)
    if not sched_meta.have_initialized:
        sched_meta.have_initialized, sched_meta.config = True, cfg
    elif sched_meta.config != cfg:
        raise ValueError(f"flash_mla_with_kvcache: the arguments' shapes {cfg} differ from the first call's "
                         f"{sched_meta.config} on this sched_meta")
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    T = b * s_q
    q3 = _rows(q.reshape(T, h_q, 512))
    sink = attn_sink.float().contiguous() if attn_sink is not None else torch.full(
        (h_q,), -torch.inf, dtype=torch.float32, device=q.device)
    lists = [(_cache(k_cache, cache_format, "k_cache"), *_lists(indices, topk_length, b, s_q, T))]
    if extra_k_cache is not None:
        if extra_indices_in_kvcache is None:
            raise ValueError("flash_mla_with_kvcache: extra_k_cache needs extra_indices_in_kvcache")
        lists.append((_cache(extra_k_cache, extra_cache_format, "extra_k_cache"),
                      *_lists(extra_indices_in_kvcache, extra_topk_length, b, s_q, T)))
    calls = [c for cache, idx, lens in lists for c in _decode_calls(cache, idx, lens)]
    if len(calls) == 1:
        outs, lses = _run_decode(q3, sink, softmax_scale, calls)
        out, lse = outs[0], lses[0]
    else:
        no_sink = torch.full_like(sink, -torch.inf)
        outs, lses = _run_decode(q3, no_sink, softmax_scale, calls)
        out, lse = _merge(outs, lses, sink)
    return out.view(b, s_q, h_q, 512), lse.view(b, s_q, h_q).transpose(1, 2)


def flash_mla_sparse_fwd(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float, d_v: int = 512,
                         attn_sink: Optional[torch.Tensor] = None,
                         topk_length: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashMLA's sparse prefill: q [s_q, h_q, 512] bf16, kv [s_kv, 1, 512] bf16, indices [s_q, 1, topk]
    int32 (< 0 or >= s_kv masked), attn_sink [h_q] f32, topk_length [s_q] int32. Returns
    (out [s_q, h_q, 512] bf16, max_logits [s_q, h_q] f32, lse [s_q, h_q] f32)."""
    if d_v != 512 or q.shape[-1] != 512 or kv.shape[-1] != 512:
        raise ValueError(f"flash_mla_sparse_fwd: d_qk {q.shape[-1]}, d_v {d_v}: dsv41kv serves d_qk = d_v = 512")
    if kv.dim() != 3 or kv.shape[1] != 1 or indices.dim() != 3 or indices.shape[1] != 1:
        raise ValueError("flash_mla_sparse_fwd: expected kv [s_kv, 1, 512] and indices [s_q, 1, topk] (h_kv = 1)")
    s_q, h_q, _ = q.shape
    idx = indices[:, 0, :].to(torch.int32).contiguous()
    q = _rows(q)
    kv2 = _rows(kv[:, 0, :])
    lens = (topk_length.to(torch.int32).contiguous() if topk_length is not None
            else torch.full((s_q,), idx.shape[1], dtype=torch.int32, device=q.device))
    sink = attn_sink.float().contiguous() if attn_sink is not None else torch.full(
        (h_q,), -torch.inf, dtype=torch.float32, device=q.device)
    out = torch.empty((s_q, h_q, 512), dtype=torch.bfloat16, device=q.device)
    lse = torch.empty((s_q, h_q), dtype=torch.float32, device=q.device)
    _core.sparse_prefill(q, kv2, idx, lens, sink, out, lse, softmax_scale=sm_scale)
    return out, _max_logits(q, kv2, idx, lens, sm_scale), lse


def _max_logits(q, kv, idx, lens, scale, rows_per_step=32):
    """max_j scale * q . kv[idx[t, j]] over each row's valid entries, in binary64, rounded to fp32."""
    s_q, h_q, _ = q.shape
    out = torch.empty((s_q, h_q), dtype=torch.float32, device=q.device)
    K = idx.shape[1]
    col = torch.arange(K, device=q.device)
    for a in range(0, s_q, rows_per_step):
        i = idx[a:a + rows_per_step].long()
        valid = (i >= 0) & (i < kv.shape[0]) & (col < lens[a:a + rows_per_step, None])
        k = kv[i.clamp(0, max(kv.shape[0] - 1, 0))].double()  # [r, K, 512]
        s = torch.einsum("rhd,rkd->rhk", q[a:a + rows_per_step].double(), k) * scale
        s = s.masked_fill(~valid[:, None, :], -torch.inf)
        out[a:a + rows_per_step] = s.amax(dim=-1).float() if K > 0 else -torch.inf
    return out
