"""A small safetensors reader and writer over numpy (the tests' own; the format of SPEC 10)."""
import gzip
import json
import struct

import numpy as np

_DT = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32, "U8": np.uint8,
       "BF16": np.uint16, "I16": np.int16, "U16": np.uint16, "F16": np.float16}
_NAME = {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64", np.dtype(np.int32): "I32",
         np.dtype(np.uint8): "U8"}


class File:
    """Tensors (bf16 as uint16 bits) and the metadata of one file (.safetensors or .gz)."""

    def __init__(self, path):
        raw = (gzip.open if str(path).endswith(".gz") else open)(path, "rb").read()
        (n,) = struct.unpack("<Q", raw[:8])
        head = json.loads(raw[8:8 + n])
        meta = head.pop("__metadata__", {})
        self.meta = json.loads(meta["dsv41"]) if "dsv41" in meta else meta
        self.dtypes = {}
        self.tensors = {}
        body = memoryview(raw)[8 + n:]
        for k, v in head.items():
            a, b = v["data_offsets"]
            self.dtypes[k] = v["dtype"]
            self.tensors[k] = np.frombuffer(body[a:b], dtype=_DT[v["dtype"]]).reshape(v["shape"])

    def __contains__(self, k):
        return k in self.tensors

    def __getitem__(self, k):
        return self.tensors[k]

    def copy(self, k):
        return np.array(self.tensors[k])


def write(path, tensors, meta):
    """tensors: name -> (safetensors dtype, array)."""
    head, off, blobs = {}, 0, []
    for k, (dt, a) in tensors.items():
        b = np.ascontiguousarray(a).tobytes()
        head[k] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    head["__metadata__"] = {"dsv41": json.dumps(meta)}
    h = json.dumps(head).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)
