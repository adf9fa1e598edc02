#!/usr/bin/env python3
"""FlashMLA's SM90 sparse kernels on the workloads of `dsv41kv bench --device cuda --read`.

Our harness (not FlashMLA's): it builds the same workloads as bench/read_path_model.cpp (rules,
not bytes: its own random numbers) and times FlashMLA's public entry points the way the dsv41kv
bench times its own (CUDA events around each launch after 3 warm-up launches, a 256 MiB memset
before each timed launch to flush the L2, median over --iters; a 2 GiB device-to-device copy
measured in the same run), printing JSON with the same fields, so that bench/peers/join_read.py
can put both in one table.

  decode   flash_mla_with_kvcache, MODEL1 FP8 sparse cache (584-byte records: a page's data rows
           of 576 bytes, then its scale rows of 8; pages padded to 576 bytes), s_q 2, indices =
           128 window slots (ending at 128 + j of the request's 256-slot SWA region, 4 pages of 64
           through a shuffled table), extra_indices = the compressed keys (distinct random entries
           of the request's 2048, sorted ascending, 64 pages of 32 through a shuffled table);
           shapes 64 heads 128+512, 128 heads 128+512 (the dsv41kv API's top-k width) and
           128 heads 128+1024 (FlashMLA's MODEL1 CONFIG2)
  prefill  flash_mla_sparse_fwd, 64 heads, d_qk = d_v = 512, a bf16 kv of 65536 rows, 640 keys
           per query (row k of token t: (a_t + k * step_t) mod 65536, step_t odd), 32K and 128K
           query tokens
FLOPs 2 * h_q * tokens * keys * (512 + 512); decode bytes = unique records * 584 + q + o
(FlashMLA's tests count 576 a record); prefill bytes = valid indices * 1024 + tokens * h_q * 2048.
"wrong": output elements of the sampled rows beyond 4e-3 + 1e-2 |ref| of an fp32 reference over
the dequantized keys (the SPEC 9.7 element bound).

Run with FlashMLA's built folder on PYTHONPATH (scripts/peer-flashmla.sh build prints it), or
--flashmla DIR. --dry-run lists the lines it would time (JSON, no torch needed).
"""
import argparse
import json
import math
import os
import sys

DECODE_BATCHES = [2, 64, 128, 148, 256]
DECODE_SHAPES = [(64, 512), (128, 512), (128, 1024)]  # (heads, compressed keys)
PREFILL_TOKENS = [32768, 131072]
S_Q = 2
SWA_KEYS = 128
SWA_SLOTS_PER_REQ, SWA_BLOCK = 256, 64
CMP_ENTRIES_PER_REQ, CMP_BLOCK = 2048, 32
PREFILL_HEADS, PREFILL_KV, PREFILL_KEYS = 64, 65536, 640
RECORD_BYTES = 584
D_QK = D_V = 512
SOFTMAX_SCALE = 512 ** -0.5
L2_FLUSH_BYTES = 256 << 20
ATOL, RTOL = 4e-3, 1e-2


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--op", choices=["decode", "prefill"], help="one op only (default both)")
    p.add_argument("--batch", type=int, choices=DECODE_BATCHES, help="decode: one batch only")
    p.add_argument("--heads", type=int, choices=[64, 128], help="decode: one head count only")
    p.add_argument("--cmp-keys", type=int, choices=[512, 1024], help="decode: one compressed-key count only")
    p.add_argument("--tokens", type=int, choices=PREFILL_TOKENS, help="prefill: one query-token count only")
    p.add_argument("--iters", type=int, default=50, help="timed launches per line (median)")
    p.add_argument("--samples", type=int, default=4, help="requests (prefill: tokens) checked per line")
    p.add_argument("--seed", type=int, default=20261202)
    p.add_argument("--flashmla", help="FlashMLA's built folder (put first on sys.path)")
    p.add_argument("--dry-run", action="store_true", help="list the lines as JSON without running anything")
    a = p.parse_args(argv)
    if a.iters < 1:
        p.error(f"--iters {a.iters}: expected >= 1")
    if a.samples < 1:
        p.error(f"--samples {a.samples}: expected >= 1")
    return a


def plan(a):
    """The lines to time: (op, heads, cmp_keys, batch, tokens)."""
    lines = []
    if a.op in (None, "decode"):
        for h, k in DECODE_SHAPES:
            if (a.heads and a.heads != h) or (a.cmp_keys and a.cmp_keys != k):
                continue
            for b in DECODE_BATCHES:
                if a.batch and a.batch != b:
                    continue
                lines.append(("decode", h, k, b, b * S_Q))
    if a.op in (None, "prefill"):
        for t in PREFILL_TOKENS:
            if a.tokens and a.tokens != t:
                continue
            lines.append(("prefill", PREFILL_HEADS, PREFILL_KEYS, 1, t))
    return lines


def attention_flops(heads, tokens, keys):
    return 2.0 * heads * tokens * keys * (D_QK + D_V)


def sample_requests(batch, n):
    """As bench/read_path_model.cpp's sample_requests."""
    if batch <= 0 or n <= 0:
        return []
    if n == 1 or batch == 1:
        return [0]
    s = []
    for i in range(n):
        b = i * (batch - 1) // (n - 1)
        if not s or s[-1] != b:
            s.append(b)
    return s


def row(op, heads, batch, tokens, swa_keys, cmp_keys, n_c, ms, flops, nbytes, copy_gbps, wrong, checked, iters):
    s = ms * 1e-3
    return {"op": op, "heads": heads, "s_q": S_Q, "batch": batch, "tokens": tokens, "swa_keys": swa_keys,
            "cmp_keys": cmp_keys, "record": "v4_584" if op == "decode" else "bf16",
            "swa_record": "v4_584" if op == "decode" else "", "role": "", "n_c": n_c, "ms": ms, "us": ms * 1e3,
            "flops": flops, "bytes": nbytes, "TFLOPS": flops / s / 1e12, "GBps": nbytes / s / 1e9,
            "copy_fraction": nbytes / s / 1e9 / copy_gbps, "wrong": wrong, "checked": checked, "iters": iters}


class Timer:
    def __init__(self, torch, iters):
        self.torch, self.iters = torch, iters
        self.flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")

    def time(self, fn, min_iters=1):
        torch = self.torch
        for _ in range(3):
            self.flush.zero_()
            fn()
        torch.cuda.synchronize()
        n = max(self.iters, min_iters)
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        for a, b in ev:
            self.flush.zero_()
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize()
        # the element dsv41kv's median() takes: index n / 2 of the sorted times
        return sorted(a.elapsed_time(b) for a, b in ev)[n // 2]

    def copy_gbps(self):
        torch = self.torch
        nbytes = 2 << 30
        src = torch.ones(nbytes, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        ms = self.time(lambda: dst.copy_(src), 5)
        del src, dst
        return 2.0 * nbytes / (ms * 1e-3) / 1e9


def shuffled_pages(torch, gen, batch, per_req):
    return torch.randperm(batch * per_req, generator=gen, dtype=torch.int64).view(batch, per_req)


def model1_cache(torch, quant, num_blocks, block_size, gen):
    """A MODEL1 FP8 sparse cache (num_blocks, block_size, 1, 584) from random bf16 keys (`gen`: a
    CUDA generator), through FlashMLA's own quantizer (tests/quant.py: the layout's definition),
    and its dequantized keys."""
    k = torch.randn((num_blocks, block_size, 1, D_QK), generator=gen, dtype=torch.float32, device="cuda")
    k = (k / 10).clamp_(-1, 1).to(torch.bfloat16)
    q = quant.quantize_k_cache(k, quant.FP8KVCacheLayout.MODEL1_FP8Sparse)
    deq = quant.dequantize_k_cache(q, quant.FP8KVCacheLayout.MODEL1_FP8Sparse).view(-1, D_QK).float()
    return q, deq


def reference(torch, q, keys, sink, scale):
    """fp32 attention with sink over keys (K = V): q [h, d], keys [n, d] -> out [h, d]."""
    s = (q.float() @ keys.T) * scale
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    o = torch.softmax(s, dim=-1) @ keys
    return o * torch.sigmoid(lse - sink.view(-1, 1))  # exp(lse) / (exp(lse) + exp(sink))


def count_wrong(torch, out, ref):
    out = out.float()
    bad = (out - ref).abs() > ATOL + RTOL * ref.abs()
    bad |= ~torch.isfinite(out)
    return int(bad.sum().item()), out.numel()


def run_decode(torch, flash_mla, quant, timer, a, heads, cmp_keys, batch, copy_gbps):
    seed = a.seed + batch * 7 + heads + cmp_keys
    gen, dgen = torch.Generator().manual_seed(seed), torch.Generator(device="cuda").manual_seed(seed)
    T = batch * S_Q
    swa_per, cmp_per = SWA_SLOTS_PER_REQ // SWA_BLOCK, CMP_ENTRIES_PER_REQ // CMP_BLOCK
    swa_cache, swa_keys = model1_cache(torch, quant, batch * swa_per, SWA_BLOCK, dgen)
    cmp_cache, cmp_keys_deq = model1_cache(torch, quant, batch * cmp_per, CMP_BLOCK, dgen)
    swa_tab, cmp_tab = shuffled_pages(torch, gen, batch, swa_per), shuffled_pages(torch, gen, batch, cmp_per)
    # window: positions end - 127 .. end of token j, end = 128 + j
    j = torch.arange(S_Q).view(1, S_Q, 1)
    x = (SWA_KEYS + j) - (SWA_KEYS - 1) + torch.arange(SWA_KEYS).view(1, 1, SWA_KEYS)   # [1, s_q, 128]
    x = x.expand(batch, S_Q, SWA_KEYS)
    b = torch.arange(batch).view(batch, 1, 1)
    swa_idx = (swa_tab[b, x // SWA_BLOCK] * SWA_BLOCK + x % SWA_BLOCK).to(torch.int32)
    # compressed: distinct random entries of the request's 2048, sorted ascending
    e = torch.rand((batch, S_Q, CMP_ENTRIES_PER_REQ), generator=gen).argsort(dim=-1)[..., :cmp_keys].sort(dim=-1).values
    cmp_idx = (cmp_tab[b, e // CMP_BLOCK] * CMP_BLOCK + e % CMP_BLOCK).to(torch.int32)
    unique = swa_idx.unique().numel() + cmp_idx.unique().numel()
    swa_idx, cmp_idx = swa_idx.cuda(), cmp_idx.cuda()
    q = torch.empty((batch, S_Q, heads, D_QK), dtype=torch.float32).uniform_(-1, 1, generator=gen)
    q = q.to(torch.bfloat16).cuda()
    sink = (torch.rand((heads,), generator=gen) * 4 - 2).cuda()
    meta, _ = flash_mla.get_mla_metadata()

    def call():
        return flash_mla.flash_mla_with_kvcache(q, swa_cache, None, None, D_V, meta, None, SOFTMAX_SCALE, False, True,
                                                swa_idx, sink, cmp_cache, cmp_idx, None, None)

    out, _ = call()
    torch.cuda.synchronize()
    wrong = checked = 0
    for r in sample_requests(batch, a.samples):
        for jj in range(S_Q):
            keys = torch.cat([swa_keys[swa_idx[r, jj].long()], cmp_keys_deq[cmp_idx[r, jj].long()]])
            w, c = count_wrong(torch, out[r, jj], reference(torch, q[r, jj], keys, sink, SOFTMAX_SCALE))
            wrong, checked = wrong + w, checked + c
    ms = timer.time(call)
    nbytes = unique * RECORD_BYTES + 2 * T * heads * D_QK + 2 * T * heads * D_V
    return row("decode", heads, batch, T, SWA_KEYS, cmp_keys, 0, ms, attention_flops(heads, T, SWA_KEYS + cmp_keys),
               nbytes, copy_gbps, wrong, checked, a.iters)


def run_prefill(torch, flash_mla, timer, a, tokens, copy_gbps):
    gen, dgen = torch.Generator().manual_seed(a.seed + tokens), torch.Generator(device="cuda").manual_seed(a.seed + tokens)
    H, S, K = PREFILL_HEADS, PREFILL_KV, PREFILL_KEYS
    kv = torch.empty((S, 1, D_QK), dtype=torch.float32, device="cuda").uniform_(-2, 2, generator=dgen).to(torch.bfloat16)
    q = torch.empty((tokens, H, D_QK), dtype=torch.bfloat16, device="cuda")
    pool = torch.empty((4096, H, D_QK), dtype=torch.float32, device="cuda").uniform_(-1, 1, generator=dgen)
    pool = pool.to(torch.bfloat16)
    for t in range(0, tokens, 4096):
        q[t:t + 4096] = pool[:min(4096, tokens - t)]
    start = torch.randint(0, S, (tokens, 1), generator=gen)
    step = torch.randint(0, S // 2, (tokens, 1), generator=gen) * 2 + 1  # odd: coprime to 65536
    idx = ((start + torch.arange(K).view(1, K) * step) % S).to(torch.int32).view(tokens, 1, K).cuda()
    sink = (torch.rand((H,), generator=gen) * 4 - 2).cuda()

    def call():
        return flash_mla.flash_mla_sparse_fwd(q, kv, idx, SOFTMAX_SCALE, D_V, sink, None)

    out = call()[0]
    torch.cuda.synchronize()
    wrong = checked = 0
    kvf = kv.view(S, D_QK).float()
    for t in sample_requests(tokens, a.samples):
        w, c = count_wrong(torch, out[t], reference(torch, q[t], kvf[idx[t, 0].long()], sink, SOFTMAX_SCALE))
        wrong, checked = wrong + w, checked + c
    del out
    ms = timer.time(call)
    nbytes = tokens * K * D_QK * 2 + tokens * H * (D_QK + D_V) * 2
    return row("prefill", H, 1, tokens, 0, K, S, ms, attention_flops(H, tokens, K), nbytes, copy_gbps, wrong, checked,
               a.iters)


def main(argv=None):
    a = parse_args(argv)
    lines = plan(a)
    if a.dry_run:
        print(json.dumps({"impl": "flashmla", "dry_run": True,
                          "lines": [dict(zip(("op", "heads", "cmp_keys", "batch", "tokens"), l)) for l in lines]}, indent=1))
        return 0
    if a.flashmla:
        sys.path.insert(0, a.flashmla)
    import torch
    import flash_mla
    fm_dir = os.path.dirname(os.path.dirname(os.path.abspath(flash_mla.__file__)))
    sys.path.insert(0, os.path.join(fm_dir, "tests"))
    import quant  # FlashMLA's tests/quant.py: the MODEL1 cache layout
    if not torch.cuda.is_available():
        print("flashmla_sparse.py: no CUDA device", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    timer = Timer(torch, a.iters)
    copy_gbps = timer.copy_gbps()
    rows = []
    for op, heads, keys, batch, tokens in lines:
        if op == "decode":
            rows.append(run_decode(torch, flash_mla, quant, timer, a, heads, keys, batch, copy_gbps))
        else:
            rows.append(run_prefill(torch, flash_mla, timer, a, tokens, copy_gbps))
        torch.cuda.empty_cache()
        print(f"flashmla {op} h{heads} keys {keys} batch {batch} tokens {tokens}: {rows[-1]['us']:.1f} us, "
              f"{rows[-1]['TFLOPS']:.1f} TFLOPS, wrong {rows[-1]['wrong']}", file=sys.stderr)
    total_wrong = sum(r["wrong"] for r in rows)
    print(json.dumps({"impl": "flashmla", "device": torch.cuda.get_device_name(), "copy_GBps": copy_gbps,
                      "iters": a.iters, "flashmla_dir": fm_dir,
                      "timing": "cuda events, 3 warm-up launches, L2 flush (256 MiB memset) before each timed launch, median",
                      "rows": rows, "total_wrong": total_wrong}, indent=1))
    return 0 if total_wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
