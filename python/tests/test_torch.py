"""torch tensors, torch.ops.dsv41kv and CUDA (skipped without torch; the CUDA tests without a GPU):
the conformance files through the API on CUDA tensors (write path bit for bit equal to the CPU's,
read path judged by the project's checker), CUDA graph capture and replay with identical results,
torch.library.opcheck on the registered ops, and the host overhead per eager call."""
import os
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import dsv41kv  # noqa: E402
import test_conformance as tc  # noqa: E402

cuda = pytest.mark.skipif(not (torch.cuda.is_available() and dsv41kv.cuda_device_available()),
                          reason="needs a CUDA device and a CUDA build of dsv41kv")


class OnCuda:
    """test_conformance's array adapter over torch CUDA tensors (bf16 bits travel as torch.bfloat16)."""

    device = "cuda"

    @staticmethod
    def put(a):
        a = np.ascontiguousarray(a)
        if a.dtype == np.uint16:
            return torch.from_numpy(a.view(np.int16)).cuda().view(torch.bfloat16)
        return torch.from_numpy(a).cuda()

    @staticmethod
    def get(t):
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).cpu().numpy().view(np.uint16)
        return t.cpu().numpy()

    @staticmethod
    def strided(buf, shape, strides):
        return torch.as_strided(buf, shape, strides)

    @staticmethod
    def sync():
        torch.cuda.synchronize()


def test_cpu_torch_tensors():
    qsl = torch.tensor([0, 2, 5], dtype=torch.int32)
    t2r = torch.full((7,), -7, dtype=torch.int32)
    dsv41kv.build_token_to_req(qsl, t2r[:6])
    assert t2r.tolist() == [0, 0, 1, 1, 1, 0, -7]
    with pytest.raises(TypeError, match="build_token_to_req: qsl: dtype int64, expected int32"):
        dsv41kv.build_token_to_req(qsl.long(), t2r[:6])


def test_bf16_tensors_without_copies():
    o = torch.randn(3, 8, 512).to(torch.bfloat16)
    pos = torch.tensor([0, 5, 9], dtype=torch.int64)
    table = torch.zeros(16, 64)
    table[:, :32] = 1.0  # cos 1, sin 0: the identity rotation
    out = torch.full((3, 4, 512), 7.0, dtype=torch.bfloat16)
    dsv41kv.attention_output_rope(o, pos, table, out, num_real_heads=4)
    assert torch.equal(out, o[:, :4])


def registered():
    import dsv41kv.torch as dt
    return dt


def test_ops_are_registered_with_mutating_schemas():
    dt = registered()
    for name in dt.OPS:
        op = getattr(torch.ops.dsv41kv, name).default
        assert any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments), name
    qsl = torch.tensor([0, 1, 3], dtype=torch.int32)
    t2r = torch.zeros(4, dtype=torch.int32)
    torch.ops.dsv41kv.build_token_to_req(qsl, t2r)
    assert t2r.tolist() == [0, 1, 1, 0]


def prefill_args(device, T=3, H=8, s_kv=40, topk=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, H, 512, generator=g).to(torch.bfloat16).to(device)
    kv = torch.randn(s_kv, 512, generator=g).to(torch.bfloat16).to(device)
    idx = torch.randint(-1, s_kv, (T, topk), generator=g, dtype=torch.int32).to(device)
    lens = torch.randint(0, topk + 1, (T,), generator=g, dtype=torch.int32).to(device)
    sink = torch.randn(H, generator=g).to(device)
    out = torch.zeros(T, H, 512, dtype=torch.bfloat16, device=device)
    lse = torch.zeros(T, H, device=device)
    return q, kv, idx, lens, sink, out, lse


def opcheck_devices():
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() and dsv41kv.cuda_device_available() else [])


@pytest.mark.parametrize("device", opcheck_devices())
def test_opcheck(device):
    registered()
    torch.library.opcheck(torch.ops.dsv41kv.sparse_prefill.default, prefill_args(device))
    qsl = torch.tensor([0, 2, 5], dtype=torch.int32, device=device)
    torch.library.opcheck(torch.ops.dsv41kv.build_token_to_req.default,
                          (qsl, torch.zeros(6, dtype=torch.int32, device=device)))
    t2r = torch.tensor([0, 0, 1, 1, 1, 0], dtype=torch.int32, device=device)
    pos = torch.tensor([3, 4, 0, 1, 2, 0], dtype=torch.int64, device=device)
    bt = torch.tensor([[2], [3]], dtype=torch.int32, device=device)
    torch.library.opcheck(torch.ops.dsv41kv.build_ring_slots.default,
                          (t2r, pos, bt, torch.zeros(6, dtype=torch.int64, device=device), 5))


@cuda
def test_conformance_files_on_cuda(conformance_dir, tmp_path):
    (tmp_path / "cuda").mkdir()
    (tmp_path / "host").mkdir()
    d, outs = tc.dump_all(conformance_dir, tmp_path / "cuda", OnCuda)
    _, host_outs = tc.dump_all(conformance_dir, tmp_path / "host")
    for name in tc.FILES[:2]:  # the write path: the CPU's bytes
        for k, (_, a) in outs[name].items():
            assert a.tobytes() == host_outs[name][k][1].tobytes(), f"{name} {k}: CUDA differs from the CPU"
    ok, text = tc.check_read_path(d, conformance_dir)
    assert ok, text


@cuda
def test_graph_capture_and_replay():
    """Write path, indexer and attention captured in one CUDA graph; two replays equal the eager run."""
    q, kv, idx, lens, sink, out, lse = prefill_args("cuda", T=6, H=16, s_kv=300, topk=128, seed=3)
    pos = torch.arange(6, dtype=torch.int64, device="cuda") * 37
    table = torch.zeros(256, 64, device="cuda")
    table[:, :32] = 0.5
    table[:, 32:] = 0.25
    o2 = torch.zeros(6, 8, 512, dtype=torch.bfloat16, device="cuda")
    qsl = torch.tensor([0, 2, 6], dtype=torch.int32, device="cuda")
    t2r = torch.zeros(8, dtype=torch.int32, device="cuda")

    def step():
        dsv41kv.build_token_to_req(qsl, t2r)
        dsv41kv.sparse_prefill(q, kv, idx, lens, sink, out, lse)
        dsv41kv.attention_output_rope(out, pos, table, o2, num_real_heads=8)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm-up and the eager reference
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    ref = [t.clone() for t in (t2r, out, lse, o2)]
    for t in (t2r, out, lse, o2):
        t.zero_()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    for _ in range(2):
        for t in (t2r, out, lse, o2):
            t.zero_()
        g.replay()
        torch.cuda.synchronize()
        for a, b in zip((t2r, out, lse, o2), ref):
            assert torch.equal(a, b)


def overhead_us(fn, n=2000):
    for _ in range(100):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def test_per_call_overhead(capsys):
    """The host cost of one eager call (a small op, so that the op itself is negligible), printed
    for docs/performance.md; on CUDA the launch is asynchronous, so this is the Python-side and
    launch cost. Not a pass/fail figure on shared CI machines unless DSV41KV_OVERHEAD_LIMIT_US is set."""
    rows = []
    for device in opcheck_devices():
        qsl = torch.tensor([0, 1], dtype=torch.int32, device=device)
        t2r = torch.zeros(1, dtype=torch.int32, device=device)
        rows.append((device, "build_token_to_req (2 tensors)", overhead_us(lambda: dsv41kv.build_token_to_req(qsl, t2r))))
        # the framework's own floor for an eager op on the same device (a 2-element add into out=)
        x = torch.zeros(2, dtype=torch.int32, device=device)
        rows.append((device, "torch.add(out=) (reference)", overhead_us(lambda: torch.add(qsl, qsl, out=x))))
        a = prefill_args(device, T=1, H=8, s_kv=8, topk=8)
        if device == "cuda":
            rows.append((device, "sparse_prefill (7 tensors)", overhead_us(lambda: dsv41kv.sparse_prefill(*a))))
            registered()
            rows.append((device, "torch.ops.dsv41kv.sparse_prefill",
                         overhead_us(lambda: torch.ops.dsv41kv.sparse_prefill(*a))))
        if device == "cuda":
            torch.cuda.synchronize()
    with capsys.disabled():
        for d, what, us in rows:
            print(f"\noverhead {d:4s} {what:40s} {us:7.2f} us/call")
    limit = os.environ.get("DSV41KV_OVERHEAD_LIMIT_US")
    if limit:
        assert all(us <= float(limit) for d, w, us in rows if "torch.ops" not in w and "reference" not in w), rows
