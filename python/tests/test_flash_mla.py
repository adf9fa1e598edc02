"""dsv41kv.flash_mla against a binary64 transcription of FlashMLA's reference (tests/ref.py of
FlashMLA: masks -1 and positions at or past topk_length, the sink scales the output, a row without
keys is 0 with lse +inf), with FlashMLA's tolerances; on the CPU backend (torch CPU tensors) and on
CUDA. FlashMLA's own harness runs on the H200 through scripts/run-flashmla-tests.py."""
import pytest

torch = pytest.importorskip("torch")

import dsv41kv  # noqa: E402
from dsv41kv import flash_mla  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and dsv41kv.cuda_device_available() else [])


def quantize_model1(k):
    """FlashMLA's MODEL1 FP8 layout (tests/quant.py) of k [nb, bs, 512] bf16 -> (nb, bs, 1, 584) and
    the dequantized keys: 448 e4m3 in 7 tiles of 64 with UE8M0 scales, 64 bf16 RoPE values."""
    nb, bs, _ = k.shape
    page = (bs * 584 + 575) // 576 * 576
    raw = torch.zeros(nb, page, dtype=torch.uint8)
    vals = raw[:, :bs * 576].view(nb, bs, 576)
    scales = raw[:, bs * 576:bs * 584].view(nb, bs, 8)
    deq = torch.empty(nb, bs, 512, dtype=torch.float64)
    kf = k.float()
    for t in range(7):
        tile = kf[..., 64 * t:64 * (t + 1)]
        s = torch.pow(2, torch.clamp_min(tile.abs().amax(-1) / 448.0, 1e-4).log2().ceil())
        codes = (tile / s.unsqueeze(-1)).to(torch.float8_e4m3fn)
        vals[..., 64 * t:64 * (t + 1)] = codes.view(torch.uint8)
        scales[..., t] = (s.log2().round() + 127).to(torch.uint8)
        deq[..., 64 * t:64 * (t + 1)] = (codes.float() * s.unsqueeze(-1)).to(torch.bfloat16).double()
    vals[..., 448:] = k[..., 448:].contiguous().view(torch.uint8).view(nb, bs, 128)
    deq[..., 448:] = k[..., 448:].double()
    cache = raw.as_strided((nb, bs, 1, 584), (page, 584, 584, 1))
    return cache, deq.reshape(nb * bs, 512)


def ref(q, keys, masks, sink, scale):
    """q [T, H, 512]; keys list of [T, K_i, 512] f64; masks [T, K_i] (True = attended)."""
    k = torch.cat(keys, 1)
    m = torch.cat(masks, 1)
    s = torch.einsum("thd,tkd->thk", q.double(), k) * scale
    s = s.masked_fill(~m[:, None, :], -torch.inf)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)
    o = torch.einsum("thk,tkd->thd", p, k)
    if sink is not None:
        o = o / (1 + torch.exp(sink.double().view(1, -1) - lse)).unsqueeze(-1)
    none = torch.isneginf(lse)
    o[none] = 0
    lse[none] = torch.inf
    return o, lse


def close(out, lse, ro, rl, abs_tol=1e-3, rel_tol=2.01 / 128):
    o = out.double()
    assert ((o - ro).abs() <= abs_tol + rel_tol * ro.abs()).all()
    inf = torch.isinf(rl)
    assert torch.equal(torch.isinf(lse), inf)
    assert ((lse.double() - rl).abs()[~inf] <= 1e-6 + 8.01 / 65536 * rl.abs()[~inf]).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("topk,extra_topk,block,extra_block", [(64, None, 64, None), (128, 512, 32, 64),
                                                               (700, 96, 16, 8)])
def test_sparse_decode(device, topk, extra_topk, block, extra_block):
    g = torch.Generator().manual_seed(topk)
    b, s_q, h = 3, 2, 64
    T = b * s_q
    q = torch.randn(b, s_q, h, 512, generator=g).to(torch.bfloat16)
    nb = 40
    k_cache, kd = quantize_model1(torch.randn(nb, block, 512, generator=g).to(torch.bfloat16))
    idx = torch.randint(-1, nb * block, (b, s_q, topk), generator=g, dtype=torch.int32)
    tl = torch.randint(0, topk + 1, (b,), generator=g, dtype=torch.int32)
    sink = torch.randn(h, generator=g)
    keys = [kd[idx.clamp(min=0).view(T, -1).long()]]
    masks = [(idx.view(T, -1) >= 0) & (torch.arange(topk) < tl.repeat_interleave(s_q)[:, None])]
    kw = {}
    if extra_topk:
        e_cache, ed = quantize_model1(torch.randn(nb, extra_block, 512, generator=g).to(torch.bfloat16))
        eidx = torch.randint(-1, nb * extra_block, (b, s_q, extra_topk), generator=g, dtype=torch.int32)
        kw = dict(extra_k_cache=e_cache.to(device), extra_indices_in_kvcache=eidx.to(device))
        keys.append(ed[eidx.clamp(min=0).view(T, -1).long()])
        masks.append(eidx.view(T, -1) >= 0)
    scale = 512 ** -0.55
    meta, _ = flash_mla.get_mla_metadata()
    out, lse = flash_mla.flash_mla_with_kvcache(q.to(device), k_cache.to(device), None, None, 512, meta, None, scale,
                                                False, True, idx.to(device), sink.to(device), topk_length=tl.to(device),
                                                **kw)
    assert out.shape == (b, s_q, h, 512) and out.dtype == torch.bfloat16 and lse.shape == (b, h, s_q)
    ro, rl = ref(q.view(T, h, 512), keys, masks, sink, scale)
    close(out.cpu().view(T, h, 512), lse.cpu().transpose(1, 2).reshape(T, h), ro, rl)


@pytest.mark.parametrize("device", DEVICES)
def test_sparse_prefill(device):
    g = torch.Generator().manual_seed(5)
    s_q, h, s_kv, topk = 9, 64, 300, 256
    q = torch.randn(s_q, h, 512, generator=g).to(torch.bfloat16)
    kv = torch.randn(s_kv, 1, 512, generator=g).to(torch.bfloat16)
    idx = torch.randint(-1, s_kv + 5, (s_q, 1, topk), generator=g, dtype=torch.int32)
    tl = torch.randint(0, topk + 1, (s_q,), generator=g, dtype=torch.int32)
    sink = torch.randn(h, generator=g)
    scale = 512 ** -0.55
    out, max_logits, lse = flash_mla.flash_mla_sparse_fwd(q.to(device), kv.to(device), idx.to(device), scale,
                                                          attn_sink=sink.to(device), topk_length=tl.to(device))
    i = idx[:, 0]
    m = (i >= 0) & (i < s_kv) & (torch.arange(topk) < tl[:, None])
    keys = kv[:, 0].double()[i.clamp(0, s_kv - 1).long()]
    ro, rl = ref(q, [keys], [m], sink, scale)
    close(out.cpu(), lse.cpu(), ro, rl, abs_tol=8e-4, rel_tol=3.01 / 128)
    s = torch.einsum("thd,tkd->thk", q.double(), keys) * scale
    ml = s.masked_fill(~m[:, None, :], -torch.inf).amax(-1)
    inf = torch.isinf(ml)
    assert torch.equal(max_logits.cpu()[inf], ml.float()[inf])
    assert torch.allclose(max_logits.cpu()[~inf].double(), ml[~inf], rtol=2.01 / 65536, atol=1e-6)


def test_refuses_v32_records_and_dense_mode():
    meta, _ = flash_mla.get_mla_metadata()
    q = torch.zeros(1, 1, 64, 576, dtype=torch.bfloat16)
    k = torch.zeros(2, 64, 1, 656, dtype=torch.uint8)
    with pytest.raises(ValueError, match="512"):
        flash_mla.flash_mla_with_kvcache(q, k, None, None, 512, meta, indices=torch.zeros(1, 1, 8, dtype=torch.int32),
                                         is_fp8_kvcache=True)
    with pytest.raises(NotImplementedError, match="dense"):
        flash_mla.flash_mla_with_kvcache(q[..., :512], k, None, None, 512, meta)
