"""dsv41kv: DeepSeek-V4.1's compressed-KV attention path over caller-owned arrays.

Every op takes numpy / torch / cupy arrays through DLPack without copying them and writes its
outputs in place (docs/python.md). bf16 travels as bfloat16 or uint16 bits, e4m3 as
float8_e4m3fn or uint8 codes. Bad arguments raise TypeError (dtype, not an array) or
ValueError (layout, shape, values: the library's message, dsv41kv.Error) before anything is
written. `import dsv41kv.torch` registers torch.ops.dsv41kv.*; `dsv41kv.flash_mla` is a
FlashMLA-compatible entry point.
"""
from ._core import *  # noqa: F401,F403
from ._core import Error, __doc__ as _core_doc  # noqa: F401

__version__ = "0.1.0"
