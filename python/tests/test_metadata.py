"""The metadata builders against numpy transcriptions of SPEC 6 (random batches: hypothesis).

Outputs live in canary-filled arrays larger than the op's output; the whole array is compared."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dsv41kv

CANARY = -7


@st.composite
def batches(draw, max_reqs=6, max_len=40):
    """A step: query lengths (decodes first when spec), positions, padding rows, block tables."""
    num_reqs = draw(st.integers(1, max_reqs))
    lens = [draw(st.integers(0, max_len)) for _ in range(num_reqs)]
    starts = [draw(st.integers(0, 300)) for _ in range(num_reqs)]
    pad = draw(st.integers(0, 5))
    qsl = np.zeros(num_reqs + 1, np.int32)
    qsl[1:] = np.cumsum(lens)
    T = int(qsl[-1])
    N = T + pad
    positions = np.zeros(N + draw(st.integers(0, 3)), np.int64)
    for b in range(num_reqs):
        positions[qsl[b]:qsl[b + 1]] = starts[b] + np.arange(lens[b])
    max_pages = draw(st.integers(24, 28))  # a page of 16 covers every position
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    bt = rng.integers(0, 50, size=(num_reqs, max_pages)).astype(np.int32)
    # a wider row stride than the row (a view into a larger table)
    wide = np.full((num_reqs, max_pages + 3), 99, np.int32)
    wide[:, :max_pages] = bt
    return dict(qsl=qsl, T=T, N=N, positions=positions, block_table=wide[:, :max_pages], rng=rng,
                starts=starts, lens=lens)


def ref_token_to_req(qsl, N):
    out = np.zeros(N, np.int32)
    for b in range(len(qsl) - 1):
        out[qsl[b]:qsl[b + 1]] = b
    return out


def canary(n, dtype, extra=3):
    return np.full(n + extra, CANARY, dtype)


@settings(max_examples=60, deadline=None)
@given(batches())
def test_token_to_req(s):
    out = canary(s["N"], np.int32)
    dsv41kv.build_token_to_req(s["qsl"], out[:s["N"]])
    want = canary(s["N"], np.int32)
    want[:s["N"]] = ref_token_to_req(s["qsl"], s["N"])
    np.testing.assert_array_equal(out, want)


@settings(max_examples=60, deadline=None)
@given(batches(), st.integers(0, 5))
def test_ring_slots(s, spec):
    cap = dsv41kv.ring_capacity(spec)
    assert cap == max(8, 1 << (spec + 1).bit_length())  # max(8, next_pow2(spec + 2))
    N, T = s["N"], s["T"]
    t2r = ref_token_to_req(s["qsl"], N)
    ring_bt = s["block_table"][:, 2:3]  # a strided [num_reqs, 1] column
    out = canary(N, np.int64)
    dsv41kv.build_ring_slots(t2r, s["positions"], ring_bt, out[:N], num_actual_tokens=T, cap=cap)
    want = canary(N, np.int64)
    for i in range(N):
        b = int(ring_bt[t2r[i], 0])
        want[i] = -1 if i >= T or b <= 0 else b * cap + int(s["positions"][i]) % cap
    np.testing.assert_array_equal(out, want)


def ref_token_slots(t2r, positions, bt, T, N, page):
    out = np.full(N, -1, np.int64)
    for t in range(T):
        p = int(positions[t])
        pg = int(bt[t2r[t], p // page])
        out[t] = pg * page + p % page if pg > 0 else -1
    return out


@settings(max_examples=60, deadline=None)
@given(batches(), st.sampled_from([16, 32, 64]))
def test_token_slots(s, page):
    N, T = s["N"], s["T"]
    t2r = ref_token_to_req(s["qsl"], N)
    out = canary(N, np.int64)
    dsv41kv.build_token_slots(t2r, s["positions"], s["block_table"], out[:N], num_actual_tokens=T, page=page)
    want = canary(N, np.int64)
    want[:N] = ref_token_slots(t2r, s["positions"], s["block_table"], T, N, page)
    np.testing.assert_array_equal(out, want)


@settings(max_examples=60, deadline=None)
@given(batches(), st.sampled_from([1, 2]), st.sampled_from([16, 32]), st.booleans())
def test_compressed_slots(s, ratio, S, masked):
    N, T = s["N"], s["T"]
    t2r = ref_token_to_req(s["qsl"], N)
    tslots = None
    if masked:
        tslots = np.where(s["rng"].random(N) < 0.3, -1, 5).astype(np.int64)
    out = canary(N, np.int64)
    dsv41kv.build_compressed_slots(t2r, s["positions"], s["block_table"], out[:N], ratio=ratio,
                                   num_actual_tokens=T, states_per_page=S, token_slots=tslots)
    want = canary(N, np.int64)
    want[:N] = -1
    for t in range(T):
        p = int(s["positions"][t])
        if (p + 1) % ratio or (tslots is not None and tslots[t] == -1):
            continue
        st_ = p // ratio
        pg = int(s["block_table"][t2r[t], st_ // S])
        want[t] = pg * S + st_ % S if pg > 0 else -1
    np.testing.assert_array_equal(out, want)


def decode_prefix(lens, spec):
    n = 0
    while n < len(lens) and lens[n] <= 1 + spec:
        n += 1
    return n


def expected_rows(idx, lens, n, ndt):
    """The canary-filled expectation of a decode-row builder before its rows are filled in: the
    index rows of the decode tokens all -1, lengths 0 for every row < n, canaries beyond."""
    widx = np.full_like(idx, CANARY)
    widx[:ndt] = -1
    wl = np.full_like(lens, CANARY)
    wl[:n] = 0
    return widx, wl


@settings(max_examples=60, deadline=None)
@given(batches(max_len=4), st.integers(0, 2))
def test_split_and_swa_window(s, spec):
    qsl, N = s["qsl"], s["N"]
    nd = decode_prefix(s["lens"], spec)
    ndt = int(qsl[nd])
    split = dsv41kv.split_decode_prefill(qsl, spec)
    assert split == dict(num_reqs=len(qsl) - 1, num_decodes=nd, num_decode_tokens=ndt,
                         num_prefills=len(qsl) - 1 - nd, num_prefill_tokens=int(qsl[-1]) - ndt)
    t2r = ref_token_to_req(qsl, N)
    slot_swa = np.where(s["rng"].random(N) < 0.2, -1, 0).astype(np.int64)
    max_tokens = N + 2
    idx = np.full((max_tokens + 1, 128), CANARY, np.int32)
    lens = np.full(max_tokens + 1, CANARY, np.int32)
    got = dsv41kv.build_swa_window(qsl, s["positions"], slot_swa, s["block_table"], idx[:max_tokens],
                                   lens[:max_tokens], num_speculative_tokens=spec, page=32)
    assert got == split
    widx, wl = expected_rows(idx, lens, max_tokens, ndt)
    for t in range(ndt):
        if slot_swa[t] < 0:
            continue
        p = int(s["positions"][t])
        start = max(p - 127, 0)
        wl[t] = p - start + 1
        for k in range(wl[t]):
            x = start + k
            pg = int(s["block_table"][t2r[t], x // 32])
            widx[t, k] = pg * 32 + x % 32 if pg > 0 else -1
    np.testing.assert_array_equal(lens, wl)
    np.testing.assert_array_equal(idx, widx)


@settings(max_examples=40, deadline=None)
@given(batches(max_len=3), st.sampled_from([16, 32, 64]))
def test_decode_topk_slots(s, S):
    qsl, N = s["qsl"], s["N"]
    t2r = ref_token_to_req(qsl, N)
    ndt = int(qsl[decode_prefix(s["lens"], 0)])
    K = 16
    maxe = S * s["block_table"].shape[1]
    topk = s["rng"].integers(-1, maxe, size=(N, K)).astype(np.int32)
    slot_swa = np.where(s["rng"].random(N) < 0.2, -1, 0).astype(np.int64)
    idx = np.full((N + 1, K), CANARY, np.int32)
    lens = np.full(N + 1, CANARY, np.int32)
    dsv41kv.build_decode_topk_slots(qsl, slot_swa, topk, s["block_table"], idx[:N], lens[:N], states_per_page=S)
    widx, wl = expected_rows(idx, lens, N, ndt)
    for t in range(ndt):
        if slot_swa[t] < 0:
            continue
        for k in range(K):
            i = int(topk[t, k])
            if i >= 0:
                pg = int(s["block_table"][t2r[t], i // S])
                widx[t, k] = pg * S + i % S if pg > 0 else -1
        wl[t] = int((widx[t] >= 0).sum())
    np.testing.assert_array_equal(lens, wl)
    np.testing.assert_array_equal(idx, widx)


@settings(max_examples=40, deadline=None)
@given(batches(max_len=8), st.integers(0, 2))
def test_prefill_gather(s, spec):
    qsl = s["qsl"]
    R = len(qsl) - 1
    seq_lens = np.array([s["starts"][b] + s["lens"][b] for b in range(R)], np.int64)
    gl = np.full(R + 2, CANARY, np.int64)
    gs = np.full(R + 2, CANARY, np.int64)
    split = dsv41kv.build_prefill_gather(qsl, seq_lens, gl[:R], gs[:R], num_speculative_tokens=spec)
    nd = split["num_decodes"]
    wgl = np.full_like(gl, CANARY)
    wgs = np.full_like(gs, CANARY)
    wgl[:R] = 0
    wgs[:R] = 0
    for i in range(R - nd):
        b = nd + i
        ql = s["lens"][b]
        G = ql + min(int(seq_lens[b]) - ql, 127)
        wgl[i], wgs[i] = G, seq_lens[b] - G
    np.testing.assert_array_equal(gl, wgl)
    np.testing.assert_array_equal(gs, wgs)


def test_sizes_and_layouts():
    assert dsv41kv.record_info("584")["record_bytes"] == 584
    assert dsv41kv.record_info("mxfp8_528")["record_bytes"] == 528
    assert dsv41kv.record_info("nvfp4_288")["record_bytes"] == 288
    assert dsv41kv.default_page_stride("v4_584", 64) == 37440
    assert dsv41kv.default_page_stride("v4_584", 32) == 19008
    assert dsv41kv.default_page_stride("528", 64) == 33792
    assert dsv41kv.default_page_stride("288", 32) == 9216
    assert dsv41kv.index_k_record_bytes("fp8_132") == 132
    assert dsv41kv.prefill_workspace_rows(2, 1024, 256) == 4 * (512 + 128 + 256)
    assert dsv41kv.ring_capacity(0) == 8 and dsv41kv.ring_capacity(7) == 16
    assert dsv41kv.kernel_block_size("cpu") == 64 and dsv41kv.kernel_block_size("sm_100") == 128
    assert dsv41kv.indexer_takes_shortcut(1024, 2) and not dsv41kv.indexer_takes_shortcut(1026, 2)


def test_config_and_backend(tmp_path):
    cfg = dsv41kv.deepseek_v41_flash()
    assert cfg.head_dim == 512 and cfg.index_topk == 512
    assert [l.ratio for l in cfg.layers[:4]] == [cfg.ratio(i) for i in range(4)]
    sel = dsv41kv.select_backend(cfg)
    assert sel["swa_format"] == "v4_584" and sel["kernel_block_size"] == 64
    assert dsv41kv.select_backend(cfg, device="cpu_sm100")["compressed_format"] == "mxfp8_528"
    with pytest.raises(ValueError, match="E5"):
        dsv41kv.select_backend(cfg, device="sm_80")
    with pytest.raises(ValueError, match="required key .hidden_size. is missing"):
        dsv41kv.parse_model_config('{"num_hidden_layers": 2}')
    table = np.zeros((32, 64), np.float32)
    dsv41kv.rope_table(cfg, 0, table)
    f = np.float64(cfg.rope_theta) ** (-np.arange(32) * 2 / 64)
    np.testing.assert_allclose(table[5, :32], np.cos(5 * f), rtol=0, atol=1e-7)
    np.testing.assert_allclose(table[5, 32:], np.sin(5 * f), rtol=0, atol=1e-7)
