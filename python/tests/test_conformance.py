"""The conformance files of shared/conformance through the Python API: the same numbers as the
C++ tool (`dsv41kv conform --dump`, bit for bit, when the tool is built) and the same agreement
rules (scripts/check-conform-dump.py, the project's independent checker, on the Python outputs).
"""
import math
import subprocess
import sys

import numpy as np
import pytest

import dsv41kv
import st

FILES = ["compress_r1_shared.safetensors", "compress_r2_shared.safetensors",
         "sparse_decode_shared.safetensors.gz", "sparse_prefill_shared.safetensors.gz",
         "indexer_shared.safetensors.gz"]
FORMATS = ["v4_584", "mxfp8_528", "nvfp4_288", "bf16", "fp8"]
BF16_NAN = 0x7FC0


class Host:
    """Where the arrays of a run live: numpy arrays on the host (a device variant in test_torch.py
    has the same methods over torch CUDA tensors)."""

    device = "cpu"

    @staticmethod
    def put(a):
        return a

    @staticmethod
    def get(a):
        return a

    @staticmethod
    def strided(buf, shape, strides_elems):
        return np.lib.stride_tricks.as_strided(buf, shape=shape, strides=[s * buf.itemsize for s in strides_elems])

    @staticmethod
    def sync():
        pass


def plain_rows(x, buf, pages, S, page_stride, row_stride=512):
    return x.strided(buf, (pages, S, 512), (page_stride, row_stride, 1))


def run_compress(f, x=Host):
    """fused_save_compress_norm then rope_quant_insert of every format, as the tool runs them."""
    m = f.meta
    R, S = m["compress_ratio"], m["states_per_page"]
    bf16_bits = int(np.array([m["bf16_canary"]], np.float32).view(np.uint32)[0] >> 16)
    out = {}
    for ci, c in enumerate(m["cases"]):
        p = f"c{ci}."
        N = c["num_tokens"]
        g = lambda k: x.put(f.copy(k))
        kv = g(p + "kv_score")
        latent = x.put(np.full((kv.shape[0], 512), BF16_NAN, np.uint16))
        ring = g(p + "ring_in")
        kw = {}
        if R == 2:
            kw = dict(ring=x.strided(ring, (c["ring_blocks"], m["ring_capacity"], 1024), (c["ring_block_stride"], 1024, 1)),
                      qsl=g(p + "qsl"), token_to_req=g(p + "token_to_req"))
        slot_mapping = g(p + ("ring_slots" if R == 2 else "cache_slots"))
        positions = g(p + "positions")
        dsv41kv.fused_save_compress_norm(kv, positions, slot_mapping, g("norm_weight"), m["rms_norm_eps"], latent,
                                         ratio=R, **kw)
        for fm in FORMATS:
            ref = f[p + "cache_" + fm]
            if fm in ("bf16", "fp8"):
                buf = x.put(np.full(ref.shape, bf16_bits if fm == "bf16" else m["canary"], ref.dtype))
                cache = plain_rows(x, buf, c["num_pages"], S, m["plain_page_stride"], m["plain_row_stride"])
            else:
                buf = x.put(np.full(ref.shape, m["canary"], np.uint8))
                cache = buf.reshape(c["num_pages"], -1)
            dsv41kv.rope_quant_insert(latent, positions, g("cos_sin"), g(p + "cache_slots"), cache, cache_format=fm,
                                      states_per_page=S, ratio=R, fp8_scale=float(f["fp8_scale"][0]))
            out[p + "cache_" + fm] = ("BF16" if fm == "bf16" else "U8", buf)
        out[p + "latent_out"] = ("BF16", latent)
        out[p + "ring_out"] = ("F32", ring)
    return host(x, out)


def host(x, out):
    x.sync()
    return {k: (dt, x.get(a)) for k, (dt, a) in out.items()}


def case_cache(x, f, p, c, which):
    fm = c[which + "_record"]
    buf = x.put(f.copy(p + which + "_cache"))
    pages, S, ps = c[which + "_pages"], c[which + "_states_per_page"], c[which + "_page_stride"]
    if fm == "bf16":
        return fm, S, plain_rows(x, buf, pages, S, ps)
    return fm, S, buf.reshape(pages, ps)


def attention_outputs(x, T, H):
    """out bf16 [T, H, 512] and lse f32 [T, H], NaN-filled as the tool's are."""
    return x.put(np.full((T, H, 512), BF16_NAN, np.uint16)), x.put(np.full((T, H), np.nan, np.float32))


def run_decode(f, x=Host):
    out = {}
    for ci, c in enumerate(f.meta["cases"]):
        p = f"c{ci}."
        g = lambda k: x.put(f.copy(k))
        T, H = c["num_tokens"], c["num_heads"]
        with_cmp = c["cmp_record"] is not None
        swa_fm, swa_S, swa = case_cache(x, f, p, c, "swa")
        kw = {}
        if with_cmp:
            cmp_fm, cmp_S, cmp = case_cache(x, f, p, c, "cmp")
            kw = dict(cmp_cache=cmp, cmp_format=cmp_fm, cmp_states_per_page=cmp_S,
                      cmp_indices=g(p + "cmp_indices"), cmp_lens=g(p + "cmp_lens"))
        sched = dsv41kv.plan_decode_schedule("c1a" if with_cmp else "swaonly", T, num_heads=H,
                                             block_size=cmp_S if with_cmp else 64, device=x.device)
        n_ws = dsv41kv.sparse_decode_workspace_floats(sched)
        kw["workspace"] = x.put(np.zeros(n_ws, np.float32)) if n_ws > 0 else None
        o, lse = attention_outputs(x, T, H)
        dsv41kv.sparse_decode(sched, g(p + "q"), swa, g(p + "swa_indices"), g(p + "swa_lens"), g(p + "sink"), o, lse,
                              swa_format=swa_fm, swa_states_per_page=swa_S, softmax_scale=c["softmax_scale"], **kw)
        out[p + "out"] = ("BF16", o)
        out[p + "lse"] = ("F32", lse)
    return host(x, out)


def run_prefill(f, x=Host):
    out = {}
    for ci, c in enumerate(f.meta["cases"]):
        p = f"c{ci}."
        g = lambda k: x.put(f.copy(k))
        T, H = c["num_tokens"], c["num_heads"]
        o, lse = attention_outputs(x, T, H)
        dsv41kv.sparse_prefill(g(p + "q"), g(p + "kv"), g(p + "indices"), g(p + "topk_length"), g(p + "sink"), o, lse,
                               softmax_scale=c["softmax_scale"])
        out[p + "out"] = ("BF16", o)
        out[p + "lse"] = ("F32", lse)
    return host(x, out)


def run_indexer(f, x=Host):
    out = {}
    for ci, c in enumerate(f.meta["cases"]):
        p = f"c{ci}."
        g = lambda k: x.put(f.copy(k))
        T = c["num_tokens"]
        q8 = x.put(np.full((T, 32, 128), 0xA5, np.uint8))
        w = x.put(np.full((T, 32), np.nan, np.float32))
        topk = x.put(np.full((T, 512), -7, np.int32))
        cols = f[p + "scores_ref"].shape[1]
        scores = x.put(np.full((T, cols), np.nan, np.float32)) if cols > 0 else None
        role = c["role"]
        cand = None
        if role == "candidate_source":
            cand = x.put(np.full((T, 2048), -7, np.int32))
        elif role == "candidate_consumer":
            cand = g(p + "candidates")
        positions = g(p + "positions")
        bt = f.copy(p + "block_table")
        ws = x.put(np.zeros(dsv41kv.indexer_topk_workspace_bytes(T, bt.shape[1], c["states_per_page"], role),
                            np.uint8))
        dsv41kv.indexer_prepare_q(g(p + "q"), g(p + "w_raw"), positions, g("cos_sin"), q8, w)
        dsv41kv.indexer_topk(q8, w, positions, g(p + "token_to_req"), g(p + "block_table"),
                             g(p + "k_cache").reshape(c["num_pages"], c["page_stride"]), topk,
                             states_per_page=c["states_per_page"], ratio=c["compress_ratio"], role=role,
                             token_valid=g(p + "token_valid"), candidates=cand, scores=scores, workspace=ws)
        out[p + "q8"] = ("U8", q8)
        out[p + "w"] = ("F32", w)
        out[p + "topk"] = ("I32", topk)
        if role == "candidate_source":
            out[p + "candidates"] = ("I32", cand)
    return host(x, out)


RUN = {"compress_insert": run_compress, "sparse_decode": run_decode, "sparse_prefill": run_prefill,
       "indexer_topk": run_indexer}


def dump_all(conformance_dir, d, x=Host):
    """Runs every file through the API on `x`'s arrays; writes d/<file> as the tool's --dump does."""
    outs = {}
    for name in FILES:
        f = st.File(conformance_dir / name)
        outs[name] = RUN[f.meta["op"]](f, x)
        st.write(d / name.removesuffix(".gz"), outs[name], {"op": f.meta["op"], "cases": f.meta["cases"]})
    return d, outs


def check_read_path(d, conformance_dir):
    """scripts/check-conform-dump.py (the project's independent checker) on a dump: (ok, output)."""
    read = [str(conformance_dir / n) for n in FILES if not n.startswith("compress")]
    script = st.__file__.rsplit("/", 3)[0] + "/scripts/check-conform-dump.py"
    r = subprocess.run([sys.executable, script, str(d), *read], capture_output=True, text=True)
    return r.returncode == 0 and ", 0 failed" in r.stdout.splitlines()[-1], r.stdout[-4000:] + r.stderr[-2000:]


@pytest.fixture(scope="module")
def python_dump(conformance_dir, tmp_path_factory):
    return dump_all(conformance_dir, tmp_path_factory.mktemp("python-dump"))


@pytest.fixture(scope="module")
def cli_dump(conformance_dir, cli, tmp_path_factory):
    if cli is None:
        pytest.skip("the C++ tool is not built (DSV41KV_CLI or build/dsv41kv)")
    d = tmp_path_factory.mktemp("cli-dump")
    r = subprocess.run([cli, "conform", *[str(conformance_dir / n) for n in FILES], "--dump", str(d)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    return d


@pytest.mark.parametrize("name", FILES)
def test_same_bits_as_the_cli(name, python_dump, cli_dump):
    _, outs = python_dump
    ref = st.File(cli_dump / name.removesuffix(".gz"))
    ours = outs[name]
    assert set(ours) <= set(ref.tensors)  # the tool's dump also carries the inputs
    for k, (_, a) in ours.items():
        b = ref[k]
        assert a.size == b.size, k
        assert np.ascontiguousarray(a).tobytes() == b.tobytes(), f"{name} {k} differs from the tool's"


def test_read_path_agreement(python_dump, conformance_dir):
    """The project's independent checker judges the Python outputs against the references."""
    ok, text = check_read_path(python_dump[0], conformance_dir)
    assert ok, text


def bf16(bits):
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def test_write_path_agreement(python_dump, conformance_dir):
    """The write path's rules that need no record decoding (README): ring_out bit for bit, NaN
    reference latent rows untouched, every other latent element within the latent tolerance."""
    _, outs = python_dump
    for name in FILES[:2]:
        f = st.File(conformance_dir / name)
        for ci in range(len(f.meta["cases"])):
            p = f"c{ci}."
            o = outs[name]
            assert o[p + "ring_out"][1].tobytes() == f[p + "ring_out"].tobytes()
            a, b = bf16(o[p + "latent_out"][1]), bf16(f[p + "latent_out"])
            nan_rows = np.isnan(b).all(axis=1)
            assert (o[p + "latent_out"][1][nan_rows] == BF16_NAN).all()
            a, b = a[~nan_rows], b[~nan_rows]
            ulp = np.array([2.0 ** (math.frexp(x)[1] - 8) if x != 0 else 2.0 ** -133 for x in np.abs(b).ravel()]
                           ).reshape(b.shape)
            ok = (np.abs(a - b) <= 1e-6 + np.maximum(0.004 * np.abs(b), ulp)) | (np.isnan(a) & np.isnan(b))
            assert ok.all(), f"{name} {p}latent_out: {(~ok).sum()} elements beyond the tolerance"
