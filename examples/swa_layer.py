#!/usr/bin/env python3
"""One sliding-window (ratio-0) V4.1 attention layer through dsv41kv from Python: three requests
prefill their prompts in one step, then decode two tokens each; every step's output is checked
against a numpy reference (binary64 attention over each query's 128-token window, with the sink
and both RoPEs). With --torch the arrays the ops touch are torch tensors (on the GPU when there
is one and dsv41kv was built with CUDA); the host-side metadata stays numpy.

  python examples/swa_layer.py [--torch] [--layer] [--seed N]

Per step: token_to_req and the SWA slot mapping (SPEC 6.1, 6.4), the SWA insert fused with the
query RoPE (5.4), then the decode tokens' window rows + sparse_decode (6.6, 9.4) and the prefill
requests' gather + index rows + sparse_prefill (9.5), and the output inverse RoPE (9.6). With
--layer the same steps are one dsv41kv.AttentionLayer.run each (the metadata from a
dsv41kv.StepMetadata of the batch), checked against the same reference.
"""
import argparse
import sys

import ml_dtypes
import numpy as np

import dsv41kv

H, PAGE, PAGES_PER_REQ = 16, 32, 8  # query heads, SWA tokens per page, pages per request
BF16 = ml_dtypes.bfloat16


def bf16(x):
    return np.asarray(x, np.float32).astype(BF16)


def rope(x, table, pos, inverse=False):
    """SPEC 1.4 on dims 448..511 (GPT-J pairs) of x [..., 512] at rows pos, in binary64."""
    y = x.astype(np.float64).copy()
    c, s = table[pos, :32].astype(np.float64), table[pos, 32:].astype(np.float64)
    while c.ndim < y.ndim - 1:
        c, s = c[:, None], s[:, None]
    x0, x1 = y[..., 448::2].copy(), y[..., 449::2].copy()
    sg = -1.0 if inverse else 1.0
    y[..., 448::2] = x0 * c - sg * x1 * s
    y[..., 449::2] = x1 * c + sg * x0 * s
    return y


class Arrays:
    """numpy, or torch tensors on `device` (bf16 as torch.bfloat16), for the arrays the ops touch."""

    def __init__(self, use_torch):
        self.torch = None
        self.device = "cpu"
        if use_torch:
            import torch
            self.torch = torch
            self.device = "cuda" if torch.cuda.is_available() and dsv41kv.cuda_device_available() else "cpu"

    def put(self, a):
        if self.torch is None:
            return a
        a = np.ascontiguousarray(a)
        if a.dtype == BF16:
            return self.torch.from_numpy(a.view(np.int16)).to(self.device).view(self.torch.bfloat16)
        return self.torch.from_numpy(a).to(self.device)

    def get(self, t):
        if self.torch is None:
            return t
        if t.dtype == self.torch.bfloat16:
            return t.view(self.torch.int16).cpu().numpy().view(BF16)
        return t.cpu().numpy()


class LayerPath:
    """The same layer as one dsv41kv.AttentionLayer: StepMetadata builds the step's metadata from
    the batch, run() does every op of ops_step (its caches and outputs are the layer's own)."""

    def __init__(self, x, cfg, table, sink, block_table):
        self.x, self.block_table = x, block_table
        R = block_table.shape[0]
        self.serving = dsv41kv.ServingConfig(device="cuda" if x.device == "cuda" else "cpu", max_tokens=256,
                                             max_requests=R, swa_page_tokens=PAGE, swa_num_pages=R * PAGES_PER_REQ + 1,
                                             swa_block_table_width=PAGES_PER_REQ,
                                             # a configuration serves some compressed type: here c1a with
                                             # only the null page (its table covers max_model_len) and no
                                             # layer of it
                                             c1a_num_pages=1, c1a_block_table_width=PAGE * PAGES_PER_REQ // 64)
        read = dsv41kv.ReadPathConfig(eps=cfg.rms_norm_eps, max_model_len=PAGE * PAGES_PER_REQ, num_heads=H,
                                      swa_format="bf16")
        self.shared = dsv41kv.LayerShared(self.serving, read, cfg)
        self.layer = dsv41kv.AttentionLayer(self.serving, read, cfg, 0, dsv41kv.LayerWeights(sink), self.shared,
                                            rope_table=table)
        self.meta = dsv41kv.StepMetadata(self.serving)

    def step(self, batch, kv, q, T, N):
        """batch: (request, query_len, num_computed) in the step's order; returns as ops_step."""
        self.meta.build([dsv41kv.StepRequest(n, c, swa_pages=self.block_table[b].tolist()) for b, n, c in batch],
                        padding_rows=N - T)
        self.layer.run(self.meta, self.x.put(q), self.x.put(kv))
        out = self.layer.output()  # numpy (bf16 bits) on the CPU, a DLPack array on CUDA
        if self.x.torch is not None and self.x.device == "cuda":
            out = self.x.get(self.x.torch.from_dlpack(out))
        return out[:T].view(BF16).astype(np.float64), self.meta.split


def ops_step(x, cache, table, sink, qsl, positions, bt, kv, q, seq_lens, T, N):
    """One step through the individual ops; returns the T real rows of the output (binary64) and
    the split."""
    t2r = np.zeros(N, np.int32)
    dsv41kv.build_token_to_req(qsl, t2r)
    slot_swa = np.zeros(N, np.int64)
    dsv41kv.build_token_slots(t2r, positions, bt, slot_swa, num_actual_tokens=T, page=PAGE)
    q_rot = x.put(np.zeros((N, H, 512), BF16))
    d_pos, d_table = x.put(positions), x.put(table)
    dsv41kv.swa_insert_q_rope(x.put(kv), x.put(q), d_pos, d_table, x.put(slot_swa), cache, q_rot,
                              cache_format="bf16")

    o = x.put(np.zeros((N, H, 512), BF16))
    lse = x.put(np.zeros((N, H), np.float32))
    split = dsv41kv.split_decode_prefill(qsl)
    nd, ndt = split["num_decodes"], split["num_decode_tokens"]
    d_sink = x.put(sink)
    if ndt:
        idx = np.zeros((ndt, 128), np.int32)
        lens = np.zeros(ndt, np.int32)
        dsv41kv.build_swa_window(qsl, positions, slot_swa, bt, idx, lens, page=PAGE)
        sched = dsv41kv.plan_decode_schedule("swaonly", ndt, num_heads=H, device=x.device)
        n_ws = dsv41kv.sparse_decode_workspace_floats(sched)  # CUDA split-K partials (0 on the CPU)
        dsv41kv.sparse_decode(sched, q_rot[:ndt], cache, x.put(idx), x.put(lens), d_sink, o[:ndt], lse[:ndt],
                              swa_format="bf16", swa_states_per_page=PAGE,
                              workspace=x.put(np.zeros(n_ws, np.float32)) if n_ws else None)
    if split["num_prefills"]:
        P = split["num_prefills"]
        gl, gs = np.zeros(P, np.int64), np.zeros(P, np.int64)
        dsv41kv.build_prefill_gather(qsl, seq_lens, gl, gs)
        sl32, gl32, gs32 = seq_lens[nd:].astype(np.int32), gl.astype(np.int32), gs.astype(np.int32)
        max_len = PAGE * PAGES_PER_REQ
        for ch in dsv41kv.plan_prefill_chunks(sl32, gl32, ratio=0, max_model_len=max_len,
                                              max_num_batched_tokens=T):
            ws = x.put(np.zeros((ch.num_reqs() * ch.m_ch, 512), BF16))
            dsv41kv.gather_prefill_workspace(ch, x.put(sl32), x.put(gl32), x.put(gs32), cache, x.put(bt[nd:]), ws,
                                             ratio=0, swa_format="bf16", swa_states_per_page=PAGE)
            a, b = int(qsl[nd + ch.req_begin]), int(qsl[nd + ch.req_end])
            tok_req = (t2r[a:b] - nd).astype(np.int32)  # prefill request index of each token
            idx = x.put(np.zeros((b - a, dsv41kv.PREFILL_INDEX_WIDTH), np.int32))
            lens = x.put(np.zeros(b - a, np.int32))
            dsv41kv.build_prefill_indices(ch, x.put(positions[a:b]), x.put(tok_req), x.put(gl32), x.put(gs32),
                                          idx, lens, ratio=0)
            dsv41kv.sparse_prefill(q_rot[a:b], ws, idx, lens, d_sink, o[a:b], lse[a:b])
    out = x.put(np.zeros((N, H, 512), BF16))
    dsv41kv.attention_output_rope(o[:T], d_pos, d_table, out, num_real_heads=H)
    return x.get(out)[:T].astype(np.float64), split


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--torch", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--layer", action="store_true", help="one AttentionLayer call per step instead of the ops")
    args = ap.parse_args(argv)
    x = Arrays(args.torch)
    rng = np.random.default_rng(args.seed)
    cfg = dsv41kv.deepseek_v41_flash()
    assert cfg.ratio(0) == 0  # layer 0 is sliding-window only
    table = np.zeros((PAGE * PAGES_PER_REQ, 64), np.float32)
    dsv41kv.rope_table(cfg, 0, table)
    prompts = [37, 150, 5]
    R = len(prompts)
    block_table = (1 + np.arange(R * PAGES_PER_REQ, dtype=np.int32)).reshape(R, PAGES_PER_REQ)  # page 0 = null
    cache = x.put(np.zeros((R * PAGES_PER_REQ + 1, PAGE, 512), BF16))  # plain bf16 SWA rows
    sink = rng.standard_normal(H).astype(np.float32)
    history = [np.zeros((0, 512)) for _ in range(R)]  # each request's rotated kv rows (reference)
    layer = LayerPath(x, cfg, table, sink, block_table) if args.layer else None
    seq = [0] * R
    worst = -np.inf  # the largest (error - tolerance) over every output element
    for step, qlens in enumerate([prompts, [1] * R, [1] * R]):
        # decode requests first (SPEC 6.2): order the step's requests by query length
        order = sorted(range(R), key=lambda b: (qlens[b] > 1, b))
        qsl = np.zeros(R + 1, np.int32)
        qsl[1:] = np.cumsum([qlens[b] for b in order])
        T = int(qsl[-1])
        N = T + 2  # two padding rows, as a CUDA graph's batch would have
        positions = np.zeros(N, np.int64)
        for j, b in enumerate(order):
            positions[qsl[j]:qsl[j + 1]] = seq[b] + np.arange(qlens[b])
        bt = block_table[order]
        kv = bf16(rng.standard_normal((N, 512)))
        q = bf16(rng.standard_normal((N, H, 512)))

        if layer is None:
            seq_lens = np.array([seq[b] + qlens[b] for b in order], np.int64)
            got, split = ops_step(x, cache, table, sink, qsl, positions, bt, kv, q, seq_lens, T, N)
        else:
            got, split = layer.step([(b, qlens[b], seq[b]) for b in order], kv, q, T, N)

        # the reference
        for j, b in enumerate(order):
            rows = slice(int(qsl[j]), int(qsl[j + 1]))
            k_new = bf16(rope(kv[rows], table, positions[rows])).astype(np.float64)
            history[b] = np.concatenate([history[b], k_new])
            for t in range(rows.start, rows.stop):
                p = int(positions[t])
                keys = history[b][max(0, p - 127):p + 1]
                qt = bf16(rope(q[t], table, np.full(H, p))).astype(np.float64)
                s = dsv41kv.SOFTMAX_SCALE * qt @ keys.T
                m = s.max(axis=1, keepdims=True)
                e = np.exp(s - m)
                ref = (e @ keys) / (e.sum(axis=1) + np.exp(sink - m[:, 0]))[:, None]
                ref = rope(bf16(ref).astype(np.float64), table, np.full(H, p), inverse=True)
                err = np.abs(got[t] - ref) - (4e-3 + 1e-2 * np.abs(ref))
                worst = max(worst, float(err.max()))
            seq[b] += qlens[b]
        print(f"step {step}: {split['num_decodes']} decodes, {split['num_prefills']} prefills, {T} tokens")
    ok = worst <= 0
    print(f"{'PASS' if ok else 'FAIL'}: every output within 4e-3 + 1e-2 |ref| of the reference"
          f" (worst margin {worst:+.2e}){' on ' + x.device if x.torch is not None else ''}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
