"""The dtypes a raw tensor may have, and their item sizes (``docs/format.md`` section 4.1).

A raw tensor's bytes are its elements. Only the dtypes of this table are raw: each element is
whole bytes that a reader copies without interpreting them. Everything else (quantized dtypes,
and any dtype a later torch adds) is stored through ``torch.save``. A reader checks a raw
entry's dtype against this table before it touches a byte, so a crafted manifest cannot make
torch reinterpret memory as a dtype whose elements are not plain bytes.
"""

from __future__ import annotations

import re

#: dtype name -> bytes per element, for raw tensors (format versions 1 to 3).
RAW_ITEMSIZE: dict[str, int] = {
    "bool": 1,
    "uint8": 1,
    "int8": 1,
    "uint16": 2,
    "int16": 2,
    "uint32": 4,
    "int32": 4,
    "uint64": 8,
    "int64": 8,
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float64": 8,
    "complex32": 4,
    "complex64": 8,
    "complex128": 16,
    "float8_e4m3fn": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2": 1,
    "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1,
    "float4_e2m1fn_x2": 1,
    "bits8": 1,
    "bits1x8": 1,
    "bits2x4": 1,
    "bits4x2": 1,
    "bits16": 2,
    **{f"uint{bits}": 1 for bits in range(1, 8)},
    **{f"int{bits}": 1 for bits in range(1, 8)},
}

#: A torch dtype name as the manifest spells it (``str(dtype)`` without ``torch.``).
DTYPE_NAME = re.compile(r"[a-z][a-z0-9_]{0,47}")

#: Largest dimension and element count torch can index (a signed 64-bit count).
MAX_NUMEL = 2**63 - 1
