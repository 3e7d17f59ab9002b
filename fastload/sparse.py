"""scipy.sparse matrices as containers, without importing scipy.

A sparse matrix's observations are its rows, as an array's are (a 1-D sparse array's, its
entries). Rows are read with scipy's own indexing, so several observations come back as a
sparse matrix of those rows (of the container's type) and one as scipy gives a row (a
1-row ``csr_matrix``, or a 1-D sparse array for a ``csr_array``). Only the CSR format
indexes rows directly: a matrix in another format is refused with the conversion to use,
rather than converted on every read.

scipy is never imported here: a sparse matrix exists only once scipy was imported.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["is_sparse", "sparse_getobs", "sparse_numobs"]


def is_sparse(data: Any) -> bool:
    """True for a scipy.sparse matrix or array (of any format)."""
    return type(data).__module__.startswith("scipy.sparse") and hasattr(data, "format")


def _rows(data: Any) -> Any:
    if data.format != "csr" or len(data.shape) not in (1, 2):
        raise TypeError(
            f"a scipy.sparse {data.format} container of shape {data.shape} cannot be read by "
            f"rows: convert it once with .tocsr() (a CSR matrix's observations are its rows)"
        )
    return data


def sparse_numobs(data: Any) -> int:
    """The number of rows of ``data``. Raises ``TypeError`` unless it is in CSR format."""
    return int(_rows(data).shape[0])


def sparse_getobs(data: Any, i: int | npt.NDArray[np.int64]) -> Any:
    """Row ``i`` of ``data``, or the rows at the positions ``i`` as a sparse matrix."""
    return _rows(data)[i]
