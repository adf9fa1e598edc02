"""The CPU ops against numpy references (random inputs each run: hypothesis), outputs in
canary-filled arrays larger than the op's output."""
import ml_dtypes
import numpy as np
from hypothesis import given, settings, strategies as st

import dsv41kv

BF16 = ml_dtypes.bfloat16
NAN16 = 0x7FC0


def bf16_bits(x):
    return np.asarray(x, np.float32).astype(BF16).view(np.uint16)


def from_bits(b):
    return (np.asarray(b, np.uint16).astype(np.uint32) << 16).view(np.float32)


def ref_attention(q, keys_per_row, sink, scale):
    """q f64 [T, H, 512]; keys_per_row: list of f64 [n_t, 512] (K = V); SPEC 9.2 with the sink."""
    T, H, _ = q.shape
    out = np.zeros((T, H, 512))
    lse = np.full((T, H), np.inf)
    for t in range(T):
        k = keys_per_row[t]
        if len(k) == 0:
            continue
        s = scale * (q[t] @ k.T)  # [H, n]
        m = s.max(axis=1, keepdims=True)
        e = np.exp(s - m)
        z = e.sum(axis=1)
        lse[t] = np.log(z) + m[:, 0]
        with np.errstate(over="ignore"):
            zs = z + np.exp(sink - m[:, 0])  # a -inf sink adds 0, +inf makes the output 0
        out[t] = (e @ k) / zs[:, None]
    return out, lse


def assert_attention(out_bits, lse, ref_out, ref_lse):
    o = from_bits(out_bits).astype(np.float64)
    assert (np.abs(o - ref_out) <= 4e-3 + 1e-2 * np.abs(ref_out)).all()
    inf = np.isinf(ref_lse)
    assert (lse[inf] == np.inf).all()
    assert (np.abs(lse[~inf] - ref_lse[~inf]) <= 1e-3 + 1e-4 * np.abs(ref_lse[~inf])).all()


@settings(max_examples=12, deadline=None)
@given(st.integers(1, 5), st.sampled_from([8, 16]), st.integers(1, 80), st.integers(0, 2**31 - 1))
def test_sparse_prefill(T, H, s_kv, seed):
    rng = np.random.default_rng(seed)
    topk = 64
    q = bf16_bits(rng.standard_normal((T, H, 512)))
    kv = bf16_bits(rng.standard_normal((s_kv, 512)))
    idx = rng.integers(-2, s_kv + 3, size=(T, topk)).astype(np.int32)
    lens = rng.integers(0, topk + 1, size=T).astype(np.int32)
    sink = rng.standard_normal(H).astype(np.float32)
    sink[0] = -np.inf
    out = np.full((T + 1, H, 512), NAN16, np.uint16)
    lse = np.full((T + 1, H), -7.0, np.float32)
    dsv41kv.sparse_prefill(q, kv, idx, lens, sink, out[:T], lse[:T])
    kf = from_bits(kv).astype(np.float64)
    keys = [kf[[j for j in idx[t, :lens[t]] if 0 <= j < s_kv]] for t in range(T)]
    ro, rl = ref_attention(from_bits(q).astype(np.float64), keys, sink.astype(np.float64), dsv41kv.SOFTMAX_SCALE)
    assert_attention(out[:T], lse[:T], ro, rl)
    assert (out[T] == NAN16).all() and (lse[T] == -7.0).all()


@settings(max_examples=8, deadline=None)
@given(st.integers(1, 4), st.booleans(), st.integers(0, 2**31 - 1))
def test_sparse_decode_plain_bf16_caches(T, with_cmp, seed):
    rng = np.random.default_rng(seed)
    H, S, pages = 8, 32, 6
    q = bf16_bits(rng.standard_normal((T, H, 512)))
    swa = np.full((pages, S, 512 + 8), NAN16, np.uint16)[:, :, :512]  # row stride 520
    swa[:] = bf16_bits(rng.standard_normal((pages, S, 512)))
    nslots = pages * S
    swa_idx = rng.integers(-1, nslots, size=(T, 128)).astype(np.int32)
    swa_lens = rng.integers(0, 129, size=T).astype(np.int32)
    sink = rng.standard_normal(H).astype(np.float32)
    kw = {}
    keys_c = [np.zeros((0, 512))] * T
    if with_cmp:
        cmp = bf16_bits(rng.standard_normal((pages, 64, 512)))
        cmp_idx = rng.integers(-1, pages * 64, size=(T, 512)).astype(np.int32)
        cmp_lens = rng.integers(0, 513, size=T).astype(np.int32)
        kw = dict(cmp_cache=cmp, cmp_format="bf16", cmp_indices=cmp_idx, cmp_lens=cmp_lens)
        cf = from_bits(cmp).astype(np.float64).reshape(-1, 512)
        keys_c = [cf[[j for j in cmp_idx[t, :cmp_lens[t]] if j >= 0]] for t in range(T)]
    sched = dsv41kv.plan_decode_schedule("c1a" if with_cmp else "swaonly", T, num_heads=H, block_size=64)
    out = np.full((T + 2, H, 512), NAN16, np.uint16)
    lse = np.full((T + 2, H), -7.0, np.float32)
    dsv41kv.sparse_decode(sched, q, swa, swa_idx, swa_lens, sink, out[:T], lse[:T], swa_format="bf16", **kw)
    sf = from_bits(swa).astype(np.float64).reshape(-1, 512)
    keys = [np.concatenate([keys_c[t], sf[[j for j in swa_idx[t, :swa_lens[t]] if j >= 0]]]) for t in range(T)]
    ro, rl = ref_attention(from_bits(q).astype(np.float64), keys, sink.astype(np.float64), dsv41kv.SOFTMAX_SCALE)
    assert_attention(out[:T], lse[:T], ro, rl)
    assert (out[T:] == NAN16).all() and (lse[T:] == -7.0).all()


def rope_ref(x, c, s, inverse):
    """SPEC 1.4 on the 32 interleaved pairs of x (f32 [..., 64]) with fp32 products and fma."""
    x0, x1 = x[..., 0::2].astype(np.float64), x[..., 1::2].astype(np.float64)
    c, s = c.astype(np.float64), s.astype(np.float64)
    if inverse:
        y0 = x0 * c + (x1 * s).astype(np.float32)
        y1 = x1 * c - (x0 * s).astype(np.float32)
    else:
        y0 = x0 * c - (x1 * s).astype(np.float32)
        y1 = x1 * c + (x0 * s).astype(np.float32)
    y = np.empty(x.shape, np.float32)
    y[..., 0::2], y[..., 1::2] = y0.astype(np.float32), y1.astype(np.float32)
    return y


def ulps_apart(a_bits, b_bits):
    o = lambda b: np.where(b & 0x8000, -(b & 0x7FFF).astype(np.int64), (b & 0x7FFF).astype(np.int64))
    return np.abs(o(a_bits) - o(b_bits))


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 6), st.sampled_from([8, 16]), st.integers(0, 2**31 - 1))
def test_output_rope(T, H, seed):
    rng = np.random.default_rng(seed)
    cfg = dsv41kv.deepseek_v41_flash()
    table = np.zeros((256, 64), np.float32)
    dsv41kv.rope_table(cfg, 2, table)
    o = bf16_bits(rng.standard_normal((T, H, 512)))
    pos = rng.integers(0, 256, size=T).astype(np.int64)
    real = H // 2
    out = np.full((T + 1, real, 512), NAN16, np.uint16)
    dsv41kv.attention_output_rope(o, pos, table, out[:T], num_real_heads=real)
    want = o[:, :real].copy()
    y = rope_ref(from_bits(o[:, :real, 448:]), table[pos, None, :32], table[pos, None, 32:], inverse=True)
    want[..., 448:] = bf16_bits(y)
    assert (out[:T, :, :448] == want[..., :448]).all()
    assert ulps_apart(out[:T, :, 448:], want[..., 448:]).max() <= 1
    assert (out[T] == NAN16).all()


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 12), st.integers(0, 2**31 - 1))
def test_plain_insert_then_gather(N, seed):
    """rope_quant_insert into bf16 rows (the rotated latent, bf16) and gather back (a copy)."""
    rng = np.random.default_rng(seed)
    S, pages = 16, 3
    latent = bf16_bits(rng.standard_normal((N, 512)))
    pos = rng.integers(0, 64, size=N).astype(np.int64)
    table = np.zeros((64, 64), np.float32)
    dsv41kv.rope_table(dsv41kv.deepseek_v41_flash(), 1, table)
    slots = rng.permutation(pages * S)[:N].astype(np.int64)
    slots[rng.random(N) < 0.25] = -1
    cache = np.full((pages, S, 512), 0x4040, np.uint16)
    dsv41kv.rope_quant_insert(latent, pos, table, slots, cache, cache_format="bf16", ratio=1)
    flat = cache.reshape(-1, 512)
    for t in range(N):
        if slots[t] < 0:
            continue
        row = flat[slots[t]]
        assert (row[:448] == latent[t, :448]).all()
        y = rope_ref(from_bits(latent[t, 448:]), table[pos[t], :32], table[pos[t], 32:], inverse=False)
        assert ulps_apart(row[448:], bf16_bits(y)).max() <= 1
    untouched = np.ones(pages * S, bool)
    untouched[slots[slots >= 0]] = False
    assert (flat[untouched] == 0x4040).all()
    got = np.full((N + 1, 512), NAN16, np.uint16)
    dsv41kv.gather(cache, slots, got[:N], cache_format="bf16")
    for t in range(N):
        assert (got[t] == (flat[slots[t]] if slots[t] >= 0 else NAN16)).all()
    assert (got[N] == NAN16).all()


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 8), st.integers(0, 2**31 - 1))
def test_save_ring_rows(G, seed):
    rng = np.random.default_rng(seed)
    blocks, cap = 3, 8
    rows = rng.standard_normal((G, 1024)).astype(np.float32)
    slots = rng.permutation(blocks * cap)[:G].astype(np.int64)
    slots[rng.random(G) < 0.3] = -1
    ring = np.full((blocks, cap, 1024), -7.0, np.float32)
    dsv41kv.save_ring_rows(rows, slots, ring)
    want = np.full_like(ring, -7.0).reshape(-1, 1024)
    for g in range(G):
        if slots[g] >= 0:
            want[slots[g]] = rows[g]
    np.testing.assert_array_equal(ring.reshape(-1, 1024), want)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(0, 1100), min_size=1, max_size=8), st.sampled_from([1, 2]), st.integers(0, 2**31 - 1))
def test_shortcut_topk(positions, ratio, seed):
    rng = np.random.default_rng(seed)
    T = len(positions)
    pos = np.array(positions, np.int64)
    valid = (rng.random(T) < 0.8).astype(np.int32)
    pos[(pos + 1) // ratio > 512] = 511  # the shortcut serves n_c <= 512 only
    topk = np.full((T + 1, 512), -7, np.int32)
    dsv41kv.indexer_shortcut_topk(pos, topk[:T], ratio=ratio, token_valid=valid)
    want = np.full_like(topk, -7)
    for t in range(T):
        n = (pos[t] + 1) // ratio if valid[t] else 0
        want[t] = -1
        want[t, :n] = np.arange(n)
    np.testing.assert_array_equal(topk, want)
