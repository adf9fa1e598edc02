"""torch.ops.dsv41kv.*: the array ops as torch custom ops (torch >= 2.4), for torch.compile and
CUDA graphs. `import dsv41kv.torch` registers them; eager code may call dsv41kv.* directly.

Every op mutates its outputs in place and returns nothing; its schema marks those arguments
`Tensor(a!)` (mutates_args), and a fake implementation (nothing to compute: no output is
created) lets torch.compile trace it. The ops run on the current stream of the tensors' device,
as the eager calls do. Arguments as the functions of the same name in dsv41kv (their
docstrings give shapes and dtypes); the decode schedule and the prefill chunk travel as ints.
"""
from typing import Optional

import torch

from . import _core
from ._workspace import decode_workspace

if not hasattr(torch, "library") or not hasattr(torch.library, "custom_op"):
    raise ImportError(f"dsv41kv.torch needs torch >= 2.4 (torch.library.custom_op); this is torch {torch.__version__}")

Tensor = torch.Tensor
OPS = []


def _op(name, mutates):
    def wrap(fn):
        op = torch.library.custom_op(f"dsv41kv::{name}", mutates_args=mutates)(fn)
        op.register_fake(lambda *a, **k: None)
        OPS.append(name)
        return op
    return wrap


# ---------------------------------------------------------------- write path

@_op("fused_save_compress_norm", ("latent_out", "ring"))
def fused_save_compress_norm(kv_score: Tensor, positions: Tensor, slot_mapping: Tensor, norm_weight: Tensor,
                             eps: float, latent_out: Tensor, ratio: int = 2, ring: Optional[Tensor] = None,
                             qsl: Optional[Tensor] = None, token_to_req: Optional[Tensor] = None,
                             policy: str = "tail", prev_rows: Optional[Tensor] = None,
                             prev_row_indices: Optional[Tensor] = None) -> None:
    _core.fused_save_compress_norm(kv_score, positions, slot_mapping, norm_weight, eps, latent_out, ratio=ratio,
                                   ring=ring, qsl=qsl, token_to_req=token_to_req, policy=policy,
                                   prev_rows=prev_rows, prev_row_indices=prev_row_indices)


@_op("rope_quant_insert", ("cache",))
def rope_quant_insert(latent: Tensor, positions: Tensor, rope_table: Tensor, slots: Tensor, cache: Tensor,
                      cache_format: str = "v4_584", states_per_page: Optional[int] = None, fp8_scale: float = 1.0,
                      ratio: int = 2) -> None:
    _core.rope_quant_insert(latent, positions, rope_table, slots, cache, cache_format=cache_format,
                            states_per_page=states_per_page, fp8_scale=fp8_scale, ratio=ratio)


@_op("compress_insert", ("cache", "latent_out", "ring"))
def compress_insert(kv_score: Tensor, positions: Tensor, slot_mapping: Tensor, norm_weight: Tensor, eps: float,
                    rope_table: Tensor, insert_slots: Tensor, cache: Tensor, cache_format: str = "v4_584",
                    states_per_page: Optional[int] = None, fp8_scale: float = 1.0, ratio: int = 2,
                    latent_out: Optional[Tensor] = None, ring: Optional[Tensor] = None,
                    qsl: Optional[Tensor] = None, token_to_req: Optional[Tensor] = None,
                    policy: str = "tail", prev_rows: Optional[Tensor] = None,
                    prev_row_indices: Optional[Tensor] = None) -> None:
    _core.compress_insert(kv_score, positions, slot_mapping, norm_weight, eps, rope_table, insert_slots, cache,
                          cache_format=cache_format, states_per_page=states_per_page, fp8_scale=fp8_scale,
                          ratio=ratio, latent_out=latent_out, ring=ring, qsl=qsl, token_to_req=token_to_req,
                          policy=policy, prev_rows=prev_rows, prev_row_indices=prev_row_indices)


@_op("save_ring_rows", ("ring",))
def save_ring_rows(prev_rows: Tensor, ring_write_slots: Tensor, ring: Tensor) -> None:
    _core.save_ring_rows(prev_rows, ring_write_slots, ring)


@_op("gather", ("out",))
def gather(cache: Tensor, slots: Tensor, out: Tensor, cache_format: str = "v4_584",
           states_per_page: Optional[int] = None, fp8_scale: float = 1.0) -> None:
    _core.gather(cache, slots, out, cache_format=cache_format, states_per_page=states_per_page, fp8_scale=fp8_scale)


@_op("swa_insert_q_rope", ("cache", "q_out"))
def swa_insert_q_rope(kv: Tensor, q: Tensor, positions: Tensor, rope_table: Tensor, slot_swa: Tensor, cache: Tensor,
                      q_out: Tensor, cache_format: str = "v4_584", states_per_page: Optional[int] = None,
                      fp8_scale: float = 1.0) -> None:
    _core.swa_insert_q_rope(kv, q, positions, rope_table, slot_swa, cache, q_out, cache_format=cache_format,
                            states_per_page=states_per_page, fp8_scale=fp8_scale)


# ---------------------------------------------------------------- metadata (the ones with device builders)

@_op("build_token_to_req", ("token_to_req",))
def build_token_to_req(qsl: Tensor, token_to_req: Tensor, num_actual_tokens: int = -1) -> None:
    _core.build_token_to_req(qsl, token_to_req, num_actual_tokens=num_actual_tokens)


@_op("build_token_valid", ("token_valid",))
def build_token_valid(slot_swa: Tensor, token_valid: Tensor) -> None:
    _core.build_token_valid(slot_swa, token_valid)


@_op("mask_invalid_lengths", ("lengths",))
def mask_invalid_lengths(token_valid: Tensor, lengths: Tensor) -> None:
    _core.mask_invalid_lengths(token_valid, lengths)


@_op("build_ring_slots", ("ring_slots",))
def build_ring_slots(token_to_req: Tensor, positions: Tensor, ring_block_table: Tensor, ring_slots: Tensor,
                     num_actual_tokens: int, cap: int = 8, num_ring_blocks: int = -1) -> None:
    _core.build_ring_slots(token_to_req, positions, ring_block_table, ring_slots, num_actual_tokens=num_actual_tokens,
                           cap=cap, num_ring_blocks=num_ring_blocks)


@_op("build_token_slots", ("slots",))
def build_token_slots(token_to_req: Tensor, positions: Tensor, block_table: Tensor, slots: Tensor,
                      num_actual_tokens: int, page: int = 32, num_pages: int = -1) -> None:
    _core.build_token_slots(token_to_req, positions, block_table, slots, num_actual_tokens=num_actual_tokens,
                            page=page, num_pages=num_pages)


@_op("build_compressed_slots", ("slots",))
def build_compressed_slots(token_to_req: Tensor, positions: Tensor, block_table: Tensor, slots: Tensor, ratio: int,
                           num_actual_tokens: int, states_per_page: int = 32, token_slots: Optional[Tensor] = None,
                           num_pages: int = -1) -> None:
    _core.build_compressed_slots(token_to_req, positions, block_table, slots, ratio=ratio,
                                 num_actual_tokens=num_actual_tokens, states_per_page=states_per_page,
                                 token_slots=token_slots, num_pages=num_pages)


# ---------------------------------------------------------------- indexer

@_op("indexer_k_store", ("k_cache",))
def indexer_k_store(latent: Tensor, positions: Tensor, slots: Tensor, wk: Tensor, k_norm: Tensor, eps: float,
                    rope_table: Tensor, k_cache: Tensor, states_per_page: int, ratio: int = 2,
                    k_format: str = "fp8_132") -> None:
    _core.indexer_k_store(latent, positions, slots, wk, k_norm, eps, rope_table, k_cache,
                          states_per_page=states_per_page, ratio=ratio, k_format=k_format)


@_op("indexer_prepare_q", ("q8", "w"))
def indexer_prepare_q(q: Tensor, w_raw: Tensor, positions: Tensor, rope_table: Tensor, q8: Tensor, w: Tensor) -> None:
    _core.indexer_prepare_q(q, w_raw, positions, rope_table, q8, w)


@_op("indexer_topk", ("topk", "candidates", "scores", "workspace"))
def indexer_topk(q8: Tensor, w: Tensor, positions: Tensor, token_to_req: Tensor, block_table: Tensor, k_cache: Tensor,
                 topk: Tensor, states_per_page: int, ratio: int = 1, role: str = "plain",
                 token_valid: Optional[Tensor] = None, candidates: Optional[Tensor] = None,
                 scores: Optional[Tensor] = None, workspace: Optional[Tensor] = None) -> None:
    _core.indexer_topk(q8, w, positions, token_to_req, block_table, k_cache, topk, states_per_page=states_per_page,
                       ratio=ratio, role=role, token_valid=token_valid, candidates=candidates, scores=scores,
                       workspace=workspace)


@_op("indexer_shortcut_topk", ("topk",))
def indexer_shortcut_topk(positions: Tensor, topk: Tensor, ratio: int = 1, token_valid: Optional[Tensor] = None) -> None:
    _core.indexer_shortcut_topk(positions, topk, ratio=ratio, token_valid=token_valid)


# ---------------------------------------------------------------- attention

_schedules = {}


def _schedule(layer, num_tokens, num_heads, s_q, block_size, splits, device="cpu"):
    key = (layer, num_tokens, num_heads, s_q, block_size, splits, device)
    s = _schedules.get(key)
    if s is None:
        s = _core.plan_decode_schedule(layer, num_tokens, num_heads=num_heads, s_q=s_q, block_size=block_size,
                                       device=device)
        if splits > 0:
            s.splits = splits
        _schedules[key] = s
    return s


@_op("sparse_decode", ("out", "lse"))
def sparse_decode(q: Tensor, swa_cache: Tensor, swa_indices: Tensor, swa_lens: Tensor, sink: Tensor, out: Tensor,
                  lse: Tensor, layer: str = "swaonly", block_size: int = 64, s_q: int = 1, splits: int = 0,
                  swa_format: str = "v4_584", swa_states_per_page: int = 32, swa_fp8_scale: float = 1.0,
                  cmp_cache: Optional[Tensor] = None, cmp_indices: Optional[Tensor] = None,
                  cmp_lens: Optional[Tensor] = None, cmp_format: str = "v4_584",
                  cmp_states_per_page: Optional[int] = None, cmp_fp8_scale: float = 1.0,
                  softmax_scale: float = _core.SOFTMAX_SCALE) -> None:
    """sparse_decode with the schedule given by (layer, block_size, s_q, splits; 0: the planner's)."""
    sched = _schedule(layer, q.shape[0], q.shape[1], s_q, block_size, splits, "cuda" if q.is_cuda else "cpu")
    _core.sparse_decode(sched, q, swa_cache, swa_indices, swa_lens, sink, out, lse, swa_format=swa_format,
                        swa_states_per_page=swa_states_per_page, swa_fp8_scale=swa_fp8_scale, cmp_cache=cmp_cache,
                        cmp_indices=cmp_indices, cmp_lens=cmp_lens, cmp_format=cmp_format,
                        cmp_states_per_page=cmp_states_per_page, cmp_fp8_scale=cmp_fp8_scale, s_q=s_q,
                        softmax_scale=softmax_scale, workspace=decode_workspace(sched, q.device))


@_op("sparse_prefill", ("out", "lse"))
def sparse_prefill(q: Tensor, kv: Tensor, indices: Tensor, topk_length: Tensor, sink: Tensor, out: Tensor, lse: Tensor,
                   softmax_scale: float = _core.SOFTMAX_SCALE) -> None:
    _core.sparse_prefill(q, kv, indices, topk_length, sink, out, lse, softmax_scale=softmax_scale)


@_op("build_prefill_indices", ("indices", "lengths"))
def build_prefill_indices(req_begin: int, req_end: int, n_ch: int, m_ch: int, positions: Tensor, token_to_req: Tensor,
                          gather_lens: Tensor, gather_starts: Tensor, indices: Tensor, lengths: Tensor, ratio: int,
                          topk: Optional[Tensor] = None) -> None:
    c = _core.PrefillChunk()
    c.req_begin, c.req_end, c.n_ch, c.m_ch = req_begin, req_end, n_ch, m_ch
    _core.build_prefill_indices(c, positions, token_to_req, gather_lens, gather_starts, indices, lengths,
                                ratio=ratio, topk=topk)


@_op("attention_output_rope", ("out",))
def attention_output_rope(o: Tensor, positions: Tensor, rope_table: Tensor, out: Tensor, num_real_heads: int) -> None:
    _core.attention_output_rope(o, positions, rope_table, out, num_real_heads=num_real_heads)
