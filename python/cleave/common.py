"""Flower's ``flwr.common`` conversions that client and strategy code calls, with
Flower's meaning: ``Parameters`` holds each array serialized as ``numpy.save`` writes it
(``tensor_type`` "numpy.ndarray"), so code written against Flower that calls
``ndarrays_to_parameters`` / ``parameters_to_ndarrays`` runs unchanged."""

import io
from dataclasses import dataclass, field
from typing import List

import numpy as np

NDArray = np.ndarray
NDArrays = List[np.ndarray]


@dataclass
class Parameters:
    """Model parameters as serialized arrays, as Flower's ``flwr.common.Parameters``."""

    tensors: List[bytes] = field(default_factory=list)
    tensor_type: str = "numpy.ndarray"


def ndarray_to_bytes(ndarray: NDArray) -> bytes:
    """``ndarray`` in NumPy's .npy format (no pickles)."""
    out = io.BytesIO()
    np.save(out, ndarray, allow_pickle=False)
    return out.getvalue()


def bytes_to_ndarray(tensor: bytes) -> NDArray:
    """The array ``ndarray_to_bytes`` wrote (no pickles)."""
    return np.load(io.BytesIO(tensor), allow_pickle=False)


def ndarrays_to_parameters(ndarrays: NDArrays) -> Parameters:
    return Parameters(tensors=[ndarray_to_bytes(a) for a in ndarrays], tensor_type="numpy.ndarray")


def parameters_to_ndarrays(parameters: Parameters) -> NDArrays:
    if parameters.tensor_type != "numpy.ndarray":
        raise ValueError(f"parameters of tensor_type {parameters.tensor_type!r}; only numpy.ndarray is read")
    return [bytes_to_ndarray(t) for t in parameters.tensors]
