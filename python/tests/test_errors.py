"""Bad arguments: a wrong dtype is a TypeError, a wrong layout, shape, stride, value or device a
ValueError; each message names the op and the argument (the library's own text for what the
library checks), and no output is touched."""
import ml_dtypes
import numpy as np
import pytest

import dsv41kv

BF16 = ml_dtypes.bfloat16


def insert_case(N=6, S=16, pages=4):
    rng = np.random.default_rng(1)
    latent = rng.standard_normal((N, 512)).astype(BF16)
    positions = np.arange(N, dtype=np.int64)
    table = np.zeros((64, 64), np.float32)
    table[:, :32] = 1.0
    slots = np.array([0, -1, 3, 5, -1, 17], np.int64)[:N]
    cache = np.full((pages, dsv41kv.default_page_stride("v4_584", S)), 165, np.uint8)
    return dict(latent=latent, positions=positions, rope_table=table, slots=slots, cache=cache), S


def call_insert(a, S, **kw):
    args = dict(a)
    args.update(kw)
    dsv41kv.rope_quant_insert(args["latent"], args["positions"], args["rope_table"], args["slots"], args["cache"],
                              cache_format="v4_584", states_per_page=S, ratio=1)


def test_insert_works_and_writes_only_records():
    a, S = insert_case()
    call_insert(a, S)
    written = (a["cache"] != 165).any(axis=1)
    assert written[0] and written[1] and not written[2:].any()


@pytest.mark.parametrize("arg,bad,exc,msg", [
    ("latent", lambda a: a["latent"].astype(np.float32), TypeError, "rope_quant_insert: latent: dtype float32, expected bfloat16"),
    ("positions", lambda a: a["positions"].astype(np.int32), TypeError, "rope_quant_insert: positions: dtype int32, expected int64"),
    ("slots", lambda a: a["slots"].astype(np.float64), TypeError, "rope_quant_insert: slots: dtype float64"),
    ("rope_table", lambda a: a["rope_table"].tolist(), TypeError, "rope_quant_insert: rope_table: list is not an array"),
    ("latent", lambda a: np.ascontiguousarray(a["latent"][:, :256]), ValueError, "latent"),
    ("positions", lambda a: np.repeat(a["positions"], 2)[::2], ValueError, "positions"),
    ("cache", lambda a: a["cache"][:, ::2], ValueError, "rope_quant_insert: cache"),
    ("cache", lambda a: a["cache"].view(np.uint16), TypeError, "rope_quant_insert: cache: dtype uint16, expected uint8"),
    ("slots", lambda a: np.array([0, -1, 3, 5, -1, 64], np.int64), ValueError, "slots"),
    ("latent", lambda a: None, TypeError, "rope_quant_insert: latent: required, got None"),
])
def test_bad_argument_is_refused_and_nothing_written(arg, bad, exc, msg):
    a, S = insert_case()
    before = a["cache"].copy()
    with pytest.raises(exc) as e:
        call_insert(a, S, **{arg: bad(a)})
    assert msg in str(e.value), str(e.value)
    np.testing.assert_array_equal(a["cache"], before)


def test_read_only_output_is_refused():
    a, S = insert_case()
    a["cache"].flags.writeable = False
    with pytest.raises(ValueError, match="rope_quant_insert: cache: a read-only array, expected a writable output"):
        call_insert(a, S)


def test_read_only_input_is_taken():
    a, S = insert_case()
    a["latent"].flags.writeable = False
    call_insert(a, S)


def test_library_message_surfaces_as_value_error():
    t2r = np.full(4, -7, np.int32)
    with pytest.raises(dsv41kv.Error) as e:
        dsv41kv.build_token_to_req(np.array([0, 3, 1], np.int32), t2r)
    assert isinstance(e.value, ValueError)
    assert str(e.value).startswith("E8: build_token_to_req: qsl: qsl[2] = 1 < qsl[1] = 3")
    assert (t2r == -7).all()


def test_non_contiguous_output_is_refused():
    qsl = np.array([0, 2, 3], np.int32)
    out = np.full(8, -7, np.int32)
    with pytest.raises(ValueError, match="build_token_to_req: token_to_req: stride 2, expected contiguous"):
        dsv41kv.build_token_to_req(qsl, out[::2])
    assert (out == -7).all()


def test_bad_format_and_missing_states_per_page():
    a, S = insert_case()
    with pytest.raises(ValueError, match="rope_quant_insert: cache_format"):
        dsv41kv.rope_quant_insert(a["latent"], a["positions"], a["rope_table"], a["slots"], a["cache"],
                                  cache_format="v5_999", states_per_page=S)
    with pytest.raises(ValueError, match="rope_quant_insert: states_per_page: required"):
        dsv41kv.rope_quant_insert(a["latent"], a["positions"], a["rope_table"], a["slots"], a["cache"])


def test_stream_for_host_arrays_is_refused():
    with pytest.raises(ValueError, match="stream"):
        dsv41kv.build_token_to_req(np.array([0, 1], np.int32), np.zeros(1, np.int32), stream=5)


def test_bad_ratio_is_e3():
    a, S = insert_case()
    with pytest.raises(ValueError, match="E3"):
        dsv41kv.rope_quant_insert(a["latent"], a["positions"], a["rope_table"], a["slots"], a["cache"],
                                  states_per_page=S, ratio=3)


def test_cuda_array_in_cpu_build():
    """A DLPack capsule claiming a CUDA device: refused by a CPU-only build before any access."""
    if dsv41kv.built_with_cuda():
        pytest.skip("built with CUDA")

    class FakeCuda:
        def __init__(self, a):
            self.a = a

        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, stream=None):
            assert stream == -1  # CUDA arrays are exported without synchronisation
            return self.a.__dlpack__()

    # The capsule says CPU, the device query CUDA: the capsule's device is what counts; a real
    # CUDA capsule is needed to reach the library's device check, so only the export is checked.
    out = np.zeros(2, np.int32)
    dsv41kv.build_token_to_req(FakeCuda(np.array([0, 2], np.int32)), out)
    assert (out == 0).all()


def prefill_case():
    rng = np.random.default_rng(2)
    T, H, s_kv, K = 2, 8, 16, 8
    return dict(q=rng.standard_normal((T, H, 512)).astype(BF16), kv=rng.standard_normal((s_kv, 512)).astype(BF16),
                indices=rng.integers(0, s_kv, (T, K)).astype(np.int32), topk_length=np.full(T, K, np.int32),
                sink=np.zeros(H, np.float32), out=np.full((T, H, 512), 3, np.uint16),
                lse=np.full((T, H), -7.0, np.float32))


ORDER = ["q", "kv", "indices", "topk_length", "sink", "out", "lse"]


@pytest.mark.parametrize("arg", ORDER)
@pytest.mark.parametrize("what", ["dtype", "shape", "stride"])
def test_every_sparse_prefill_argument(arg, what):
    """Each argument of one op made wrong in turn: the message names the op and that argument, and
    neither output is touched."""
    a = prefill_case()
    v = a[arg]
    if what == "dtype":
        a[arg] = v.astype(np.float64) if v.dtype != np.float64 else v.astype(np.float32)
        exc = TypeError
    elif what == "shape":
        a[arg] = v[0] if v.ndim > 1 else np.zeros(0, v.dtype)  # one rank less, or empty
        exc = ValueError
    else:
        wide = np.zeros(v.shape[:-1] + (2 * v.shape[-1],), v.dtype)
        a[arg] = wide[..., ::2]
        exc = ValueError
    out_before, lse_before = a["out"].copy(), a["lse"].copy()
    with pytest.raises(exc) as e:
        dsv41kv.sparse_prefill(*[a[k] for k in ORDER])
    assert "sparse_prefill" in str(e.value) and arg in str(e.value), str(e.value)
    if arg != "out":
        assert (a["out"] == out_before).all()
    if arg != "lse":
        assert (a["lse"] == lse_before).all()
