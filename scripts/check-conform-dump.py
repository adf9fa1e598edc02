#!/usr/bin/env python3
"""Independent check of `dsv41kv conform --dump DIR` outputs against the read-path references.

  scripts/check-conform-dump.py DUMP_DIR INPUT_FILE...

For every input file (a read-path conformance file of shared/conformance: `op` sparse_decode,
sparse_prefill or indexer_topk; .safetensors or .safetensors.gz) the dump
DUMP_DIR/<input name without .gz> is opened and each case's outputs are checked against the
INPUT file's references (the copies of the references inside the dump are not used) with the
rules of shared/conformance/README.md, "What agreement means (read path)":

  attention (c{i}.out bf16 [T,H,512], c{i}.lse f32 [T,H]):
    out  every element |o - o_ref| <= 4e-3 + 1e-2 |o_ref| (non-finite reference positions must be
         identical); cosine of every (token, head) row whose reference is non-zero >= 1 - 1e-5;
         rows whose reference is all zero are exactly zero (+0 or -0)
    lse  +inf exactly on the rows where lse_ref is +inf, elsewhere |l - l_ref| <= 1e-3 + 1e-4 |l_ref|
  indexer (c{i}.q8 u8 [T,32,128], c{i}.w f32 [T,32], c{i}.topk i32 [T,512], and
  c{i}.candidates i32 [T,2048] for role candidate_source):
    q8   byte for byte equal to q8_ref
    w    bit for bit equal to w_ref
    topk every row a valid prefix (entries >= 0, strictly ascending, then -1 to the end) of the
         length of topk_ref's prefix, with the same set as topk_ref except entries whose reference
         score (scores_ref) lies within the SPEC 8.8 tolerance of the selection boundary (the smallest
         reference score in topk_ref's set)
    candidates likewise over blocks of candidate_block_size entries: block score = max of the
         reference scores of its visible entries (i < n_c = (p + 1) // r), the newest block
         (n_c - 1) // 8 +inf (SPEC 8.7)

SPEC 8.8 tolerance of entry i for token t (binary64):
    tol(t, i) = 1e-5 * sum_h |w_ref[t,h]| * sum_d |q8[t,h,d] * k8[i,d]| * sk[i]
with q8 the decoded e4m3 codes of q8_ref (SPEC 2.2), k8 / sk the decoded e4m3 values and the fp32
scale of entry i in k_cache (SPEC 3.5: page = block_table[req][i // S], values at
page*page_stride + (i % S)*128 + d, scale at page*page_stride + S*128 + (i % S)*4). A set
difference is accepted for entry j when |score(j) - boundary| <= tol(j) + tol(boundary entry)
(both scores may move by their tolerance; for a block, tol = the largest tol of its entries).
As a check of the k_cache reading, the score of every row's boundary entry is recomputed from
q8_ref, w_ref and k_cache (SPEC 8.3) and must agree with scores_ref within its tolerance.

Write-path files (op compress_insert) are skipped with a note. Output: one line per case and
check, `<file> c<i> <name> <what> PASS|FAIL <figures>`, then `N passed, M failed`. Exit status 0
when every check passes, 1 when one fails, 2 on bad usage or an unreadable / malformed file
(message on stderr; the other files are still checked). Python 3 standard library only.
"""
import argparse
import array
import gzip
import json
import math
import os
import struct
import sys
from operator import mul, sub


class BadFile(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# safetensors

# dtype -> (bytes per element, array typecode or None)
DTYPES = {
    "BOOL": (1, "B"), "U8": (1, "B"), "I8": (1, "b"), "U16": (2, "H"), "I16": (2, "h"),
    "F16": (2, None), "BF16": (2, "H"), "U32": (4, "I"), "I32": (4, "i"), "F32": (4, "f"),
    "U64": (8, "Q"), "I64": (8, "q"), "F64": (8, "d"), "F8_E4M3": (1, "B"), "F8_E5M2": (1, "B"),
}
for _code, _size in (("b", 1), ("B", 1), ("h", 2), ("H", 2), ("i", 4), ("I", 4), ("q", 8), ("Q", 8), ("f", 4), ("d", 8)):
    if array.array(_code).itemsize != _size:
        sys.exit(f"check-conform-dump: array typecode {_code!r} is not {_size} bytes on this platform")


class Safetensors:
    """A whole safetensors file (plain or gzip, detected by its magic bytes), validated."""

    def __init__(self, path):
        self.path = path
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as e:
            raise BadFile(f"{path}: cannot read: {e.strerror or e}")
        if raw[:2] == b"\x1f\x8b":
            try:
                raw = gzip.decompress(raw)
            except (OSError, EOFError, ValueError) as e:
                raise BadFile(f"{path}: bad gzip stream: {e}")
        if len(raw) < 8:
            raise BadFile(f"{path}: shorter than the 8-byte header length")
        (n,) = struct.unpack_from("<Q", raw, 0)
        if n > len(raw) - 8:
            raise BadFile(f"{path}: header length {n} beyond the file ({len(raw)} bytes)")
        try:
            header = json.loads(raw[8:8 + n].decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise BadFile(f"{path}: header is not JSON: {e}")
        if not isinstance(header, dict):
            raise BadFile(f"{path}: header is not a JSON object")
        self.data = memoryview(raw)[8 + n:]
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict):
            raise BadFile(f"{path}: __metadata__ is not an object")
        self.meta = None
        if "dsv41" in meta:
            try:
                self.meta = json.loads(meta["dsv41"])
            except (TypeError, ValueError) as e:
                raise BadFile(f"{path}: __metadata__.dsv41 is not a JSON string: {e}")
            if not isinstance(self.meta, dict):
                raise BadFile(f"{path}: __metadata__.dsv41 is not a JSON object")
        self.tensors = {}
        for name, t in header.items():
            try:
                dtype, shape, (b, e) = t["dtype"], [int(s) for s in t["shape"]], t["data_offsets"]
            except (KeyError, TypeError, ValueError):
                raise BadFile(f"{path}: tensor {name}: bad header entry")
            if dtype not in DTYPES:
                raise BadFile(f"{path}: tensor {name}: unknown dtype {dtype}")
            if not (isinstance(b, int) and isinstance(e, int) and 0 <= b <= e <= len(self.data)):
                raise BadFile(f"{path}: tensor {name}: data offsets [{b}, {e}) outside the data area ({len(self.data)} bytes)")
            if any(s < 0 for s in shape) or math.prod(shape) * DTYPES[dtype][0] != e - b:
                raise BadFile(f"{path}: tensor {name}: {e - b} bytes for {dtype} {shape}")
            self.tensors[name] = (dtype, shape, b, e)

    def has(self, name):
        return name in self.tensors

    def info(self, name, dtype=None, shape=None):
        if name not in self.tensors:
            raise BadFile(f"{self.path}: tensor {name} missing")
        dt, sh, b, e = self.tensors[name]
        if dtype is not None and dt not in (dtype if isinstance(dtype, tuple) else (dtype,)):
            raise BadFile(f"{self.path}: tensor {name}: dtype {dt}, expected {dtype}")
        if shape is not None:
            if len(shape) != len(sh) or any(x is not None and x != y for x, y in zip(shape, sh)):
                want = "[" + ", ".join("*" if x is None else str(x) for x in shape) + "]"
                raise BadFile(f"{self.path}: tensor {name}: shape {sh}, expected {want}")
        return dt, sh, b, e

    def raw(self, name, dtype=None, shape=None):
        """The tensor's bytes (a bytes object) and its shape."""
        _, sh, b, e = self.info(name, dtype, shape)
        return bytes(self.data[b:e]), sh

    def values(self, name, dtype=None, shape=None):
        """The tensor's elements as a flat array (bf16 widened to f32, exactly) and its shape."""
        dt, sh, b, e = self.info(name, dtype, shape)
        buf = self.data[b:e]
        if dt == "BF16":
            wide = bytearray(2 * len(buf))  # fp32 little-endian: bf16 bits in the top half
            wide[2::4] = buf[0::2]
            wide[3::4] = buf[1::2]
            a = array.array("f")
            a.frombytes(wide)
        else:
            code = DTYPES[dt][1]
            if code is None:
                raise BadFile(f"{self.path}: tensor {name}: dtype {dt} not supported here")
            a = array.array(code)
            a.frombytes(buf)
        if sys.byteorder == "big" and a.itemsize > 1:
            a.byteswap()
        return a, sh


# ---------------------------------------------------------------------------------------------
# number formats


def e4m3_decode(b):
    """SPEC 2.2: s eeee mmm, bias 7; E = 0 subnormal M * 2^-9; 0x7F / 0xFF NaN."""
    s = -1.0 if b & 0x80 else 1.0
    e, m = (b >> 3) & 15, b & 7
    if e == 15 and m == 7:
        return math.nan
    if e == 0:
        return s * m * 2.0 ** -9
    return s * 2.0 ** (e - 7) * (1.0 + m / 8.0)


E4M3 = [e4m3_decode(b) for b in range(256)]
E4M3_ABS = [abs(v) for v in E4M3]


def fmt(x):
    return f"{x:.3g}" if math.isfinite(x) else str(x)


# ---------------------------------------------------------------------------------------------
# checks; each returns (pass, figures)


def check_out(out, ref, T, H, D):
    """Attention output: element bound, row cosine, zero rows exactly zero."""
    rows = T * H
    zero_rows = bad_zero_rows = beyond = bad_nonfinite = bad_cos = 0
    max_abs = max_ratio = 0.0
    min_cos = 1.0
    first_bad = None
    isfinite = math.isfinite
    for r in range(rows):
        o = out[r * D:(r + 1) * D]
        g = ref[r * D:(r + 1) * D]
        row_bad = False
        if not all(map(isfinite, g)):
            # non-finite reference positions must be identical; compare the finite ones as usual
            for a, b in zip(o, g):
                if not isfinite(b) and not (a == b or (a != a and b != b)):
                    bad_nonfinite += 1
                    row_bad = True
            pairs = [(a, b) for a, b in zip(o, g) if isfinite(b)]
            o = [a for a, _ in pairs]
            g = [b for _, b in pairs]
        if not any(g):  # every reference element is +-0: the row must be exactly zero
            zero_rows += 1
            if any(o) or not all(map(isfinite, o)):
                bad_zero_rows += 1
                row_bad = True
            if row_bad and first_bad is None:
                first_bad = r
            continue
        err = list(map(abs, map(sub, o, g)))
        m = max(err) if err else 0.0
        if not m <= max_abs:  # NaN propagates into max_abs
            max_abs = m
        n_beyond = 0
        for e, b in zip(err, g):
            bound = 4e-3 + 1e-2 * abs(b)
            q = e / bound
            if not q <= max_ratio:
                max_ratio = q
            if not e <= bound:
                n_beyond += 1
        beyond += n_beyond
        dot = sum(map(mul, o, g))
        no = sum(map(mul, o, o))
        ng = sum(map(mul, g, g))
        cos = dot / math.sqrt(no * ng) if no > 0 and ng > 0 and isfinite(no) else (math.nan if not isfinite(no) else 0.0)
        if not cos >= min_cos:
            min_cos = cos
        if not cos >= 1.0 - 1e-5:
            bad_cos += 1
            row_bad = True
        if n_beyond:
            row_bad = True
        if row_bad and first_bad is None:
            first_bad = r
    ok = beyond == 0 and bad_cos == 0 and bad_zero_rows == 0 and bad_nonfinite == 0
    figs = (f"rows {rows} ({zero_rows} zero): {beyond} elements beyond 4e-3 + 1e-2|ref| "
            f"(max abs err {fmt(max_abs)}, max err/bound {fmt(max_ratio)}), "
            f"{bad_cos} rows with cosine < 1 - 1e-5 (min cosine 1 - {fmt(1.0 - min_cos)}), "
            f"{bad_zero_rows} zero-reference rows not exactly zero")
    if bad_nonfinite:
        figs += f", {bad_nonfinite} non-finite reference positions differ"
    if first_bad is not None:
        figs += f"; first bad row: token {first_bad // H} head {first_bad % H}"
    return ok, figs


def check_lse(lse, ref, T, H):
    inf_rows = bad_inf = beyond = 0
    max_abs = 0.0
    first_bad = None
    for r, (a, b) in enumerate(zip(lse, ref)):
        bad = False
        if b == math.inf:
            inf_rows += 1
            bad = a != math.inf
            bad_inf += bad
        elif not math.isfinite(b):  # -inf or NaN in the reference: identical
            bad = not (a == b or (a != a and b != b))
            beyond += bad
        elif a == math.inf:
            bad = True
            bad_inf += 1
        else:
            e = abs(a - b)
            if not e <= max_abs:
                max_abs = e
            bad = not e <= 1e-3 + 1e-4 * abs(b)
            beyond += bad
        if bad and first_bad is None:
            first_bad = r
    ok = bad_inf == 0 and beyond == 0
    figs = (f"rows {T * H} ({inf_rows} +inf): {bad_inf} rows differ in +inf, "
            f"{beyond} beyond 1e-3 + 1e-4|ref| (max abs err {fmt(max_abs)})")
    if first_bad is not None:
        figs += f"; first bad row: token {first_bad // H} head {first_bad % H}"
    return ok, figs


def prefix_len(row, what, where):
    """Length of the reference row's valid prefix (entries >= 0 then -1 to the end)."""
    n = 0
    while n < len(row) and row[n] >= 0:
        n += 1
    if any(x != -1 for x in row[n:]):
        raise BadFile(f"{where}: {what} is not a valid prefix followed by -1")
    return n


def compare_sets(got, ref, score, tol):
    """One row: (status, n_diff, max accepted |score - boundary| / tolerance).
    status: 'same', 'accepted', 'prefix' (not a sorted valid prefix of the reference's length),
    'set' (a difference outside the tolerance)."""
    L = prefix_len(ref, "reference row", "reference")  # validated by the caller already
    head = got[:L]
    if any(x < 0 for x in head) or any(x != -1 for x in got[L:]) or any(b <= a for a, b in zip(head, head[1:])):
        return "prefix", 0, 0.0
    rs, gs = set(ref[:L]), set(head)
    if rs == gs:
        return "same", 0, 0.0
    diff = (rs - gs) | (gs - rs)
    boundary = min(score(j) for j in rs)
    tols_b = [tol(j) for j in rs if score(j) == boundary]
    tol_b = math.nan if any(x is None for x in tols_b) else max(tols_b)  # NaN: nothing is accepted
    worst = 0.0
    for j in diff:
        s, tj = score(j), tol(j)
        if s is None or tj is None or not math.isfinite(s) or not math.isfinite(boundary):
            return "set", len(diff), math.inf
        d = abs(s - boundary)
        allowed = tj + tol_b
        if not d <= allowed:
            return "set", len(diff), math.inf
        worst = max(worst, d / allowed if allowed > 0 else 0.0)
    return "accepted", len(diff), worst


class IndexerCase:
    """Reference data of one indexer case, with the SPEC 8.8 tolerance and SPEC 8.3 scores."""

    def __init__(self, f, p, c, fm):
        self.T = T = int(c["num_tokens"])
        self.NH, self.HD = int(fm["index_n_heads"]), int(fm["index_head_dim"])
        self.K, self.NB = int(fm["index_topk"]), int(fm["candidate_topk_blocks"])
        self.BS = int(fm["candidate_block_size"])
        self.r, self.S = int(c["compress_ratio"]), int(c["states_per_page"])
        self.page_stride, self.num_pages = int(c["page_stride"]), int(c["num_pages"])
        self.q8_ref, _ = f.raw(p + "q8_ref", "U8", [T, self.NH, self.HD])
        self.w_ref_bytes, _ = f.raw(p + "w_ref", "F32", [T, self.NH])
        self.w_ref, _ = f.values(p + "w_ref", "F32", [T, self.NH])
        self.scores, sh = f.values(p + "scores_ref", "F32", [T, None])
        self.width = sh[1]
        self.topk_ref, _ = f.values(p + "topk_ref", "I32", [T, self.K])
        self.positions, _ = f.values(p + "positions", ("I64", "I32"), [T])
        self.token_to_req, _ = f.values(p + "token_to_req", "I32", [T])
        self.block_table, bt = f.values(p + "block_table", "I32", [None, None])
        self.bt_cols = bt[1]
        self.k_cache, _ = f.raw(p + "k_cache", "U8", [self.num_pages * self.page_stride])
        self.acc = {}
        self.where = f"{f.path}: {p[:-1]}"

    def row_scores(self, t):
        return self.scores[t * self.width:(t + 1) * self.width]

    def a(self, t):
        """a[d] = sum_h |w[t,h]| * |q8[t,h,d]| (binary64)."""
        if t not in self.acc:
            NH, HD = self.NH, self.HD
            acc = [0.0] * HD
            for h in range(NH):
                w = abs(self.w_ref[t * NH + h])
                base = (t * NH + h) * HD
                codes = self.q8_ref[base:base + HD]
                acc = [x + w * E4M3_ABS[q] for x, q in zip(acc, codes)]
            self.acc[t] = acc
        return self.acc[t]

    def key(self, t, i):
        """(decoded e4m3 values, fp32 scale) of compressed entry i for token t's request, or None."""
        req = self.token_to_req[t]
        blk = i // self.S
        if not (0 <= req < len(self.block_table) // max(self.bt_cols, 1) and 0 <= blk < self.bt_cols):
            return None
        page = self.block_table[req * self.bt_cols + blk]
        if not 0 <= page < self.num_pages:
            return None
        base, s = page * self.page_stride, i % self.S
        vals = self.k_cache[base + s * self.HD:base + (s + 1) * self.HD]
        (sk,) = struct.unpack_from("<f", self.k_cache, base + self.S * self.HD + 4 * s)
        return vals, sk

    def tol(self, t, i):
        k = self.key(t, i)
        if k is None:
            return None
        vals, sk = k
        return 1e-5 * abs(sk) * sum(x * E4M3_ABS[v] for x, v in zip(self.a(t), vals))

    def score(self, t, i):
        """SPEC 8.3 in binary64 from q8_ref, w_ref and k_cache."""
        k = self.key(t, i)
        if k is None:
            return None
        vals, sk = k
        kd = [E4M3[v] for v in vals]
        NH, HD = self.NH, self.HD
        total = 0.0
        for h in range(NH):
            base = (t * NH + h) * HD
            d = sum(E4M3[q] * x for q, x in zip(self.q8_ref[base:base + HD], kd))
            total += self.w_ref[t * NH + h] * max(0.0, d) * sk
        return total

    def n_c(self, t):
        return (int(self.positions[t]) + 1) // self.r


def check_q8(got, ref, T, NH):
    n = sum(1 for a, b in zip(got, ref) if a != b)
    return n == 0, f"{len(ref)} e4m3 codes of {T} tokens x {NH} heads: {n} differ"


def check_w(got, ref):
    g = array.array("I")
    g.frombytes(got)
    r = array.array("I")
    r.frombytes(ref)
    n = sum(1 for a, b in zip(g, r) if a != b)
    return n == 0, f"{len(r)} folded weights: {n} differ in their bits"


def check_topk(ic, got):
    K = ic.K
    same = accepted = bad_prefix = bad_set = diff_entries = 0
    worst = 0.0
    first_bad = None
    max_recheck = 0.0
    bad_recheck = 0
    for t in range(ic.T):
        ref_row = list(ic.topk_ref[t * K:(t + 1) * K])
        got_row = list(got[t * K:(t + 1) * K])
        srow = ic.row_scores(t)
        W = ic.width
        L = prefix_len(ref_row, f"topk_ref row {t}", ic.where)
        if any(j >= W for j in ref_row[:L]):
            raise BadFile(f"{ic.where}: topk_ref row {t}: an index beyond scores_ref's width {W}")
        if L:
            # the k_cache reading behind the tolerance: the boundary entry's score reproduced
            b = min(ref_row[:L], key=lambda j: (srow[j], j))
            s, tb = ic.score(t, b), ic.tol(t, b)
            if s is None or tb is None or not abs(s - srow[b]) <= tb:
                bad_recheck += 1
            elif tb > 0:
                max_recheck = max(max_recheck, abs(s - srow[b]) / tb)

        def score(j, srow=srow, W=W):
            return srow[j] if 0 <= j < W else None

        status, nd, w = compare_sets(got_row, ref_row, score, lambda j, t=t: ic.tol(t, j))
        if status == "same":
            same += 1
        elif status == "accepted":
            accepted += 1
            diff_entries += nd
            worst = max(worst, w)
        else:
            bad_prefix += status == "prefix"
            bad_set += status == "set"
            diff_entries += nd
            if first_bad is None:
                first_bad = t
    ok = bad_prefix == 0 and bad_set == 0 and bad_recheck == 0
    figs = (f"{ic.T} rows: {same} identical sets, {accepted} differ within the SPEC 8.8 boundary tolerance "
            f"({diff_entries} entries differ, max |score - boundary| / tolerance {fmt(worst)}), "
            f"{bad_prefix} not a sorted valid prefix of the reference's length, {bad_set} differ beyond tolerance; "
            f"boundary scores recomputed from q8_ref/w_ref/k_cache: {bad_recheck} beyond tolerance "
            f"(max |delta| / tolerance {fmt(max_recheck)})")
    if first_bad is not None:
        figs += f"; first bad row: token {first_bad}"
    return ok, figs


def check_candidates(ic, got, ref):
    NB, BS = ic.NB, ic.BS
    same = accepted = bad_prefix = bad_set = diff_entries = 0
    worst = 0.0
    first_bad = None
    for t in range(ic.T):
        ref_row = list(ref[t * NB:(t + 1) * NB])
        got_row = list(got[t * NB:(t + 1) * NB])
        srow = ic.row_scores(t)
        n_c = min(ic.n_c(t), ic.width)
        nblocks = (n_c + BS - 1) // BS
        newest = (n_c - 1) // BS if n_c > 0 else -1
        L = prefix_len(ref_row, f"candidates_ref row {t}", ic.where)
        if any(b >= nblocks for b in ref_row[:L]):
            raise BadFile(f"{ic.where}: candidates_ref row {t}: a block beyond the {nblocks} blocks of n_c = {n_c}")

        def bscore(b, srow=srow, n_c=n_c, nblocks=nblocks, newest=newest):
            if not 0 <= b < nblocks:
                return None
            if b == newest:
                return math.inf
            return max(srow[i] for i in range(b * BS, min(b * BS + BS, n_c)))

        def btol(b, t=t, n_c=n_c, nblocks=nblocks, newest=newest):
            if not 0 <= b < nblocks:
                return None
            if b == newest:
                return 0.0
            ts = [ic.tol(t, i) for i in range(b * BS, min(b * BS + BS, n_c))]
            return None if any(x is None for x in ts) else max(ts)

        status, nd, w = compare_sets(got_row, ref_row, bscore, btol)
        if status == "same":
            same += 1
        elif status == "accepted":
            accepted += 1
            diff_entries += nd
            worst = max(worst, w)
        else:
            bad_prefix += status == "prefix"
            bad_set += status == "set"
            diff_entries += nd
            if first_bad is None:
                first_bad = t
    ok = bad_prefix == 0 and bad_set == 0
    figs = (f"{ic.T} rows: {same} identical sets, {accepted} differ within the SPEC 8.8 boundary tolerance "
            f"({diff_entries} blocks differ, max |score - boundary| / tolerance {fmt(worst)}), "
            f"{bad_prefix} not a sorted valid prefix of the reference's length, {bad_set} differ beyond tolerance")
    if first_bad is not None:
        figs += f"; first bad row: token {first_bad}"
    return ok, figs


# ---------------------------------------------------------------------------------------------
# files


def check_file(dump_dir, path, report):
    base = os.path.basename(path)
    if base.endswith(".gz"):
        base = base[:-3]
    label = base[:-len(".safetensors")] if base.endswith(".safetensors") else base
    f = Safetensors(path)
    if f.meta is None:
        raise BadFile(f"{path}: no __metadata__.dsv41")
    op = f.meta.get("op")
    if op == "compress_insert":
        print(f"{label}: skipped (op compress_insert is a write-path file; this script checks the read path)")
        return
    if op not in ("sparse_decode", "sparse_prefill", "indexer_topk"):
        raise BadFile(f"{path}: unknown op {op!r}")
    cases = f.meta.get("cases")
    if not isinstance(cases, list):
        raise BadFile(f"{path}: metadata has no list 'cases'")
    dump_path = os.path.join(dump_dir, base)
    d = Safetensors(dump_path)
    if d.meta is not None and d.meta.get("op", op) != op:
        raise BadFile(f"{dump_path}: op {d.meta.get('op')!r}, the input's is {op!r}")
    try:
        for i, c in enumerate(cases):
            p = f"c{i}."
            name = str(c.get("name", f"c{i}"))
            head = f"{label} c{i} {name}"
            if op in ("sparse_decode", "sparse_prefill"):
                T, H = int(c["num_tokens"]), int(c["num_heads"])
                ref, sh = f.values(p + "out_ref", "F32", [T, H, None])
                D = sh[2]
                out, _ = d.values(p + "out", "BF16", [T, H, D])
                lse_ref, _ = f.values(p + "lse_ref", "F32", [T, H])
                lse, _ = d.values(p + "lse", "F32", [T, H])
                report(head, "out", *check_out(out, ref, T, H, D))
                report(head, "lse", *check_lse(lse, lse_ref, T, H))
            else:
                ic = IndexerCase(f, p, c, f.meta)
                q8, _ = d.raw(p + "q8", "U8", [ic.T, ic.NH, ic.HD])
                w, _ = d.raw(p + "w", "F32", [ic.T, ic.NH])
                topk, _ = d.values(p + "topk", "I32", [ic.T, ic.K])
                report(head, "q8", *check_q8(q8, ic.q8_ref, ic.T, ic.NH))
                report(head, "w", *check_w(w, ic.w_ref_bytes))
                report(head, "topk", *check_topk(ic, topk))
                if c.get("role") == "candidate_source":
                    cref, _ = f.values(p + "candidates_ref", "I32", [ic.T, ic.NB])
                    cand, _ = d.values(p + "candidates", "I32", [ic.T, ic.NB])
                    report(head, "candidates", *check_candidates(ic, cand, cref))
    except (KeyError, TypeError, ValueError) as e:
        raise BadFile(f"{path}: case metadata: {type(e).__name__}: {e}")


def main(argv):
    ap = argparse.ArgumentParser(
        prog="check-conform-dump.py",
        description="Check `dsv41kv conform --dump DIR` outputs against the read-path references "
                    "with the rules of shared/conformance/README.md (independent of the project's code).")
    ap.add_argument("dump_dir", metavar="DUMP_DIR", help="the folder given to `dsv41kv conform --dump`")
    ap.add_argument("inputs", metavar="INPUT_FILE", nargs="+", help="conformance files (.safetensors or .safetensors.gz)")
    args = ap.parse_args(argv)  # bad usage: argparse exits 2
    if not os.path.isdir(args.dump_dir):
        print(f"check-conform-dump: {args.dump_dir}: not a folder", file=sys.stderr)
        return 2
    passed = failed = 0
    bad = False

    def report(head, what, ok, figs):
        nonlocal passed, failed
        print(f"{head} {what} {'PASS' if ok else 'FAIL'} {figs}", flush=True)
        if ok:
            passed += 1
        else:
            failed += 1

    for path in args.inputs:
        try:
            check_file(args.dump_dir, path, report)
        except BadFile as e:
            print(f"check-conform-dump: {e}", file=sys.stderr)
            bad = True
    print(f"{passed} passed, {failed} failed")
    return 2 if bad else (1 if failed else 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
