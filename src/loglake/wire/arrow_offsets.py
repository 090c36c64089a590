"""The value offsets of an Arrow variable-length array, as numpy and without a copy.

Why: the sds, archives and pipeline kernels read string, binary and list columns through their
offsets (lengths, slices, a C kernel's inputs), and pyarrow gives ``offsets`` only for list
arrays (not for strings or binaries). Each part had grown its own ``np.frombuffer`` of the
offsets buffer, each minding the array's slice offset and the large types in its own way; this
is the one way, in the shared layer because Arrow's columnar layout is a byte format too.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_LARGE = (pa.types.is_large_string, pa.types.is_large_binary, pa.types.is_large_list)


def value_offsets(arr: pa.Array) -> np.ndarray:
    """The ``len(arr) + 1`` offsets of a string, binary or list array (int32; int64 for the
    large types) from its slice offset on: a view of its offsets buffer (not to be written to),
    or zeros where it has none (an array imported from elsewhere may come without one)."""
    dtype = np.int64 if any(is_large(arr.type) for is_large in _LARGE) else np.int32
    n = len(arr)
    buf = arr.buffers()[1]
    if buf is None:
        return np.zeros(n + 1, dtype=dtype)
    return np.frombuffer(buf, dtype=dtype, count=arr.offset + n + 1)[arr.offset :]
