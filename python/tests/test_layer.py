"""The whole-layer call (dsv41kv.AttentionLayer): a prefill step, a decode step and a mixed step of
three requests through a sliding-window layer, a ratio-2 kv + index source and a layer that reads
that source's caches and top-k, each step compared bit for bit with the composition of the bound
ops on the same inputs (the CPU layer runs exactly those ops); the metadata StepMetadata builds
against the bound metadata builders; bad arguments refused before anything is written; CUDA
layers (skipped without a GPU) against the CPU's."""
import gc

import ml_dtypes
import numpy as np
import pytest

import dsv41kv

BF16 = ml_dtypes.bfloat16
BF16_NAN = 0xFFFF  # the mark of an unwritten latent row
H, PAGE, SWA_W, CMP_W, MAX_LEN = 16, 32, 8, 4, 256  # heads, SWA page, table widths, max_model_len
R, MAX_TOKENS, PAD = 3, 200, 2
LAYERS = [0, 2, 3]  # swaonly; c2a kv + index source; c2a consumer of layer 2's caches and top-k
# the steps: (query_len, num_computed) per request in the batch's order (decodes first)
STEPS = [
    [(0, 37, 0), (1, 150, 0), (2, 5, 0)],  # prefill of every prompt
    [(0, 1, 37), (1, 1, 150), (2, 1, 5)],  # one decode token each
    [(0, 1, 38), (2, 1, 6), (1, 4, 151)],  # two decodes and a chunk that extends request 1
]


def serving(device="cpu"):
    return dsv41kv.ServingConfig(device=device, max_tokens=MAX_TOKENS, max_requests=R, ring_blocks=R + 1,
                                 swa_page_tokens=PAGE, swa_num_pages=1 + R * SWA_W, swa_block_table_width=SWA_W,
                                 c2a_num_pages=1 + R * CMP_W, c2a_block_table_width=CMP_W)


def read_config(swa_format="v4_584", compressed_format="v4_584", scored=False):
    return dsv41kv.ReadPathConfig(eps=1e-6, max_model_len=MAX_LEN, num_heads=H, swa_format=swa_format,
                                  compressed_format=compressed_format, capturing_cuda_graph=scored)


def block_tables():
    swa = (1 + np.arange(R * SWA_W, dtype=np.int32)).reshape(R, SWA_W)  # page 0 = the null page
    cmp = (1 + np.arange(R * CMP_W, dtype=np.int32)).reshape(R, CMP_W)
    return swa, cmp


def requests(step, swa_bt, cmp_bt):
    return [dsv41kv.StepRequest(n, c, ring_block=b + 1, swa_pages=swa_bt[b].tolist(), c2a_pages=cmp_bt[b].tolist())
            for b, n, c in step]


def inputs(rng, layer, N):
    """Projected activations of one layer for N rows (bf16 as ml_dtypes arrays)."""
    info = layer.info
    x = dict(q=rng.standard_normal((N, H, 512)).astype(BF16), kv=rng.standard_normal((N, 512)).astype(BF16))
    if info.is_kv_source:
        x["kv_score"] = rng.standard_normal((N, 512 * info.ratio)).astype(np.float32)
    if info.is_index_source:
        x["index_q"] = rng.standard_normal((N, 32, 128)).astype(BF16)
        x["w_raw"] = rng.standard_normal((N, 32)).astype(BF16)
    return x


# ---------------------------------------------------------------- the metadata, from the bound builders

class HostMeta:
    """A step's metadata built with the bound metadata ops (SPEC 6), for the composition."""

    def __init__(self, cfg, step, swa_bt, cmp_bt):
        order = [b for b, _, _ in step]
        qlens = [n for _, n, _ in step]
        self.qsl = np.zeros(len(step) + 1, np.int32)
        self.qsl[1:] = np.cumsum(qlens)
        T = int(self.qsl[-1])
        N = self.N = T + PAD
        self.T = T
        self.positions = np.zeros(N, np.int64)
        for j, (_, n, c) in enumerate(step):
            self.positions[self.qsl[j]:self.qsl[j + 1]] = c + np.arange(n)
        self.seq_lens = np.array([n + c for _, n, c in step], np.int64)
        self.swa_bt = np.ascontiguousarray(swa_bt[order])
        self.cmp_bt = np.ascontiguousarray(cmp_bt[order])
        self.ring_bt = np.array([[b + 1] for b in order], np.int32)
        self.t2r = np.zeros(N, np.int32)
        dsv41kv.build_token_to_req(self.qsl, self.t2r, num_actual_tokens=T)
        self.swa_slots = np.zeros(N, np.int64)
        dsv41kv.build_token_slots(self.t2r, self.positions, self.swa_bt, self.swa_slots, num_actual_tokens=T,
                                  page=PAGE, num_pages=cfg.swa_num_pages)
        self.token_valid = np.zeros(N, np.int32)
        dsv41kv.build_token_valid(self.swa_slots, self.token_valid)
        self.ring_slots = np.zeros(N, np.int64)
        dsv41kv.build_ring_slots(self.t2r, self.positions, self.ring_bt, self.ring_slots, num_actual_tokens=T,
                                 cap=cfg.ring_capacity(), num_ring_blocks=cfg.ring_blocks)
        self.cmp_slots = np.zeros(N, np.int64)
        dsv41kv.build_compressed_slots(self.t2r, self.positions, self.cmp_bt, self.cmp_slots, ratio=2,
                                       num_actual_tokens=T, states_per_page=cfg.states_per_page(2),
                                       num_pages=cfg.num_pages(2))
        self.window = np.zeros((MAX_TOKENS, 128), np.int32)
        self.window_lens = np.zeros(MAX_TOKENS, np.int32)
        self.split = dsv41kv.build_swa_window(self.qsl, self.positions, self.swa_slots, self.swa_bt, self.window,
                                              self.window_lens, page=PAGE, num_pages=cfg.swa_num_pages)
        P = self.split["num_prefills"]
        self.gather_lens, self.gather_starts = np.zeros(P, np.int64), np.zeros(P, np.int64)
        dsv41kv.build_prefill_gather(self.qsl, self.seq_lens, self.gather_lens, self.gather_starts)


# ---------------------------------------------------------------- the layer as a composition of the ops

class ComposedLayer:
    """AttentionLayer's step (attention_layer.cpp) written with the bound ops on numpy state."""

    def __init__(self, cfg, read, model, index, weights, table):
        self.info = model.layers[index]
        self.r = self.info.ratio
        self.S = cfg.states_per_page(self.r) if self.r else 0
        self.cfg, self.read, self.w, self.table = cfg, read, weights, table
        self.swa = self.new_cache(read.swa_format, cfg.swa_num_pages, PAGE)
        rows = (MAX_TOKENS, H, 512)
        self.q_rot, self.attn = np.zeros(rows, np.uint16), np.zeros(rows, np.uint16)
        self.out = np.zeros(rows, np.uint16)
        self.lse = np.zeros((MAX_TOKENS, H), np.float32)
        self.sink = np.array(weights.attn_sink)
        if self.info.is_kv_source:
            self.cmp = self.new_cache(read.compressed_format, cfg.num_pages(2), self.S)
            self.idx = np.zeros((cfg.num_pages(2), dsv41kv.index_k_default_page_stride("fp8_132", self.S)), np.uint8)
            self.ring = np.zeros((cfg.ring_blocks, cfg.ring_capacity(), 1024), np.float32)
            self.latent = np.zeros((MAX_TOKENS, 512), np.uint16)

    @staticmethod
    def new_cache(fmt, pages, S):
        info = dsv41kv.record_info(fmt)
        if info["packed"]:
            return np.zeros((pages, dsv41kv.default_page_stride(fmt, S)), np.uint8)
        return np.zeros((pages, S, 512), np.uint16 if fmt == "bf16" else np.uint8)

    def step(self, m, x, shared, layers):
        N, T, r, S = m.N, m.T, self.r, self.S
        src = layers[self.info.kv_src] if r else None
        dsv41kv.swa_insert_q_rope(x["kv"], x["q"], m.positions, self.table, m.swa_slots, self.swa, self.q_rot[:N],
                                  cache_format=self.read.swa_format, states_per_page=PAGE)
        if self.info.is_kv_source:
            self.latent[:N] = BF16_NAN
            dsv41kv.fused_save_compress_norm(x["kv_score"], m.positions, m.ring_slots, self.w.compressor_norm,
                                             self.read.eps, self.latent[:N], ratio=2, ring=self.ring, qsl=m.qsl,
                                             token_to_req=m.t2r)
            dsv41kv.rope_quant_insert(self.latent[:N], m.positions, self.table, m.cmp_slots, self.cmp,
                                      cache_format=self.read.compressed_format, states_per_page=S, ratio=2)
            dsv41kv.indexer_k_store(self.latent[:N], m.positions, m.cmp_slots, self.w.wk, self.w.k_norm,
                                    self.read.eps, self.table, self.idx, states_per_page=S, ratio=2)
        if self.info.is_index_source:
            self.shortcut = dsv41kv.indexer_takes_shortcut(int(m.seq_lens.max()), r, self.read.capturing_cuda_graph)
            if self.shortcut:
                dsv41kv.indexer_shortcut_topk(m.positions, shared["topk"], ratio=r, token_valid=m.token_valid)
            else:
                q8, w = np.zeros((N, 32, 128), np.uint8), np.zeros((N, 32), np.float32)
                dsv41kv.indexer_prepare_q(x["index_q"], x["w_raw"], m.positions, self.table, q8, w)
                dsv41kv.indexer_topk(q8, w, m.positions, m.t2r, m.cmp_bt, src.idx, shared["topk"],
                                     states_per_page=S, ratio=r, token_valid=m.token_valid)
        cmp = dict(cmp_cache=src.cmp, cmp_format=self.read.compressed_format, cmp_states_per_page=S) if r else {}
        topk = shared["topk"]
        Td = m.split["num_decode_tokens"]
        if Td:
            sched = dsv41kv.plan_decode_schedule(["swaonly", "c1a", "c2a"][r], Td, num_heads=H, s_q=1,
                                                 block_size=S * r if r else 64)
            if r:
                di, dl = np.zeros((MAX_TOKENS, 512), np.int32), np.zeros(MAX_TOKENS, np.int32)
                dsv41kv.build_decode_topk_slots(m.qsl, m.swa_slots, topk[:Td], m.cmp_bt, di, dl, states_per_page=S,
                                                num_pages=self.cfg.num_pages(2))
                cmp.update(cmp_indices=di, cmp_lens=dl)
            dsv41kv.sparse_decode(sched, self.q_rot[:Td], self.swa, m.window, m.window_lens, self.sink, self.attn,
                                  self.lse, swa_format=self.read.swa_format, swa_states_per_page=PAGE, **cmp)
        if m.split["num_prefill_tokens"]:
            D = m.split["num_decodes"]
            keep = [i for i in range(m.split["num_prefills"]) if m.qsl[D + i + 1] > m.qsl[D + i]]
            orig = [D + i for i in keep]
            seq = m.seq_lens[orig].astype(np.int32)
            gl = m.gather_lens[keep].astype(np.int32)
            gs = m.gather_starts[keep].astype(np.int32)
            swa_bt, cmp_bt = m.swa_bt[orig], m.cmp_bt[orig]
            t2r = np.concatenate([np.full(m.qsl[b + 1] - m.qsl[b], c, np.int32) for c, b in enumerate(orig)])
            ws = shared["workspace"]
            for ch in dsv41kv.plan_prefill_chunks(seq, gl, ratio=r, max_model_len=MAX_LEN,
                                                  max_num_batched_tokens=MAX_TOKENS):
                dsv41kv.gather_prefill_workspace(ch, seq, gl, gs, self.swa, swa_bt, ws, ratio=r,
                                                 swa_format=self.read.swa_format, swa_states_per_page=PAGE,
                                                 **({k: cmp[k] for k in ("cmp_cache", "cmp_format", "cmp_states_per_page")}
                                                    if r else {}), cmp_block_table=cmp_bt if r else None)
                b0, b1 = int(m.qsl[orig[ch.req_begin]]), int(m.qsl[orig[ch.req_end - 1] + 1])
                idx = np.zeros((b1 - b0, dsv41kv.PREFILL_INDEX_WIDTH), np.int32)
                lens = np.zeros(b1 - b0, np.int32)
                dsv41kv.build_prefill_indices(ch, m.positions[b0:b1], t2r[b0 - Td:b1 - Td], gl, gs, idx, lens, ratio=r,
                                              topk=topk[b0:b1] if r else None)
                dsv41kv.mask_invalid_lengths(m.token_valid[b0:b1], lens)
                dsv41kv.sparse_prefill(self.q_rot[b0:b1], ws[:ch.num_reqs() * ch.m_ch], idx, lens, self.sink,
                                       self.attn[b0:b1], self.lse[b0:b1])
        self.attn[T:N] = 0
        self.lse[T:N] = np.inf
        dsv41kv.attention_output_rope(self.attn[:N], m.positions, self.table, self.out, num_real_heads=H)


def model_and_weights():
    model = dsv41kv.deepseek_v41_flash()
    return model, {i: dsv41kv.LayerWeights.from_seed(model.layers[i], H, 7) for i in LAYERS}


def build(read, device="cpu"):
    cfg = serving(device)
    model, weights = model_and_weights()
    shared = dsv41kv.LayerShared(cfg, read, model)
    layers = {i: dsv41kv.AttentionLayer(cfg, read, model, i, weights[i], shared) for i in LAYERS}
    return cfg, model, weights, shared, layers


def same(a, b, what):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype, (what, a.shape, a.dtype, b.shape, b.dtype)
    if not np.array_equal(a.view(np.uint8), b.view(np.uint8)):
        bad = np.argwhere(a.view(np.uint8).reshape(a.shape[0], -1) != b.view(np.uint8).reshape(b.shape[0], -1))
        raise AssertionError(f"{what}: {len(bad)} bytes differ, first at row {bad[0][0]}")


@pytest.mark.parametrize("swa_format,compressed_format,scored", [
    ("v4_584", "v4_584", False),
    ("v4_584", "v4_584", True),
    ("bf16", "mxfp8_528", True),
])
def test_layer_is_the_composition_of_the_ops(swa_format, compressed_format, scored):
    read = read_config(swa_format, compressed_format, scored)
    cfg, model, weights, shared, layers = build(read)
    table = np.zeros((MAX_LEN, 64), np.float32)
    tables = {}
    for i in LAYERS:
        tables[i] = np.zeros((MAX_LEN, 64), np.float32)
        dsv41kv.rope_table(model, model.ratio(i), tables[i])
    ref = {i: ComposedLayer(cfg, read, model, i, weights[i], tables[i]) for i in LAYERS}
    ws_rows = max(dsv41kv.prefill_workspace_rows(r, MAX_LEN, MAX_TOKENS) for r in (0, 1, 2))
    ref_shared = dict(topk=np.full((MAX_TOKENS, 512), -1, np.int32), workspace=np.zeros((ws_rows, 512), np.uint16))
    swa_bt, cmp_bt = block_tables()
    meta = dsv41kv.StepMetadata(cfg)
    rng = np.random.default_rng(11)
    for s, step in enumerate(STEPS):
        meta.build(requests(step, swa_bt, cmp_bt), padding_rows=PAD)
        hm = HostMeta(cfg, step, swa_bt, cmp_bt)
        N, T = hm.N, hm.T
        assert (meta.num_rows, meta.num_tokens, meta.generation) == (N, T, s + 1)
        assert meta.split == hm.split
        T_dec = hm.split["num_decode_tokens"]  # the window rows of the decodes (later rows: earlier steps')
        for name, got, want in [("qsl", meta.qsl(), hm.qsl), ("positions", meta.positions(), hm.positions),
                                ("token_to_req", meta.token_to_req(), hm.t2r), ("swa_slots", meta.swa_slots(), hm.swa_slots),
                                ("token_valid", meta.token_valid(), hm.token_valid),
                                ("ring_slots", meta.ring_slots(), hm.ring_slots),
                                ("compressed_slots", meta.compressed_slots(2), hm.cmp_slots),
                                ("block_table", meta.block_table(2), hm.cmp_bt),
                                ("swa_block_table", meta.swa_block_table(), hm.swa_bt),
                                ("swa_window", meta.swa_window()[:T_dec], hm.window[:T_dec]),
                                ("swa_window_lens", meta.swa_window_lens()[:T_dec], hm.window_lens[:T_dec]),
                                ("gather_lens", meta.gather_lens(), hm.gather_lens),
                                ("gather_starts", meta.gather_starts(), hm.gather_starts)]:
            same(got, want, f"step {s}: meta.{name}")
        for i in LAYERS:
            x = inputs(rng, layers[i], N)
            layers[i].run(meta, **x)
            ref[i].step(hm, x, ref_shared, ref)
            L, c = layers[i], ref[i]
            assert L.last_generation == meta.generation
            what = f"step {s} layer {i}"
            same(L.output()[:N], c.out[:N], what + " output")
            same(L.attention_out()[:N], c.attn[:N], what + " attention_out")
            same(L.lse()[:N], c.lse[:N], what + " lse")
            same(L.q_rotated()[:N], c.q_rot[:N], what + " q_rotated")
            same(L.swa_cache(), c.swa, what + " swa_cache")
            st = L.last_stats
            assert (st.decode_rows, st.prefill_rows) == (hm.split["num_decode_tokens"], hm.split["num_prefill_tokens"])
            assert st.swa_records == T
            if c.info.is_kv_source:
                same(L.compressed_cache(), c.cmp, what + " compressed_cache")
                same(L.index_k_cache(), c.idx, what + " index_k_cache")
                same(L.ring(), c.ring, what + " ring")
                written = (c.latent[:N] != BF16_NAN).any(axis=1)
                assert written.any()
                same(L.latent()[:N][written], c.latent[:N][written], what + " latent")
                assert st.compressed_records == int((hm.cmp_slots >= 0).sum()) > 0
            if c.info.is_index_source:
                assert st.shortcut == c.shortcut == (not scored)
                same(shared.topk(), ref_shared["topk"], what + " shared top-k")
                assert shared.topk_writer == i
    # the output is a real attention: finite, not all zero
    out = layers[3].output()[:T].view(BF16).astype(np.float32)
    assert np.isfinite(out).all() and np.abs(out).max() > 0


def test_views_are_numpy_arrays_over_the_layer():
    read = read_config()
    cfg, model, weights, shared, layers = build(read)
    L = layers[2]
    out = L.output()
    assert isinstance(out, np.ndarray) and out.dtype == np.uint16 and out.shape == (MAX_TOKENS, H, 512)
    assert L.lse().dtype == np.float32 and L.lse().shape == (MAX_TOKENS, H)
    assert L.swa_cache().shape == (cfg.swa_num_pages, dsv41kv.default_page_stride("v4_584", PAGE))
    assert L.ring().shape == (cfg.ring_blocks, cfg.ring_capacity(), 1024)
    assert shared.topk().shape == (MAX_TOKENS, 512) and (shared.topk() == -1).all()
    # the same memory on every call, and writable
    assert out.__array_interface__["data"][0] == L.output().__array_interface__["data"][0]
    out[:] = 1234
    assert (L.output() == 1234).all()
    # a view keeps its layer alive (still registered in `shared`) until the view goes
    del layers, L
    gc.collect()
    with pytest.raises(dsv41kv.Error, match="already holds a layer 2"):
        dsv41kv.AttentionLayer(cfg, read, model, 2, weights[2], shared)
    assert (out == 1234).all()
    del out
    gc.collect()
    dsv41kv.AttentionLayer(cfg, read, model, 2, weights[2], shared)
    plain = dsv41kv.AttentionLayer(cfg, read_config(swa_format="bf16"), model, 1,
                                   dsv41kv.LayerWeights.from_seed(model.layers[1], H, 1), shared)
    assert plain.swa_cache().shape == (cfg.swa_num_pages, PAGE, 512) and plain.swa_cache().dtype == np.uint16
    with pytest.raises(dsv41kv.Error, match="compressed_cache: layer: 1 is not a kv source"):
        plain.compressed_cache()


def test_weights_from_arrays_equal_from_seed():
    model = dsv41kv.deepseek_v41_flash()
    w = dsv41kv.LayerWeights.from_seed(model.layers[2], H, 5)
    assert w.attn_sink.shape == (H,) and w.wk.shape == (128, 512) and w.wk.dtype == np.uint16
    assert dsv41kv.LayerWeights.from_seed(model.layers[0], H, 5).wk is None
    # from numpy (bf16 as ml_dtypes and as uint16 bits; a transposed view is copied by its strides)
    wt = np.ascontiguousarray(w.wk.T).T
    v = dsv41kv.LayerWeights(np.array(w.attn_sink), np.array(w.compressor_norm).view(BF16), wt, np.array(w.k_norm))
    for k in ("attn_sink", "compressor_norm", "wk", "k_norm"):
        same(getattr(v, k), getattr(w, k), k)


def test_layer_from_array_weights_runs_as_from_seed():
    read = read_config()
    cfg, model, weights, shared, layers = build(read)
    w = weights[0]
    cfg2 = serving()
    shared2 = dsv41kv.LayerShared(cfg2, read, model)
    L2 = dsv41kv.AttentionLayer(cfg2, read, model, 0, dsv41kv.LayerWeights(np.array(w.attn_sink)), shared2)
    meta = dsv41kv.StepMetadata(cfg)
    swa_bt, cmp_bt = block_tables()
    meta.build(requests(STEPS[0], swa_bt, cmp_bt))
    x = inputs(np.random.default_rng(3), layers[0], meta.num_rows)
    layers[0].run(meta, **x)
    meta2 = dsv41kv.StepMetadata(cfg2)
    meta2.build(requests(STEPS[0], swa_bt, cmp_bt))
    L2.run(meta2, **x)
    same(L2.output()[:meta.num_rows], layers[0].output()[:meta.num_rows], "output")


# ---------------------------------------------------------------- bad arguments

@pytest.fixture
def stepped():
    """The three layers after the first step, and the second step's metadata and inputs."""
    read = read_config()
    cfg, model, weights, shared, layers = build(read)
    swa_bt, cmp_bt = block_tables()
    meta = dsv41kv.StepMetadata(cfg)
    rng = np.random.default_rng(5)
    meta.build(requests(STEPS[0], swa_bt, cmp_bt), padding_rows=PAD)
    for i in LAYERS:
        layers[i].run(meta, **inputs(rng, layers[i], meta.num_rows))
    meta.build(requests(STEPS[1], swa_bt, cmp_bt), padding_rows=PAD)
    return dict(cfg=cfg, model=model, weights=weights, shared=shared, layers=layers, meta=meta, rng=rng,
                x={i: inputs(rng, layers[i], meta.num_rows) for i in LAYERS}, read=read)


def snapshot(layers, shared):
    snap = [shared.topk().copy()]
    for L in layers.values():
        snap += [L.output().copy(), L.lse().copy(), L.q_rotated().copy(), L.swa_cache().copy()]
        if L.info.is_kv_source:
            snap += [L.compressed_cache().copy(), L.index_k_cache().copy(), L.ring().copy(), L.latent().copy()]
    return snap


def bad_q_heads(x):
    return dict(x, q=np.ascontiguousarray(x["q"][:, :8]))


@pytest.mark.parametrize("layer,change,exc,msg", [
    (2, lambda x: dict(x, q=x["q"].astype(np.float32)), TypeError, "AttentionLayer.run: q: dtype float32, expected bfloat16"),
    (2, lambda x: dict(x, kv=x["kv"].view(np.int16)), TypeError, "AttentionLayer.run: kv: dtype int16, expected bfloat16"),
    (2, lambda x: dict(x, kv_score=x["kv_score"].astype(np.float64)), TypeError,
     "AttentionLayer.run: kv_score: dtype float64, expected float32"),
    (2, lambda x: dict(x, w_raw=x["w_raw"].astype(np.float32)), TypeError, "AttentionLayer.run: w_raw: dtype float32"),
    (2, lambda x: dict(x, index_q=x["index_q"].tolist()), TypeError, "AttentionLayer.run: index_q: list is not an array"),
    (2, lambda x: dict(x, q=None), TypeError, "AttentionLayer.run: q: required, got None"),
    (2, bad_q_heads, dsv41kv.Error, "AttentionLayer::run: in.q"),
    (2, lambda x: dict(x, kv=x["kv"][:-1]), dsv41kv.Error, "AttentionLayer::run: in.kv"),
    (2, lambda x: dict(x, kv_score=None), dsv41kv.Error, "AttentionLayer::run: in.kv_score"),
    (2, lambda x: dict(x, kv_score=x["kv_score"][:, :512]), dsv41kv.Error, "AttentionLayer::run: in.kv_score"),
    (2, lambda x: dict(x, index_q=None), dsv41kv.Error, "AttentionLayer::run: in.index_q"),
    (2, lambda x: dict(x, index_q=x["index_q"][:, :16]), dsv41kv.Error, "AttentionLayer::run: in.index_q"),
    (0, lambda x: dict(x, kv_score=np.zeros((x["kv"].shape[0], 512), np.float32)), dsv41kv.Error,
     "AttentionLayer::run: in.kv_score: present, expected absent"),
    (3, lambda x: dict(x, index_q=np.zeros((x["kv"].shape[0], 32, 128), BF16)), dsv41kv.Error,
     "AttentionLayer::run: in.index_q: present, expected absent"),
])
def test_bad_input_is_refused_and_nothing_written(stepped, layer, change, exc, msg):
    layers, meta = stepped["layers"], stepped["meta"]
    before = snapshot(layers, stepped["shared"])
    with pytest.raises(exc) as e:
        layers[layer].run(meta, **change(stepped["x"][layer]))
    assert msg in str(e.value), str(e.value)
    for a, b in zip(before, snapshot(layers, stepped["shared"])):
        np.testing.assert_array_equal(a, b)


def test_consumer_before_its_source_is_refused(stepped):
    layers, meta = stepped["layers"], stepped["meta"]
    before = snapshot(layers, stepped["shared"])
    with pytest.raises(dsv41kv.Error, match="layer 3 reads the caches of its kv source 2, which has not run"):
        layers[3].run(meta, **stepped["x"][3])
    for a, b in zip(before, snapshot(layers, stepped["shared"])):
        np.testing.assert_array_equal(a, b)
    layers[2].run(meta, **stepped["x"][2])
    layers[3].run(meta, **stepped["x"][3])  # in the model's order it runs


def test_stream_for_host_arrays_is_refused(stepped):
    with pytest.raises(ValueError, match="AttentionLayer.run: stream: given for host arrays"):
        stepped["layers"][0].run(stepped["meta"], **stepped["x"][0], stream=7)
    with pytest.raises(ValueError, match="StepMetadata.build: stream: given for a CPU configuration"):
        stepped["meta"].build([], stream=7)


def test_metadata_of_another_configuration_is_refused(stepped):
    cfg = dsv41kv.ServingConfig(max_tokens=MAX_TOKENS, max_requests=R, ring_blocks=R + 1, swa_page_tokens=PAGE,
                                swa_num_pages=2 + R * SWA_W, swa_block_table_width=SWA_W,
                                c2a_num_pages=1 + R * CMP_W, c2a_block_table_width=CMP_W)
    other = dsv41kv.StepMetadata(cfg)
    swa_bt, cmp_bt = block_tables()
    other.build(requests(STEPS[1], swa_bt, cmp_bt), padding_rows=PAD)
    with pytest.raises(dsv41kv.Error, match="AttentionLayer::run: meta: built for another configuration"):
        stepped["layers"][0].run(other, **stepped["x"][0])


def test_bad_batch_is_refused_and_the_last_build_kept(stepped):
    meta = stepped["meta"]
    pos, gen = meta.positions().copy(), meta.generation
    swa_bt, cmp_bt = block_tables()
    with pytest.raises(dsv41kv.Error, match="StepMetadata::build"):
        meta.build(requests(STEPS[1], swa_bt, cmp_bt), padding_rows=MAX_TOKENS)
    with pytest.raises(dsv41kv.Error, match="StepMetadata::build"):
        meta.build([dsv41kv.StepRequest(1, -3)])
    assert meta.generation == gen
    np.testing.assert_array_equal(meta.positions(), pos)


def test_bad_configuration_is_refused():
    with pytest.raises(dsv41kv.Error, match="max_tokens"):
        dsv41kv.ServingConfig(max_tokens=0, max_requests=1)
    with pytest.raises(ValueError, match="ServingConfig: device = 'gpu'"):
        dsv41kv.ServingConfig(device="gpu", max_tokens=1, max_requests=1)
    with pytest.raises(ValueError, match="ServingConfig: formats"):
        dsv41kv.ServingConfig(max_tokens=1, max_requests=1, formats=["v4_584", "q4"])
    with pytest.raises(dsv41kv.Error, match="ReadPathConfig: num_heads: 12"):
        dsv41kv.ReadPathConfig(eps=1e-6, max_model_len=16, num_heads=12)
    with pytest.raises(dsv41kv.Error, match="ReadPathConfig: swa_format: nvfp4_288"):
        dsv41kv.ReadPathConfig(eps=1e-6, max_model_len=16, swa_format="nvfp4_288")
    with pytest.raises(TypeError):
        dsv41kv.ReadPathConfig(max_model_len=16)  # eps is never defaulted


def test_bad_layer_construction_is_refused():
    read = read_config()
    cfg = serving()
    model, weights = model_and_weights()
    shared = dsv41kv.LayerShared(cfg, read, model)
    with pytest.raises(dsv41kv.Error, match="AttentionLayer: weights.attn_sink: 8 entries, expected H = 16"):
        dsv41kv.AttentionLayer(cfg, read, model, 0, dsv41kv.LayerWeights(np.zeros(8, np.float32)), shared)
    with pytest.raises(dsv41kv.Error, match="AttentionLayer: weights.compressor_norm: 0 entries"):
        dsv41kv.AttentionLayer(cfg, read, model, 2, weights[0], shared)
    with pytest.raises(dsv41kv.Error, match="c1a not served"):
        dsv41kv.AttentionLayer(cfg, read, model, 20, dsv41kv.LayerWeights.from_seed(model.layers[20], H, 1), shared)
    L = dsv41kv.AttentionLayer(cfg, read, model, 0, weights[0], shared)
    with pytest.raises(dsv41kv.Error, match="already holds a layer 0"):
        dsv41kv.AttentionLayer(cfg, read, model, 0, weights[0], shared)
    del L  # unregisters: the index is free again
    dsv41kv.AttentionLayer(cfg, read, model, 0, weights[0], shared)
    with pytest.raises(ValueError, match="AttentionLayer: rope_table: .*expected a host f32 \\[rows, 64\\]"):
        dsv41kv.AttentionLayer(cfg, read, model, 1, weights[0], shared, rope_table=np.zeros((16, 32), np.float32))
    with pytest.raises(TypeError, match="AttentionLayer: rope_table: dtype float64"):
        dsv41kv.AttentionLayer(cfg, read, model, 1, weights[0], shared, rope_table=np.zeros((16, 64)))


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(attn_sink=np.zeros(16)), TypeError, "LayerWeights: attn_sink: dtype float64, expected float32"),
    (dict(attn_sink=np.zeros((4, 4), np.float32)), ValueError, "LayerWeights: attn_sink: f32[4, 4]"),
    (dict(attn_sink=np.zeros(16, np.float32), compressor_norm=np.zeros(512, np.uint16), wk=np.zeros((64, 512), np.uint16),
          k_norm=np.zeros(128, np.uint16)), ValueError, "LayerWeights: wk: bf16[64, 512]"),
    (dict(attn_sink=np.zeros(16, np.float32), compressor_norm=np.zeros(512, np.float32), wk=np.zeros((128, 512), np.uint16),
          k_norm=np.zeros(128, np.uint16)), TypeError, "LayerWeights: compressor_norm: dtype float32, expected bfloat16"),
    (dict(attn_sink=np.zeros(16, np.float32), wk=np.zeros((128, 512), np.uint16)), ValueError,
     "LayerWeights: compressor_norm, wk, k_norm: all three (a kv source) or none"),
])
def test_bad_weights_are_refused(kw, exc, msg):
    with pytest.raises(exc) as e:
        dsv41kv.LayerWeights(**kw)
    assert msg in str(e.value), str(e.value)


# ---------------------------------------------------------------- CUDA (skipped without a GPU)

def cuda_available():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and dsv41kv.cuda_device_available()


cuda = pytest.mark.skipif(not cuda_available(), reason="needs torch, a CUDA device and a CUDA build of dsv41kv")


def to_torch(a, device="cuda"):
    import torch
    a = np.ascontiguousarray(a)
    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.int16)).to(device).view(torch.bfloat16)
    return torch.from_numpy(a).to(device)


def from_dlpack(a):
    import torch
    t = torch.from_dlpack(a)
    return (t.view(torch.int16).cpu().numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.cpu().numpy())


@cuda
@pytest.mark.parametrize("explicit_stream", [False, True])
def test_cuda_layer_against_the_cpu(explicit_stream):
    """The CUDA layer on torch tensors: caches bit for bit the CPU's (the write path is exact on both
    devices), outputs within bf16 rounding of the CPU's."""
    import torch
    read = read_config(scored=True)
    host = build(read)
    dev = build(read, "cuda")
    swa_bt, cmp_bt = block_tables()
    metas = [dsv41kv.StepMetadata(host[0]), dsv41kv.StepMetadata(dev[0])]
    rng = np.random.default_rng(2)
    stream = torch.cuda.Stream() if explicit_stream else None
    for step in STEPS:
        metas[0].build(requests(step, swa_bt, cmp_bt), padding_rows=PAD)
        metas[1].build(requests(step, swa_bt, cmp_bt), padding_rows=PAD, stream=stream)
        N, T = metas[0].num_rows, metas[0].num_tokens
        for i in LAYERS:
            x = inputs(rng, host[4][i], N)
            host[4][i].run(metas[0], **x)
            dev[4][i].run(metas[1], **{k: to_torch(v) for k, v in x.items()}, stream=stream)
        torch.cuda.synchronize()
        for i in LAYERS:
            h, d = host[4][i], dev[4][i]
            same(from_dlpack(d.swa_cache()), h.swa_cache(), f"layer {i} swa_cache")
            if h.info.is_kv_source:
                same(from_dlpack(d.compressed_cache()), h.compressed_cache(), f"layer {i} compressed_cache")
                same(from_dlpack(d.index_k_cache()), h.index_k_cache(), f"layer {i} index_k_cache")
            a = from_dlpack(d.output())[:T].view(BF16).astype(np.float32)
            b = h.output()[:T].view(BF16).astype(np.float32)
            np.testing.assert_allclose(a, b, atol=2e-2, rtol=2e-2, err_msg=f"layer {i} output")


@cuda
def test_cuda_layer_refuses_host_inputs():
    read = read_config()
    cfg, model, weights, shared, layers = build(read, "cuda")
    meta = dsv41kv.StepMetadata(cfg)
    swa_bt, cmp_bt = block_tables()
    meta.build(requests(STEPS[0], swa_bt, cmp_bt))
    x = inputs(np.random.default_rng(1), layers[0], meta.num_rows)
    with pytest.raises(ValueError, match="AttentionLayer.run: q: on cpu, the layer on cuda:"):
        layers[0].run(meta, **x)


def test_stubs_cover_the_layer():
    import os
    pyi = open(os.path.join(os.path.dirname(dsv41kv._core.__file__), "_core.pyi")).read()
    for name in ["ServingConfig", "ReadPathConfig", "StepRequest", "StepMetadata", "LayerWeights", "LayerShared",
                 "AttentionLayer", "LayerStepStats"]:
        assert f"class {name}" in pyi, name
    for meth in ["def run(", "def run_queries(", "def run_writes(", "def build(", "def from_seed("]:
        assert meth in pyi, meth
    for cls in [dsv41kv.AttentionLayer, dsv41kv.StepMetadata, dsv41kv.LayerShared, dsv41kv.LayerWeights]:
        for n, v in vars(cls).items():
            if not n.startswith("_") and callable(v):
                assert (v.__doc__ or "").strip(), f"{cls.__name__}.{n}"
