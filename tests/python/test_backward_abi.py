"""kla_chunk_backward's C ABI on the CPU: the struct, its validation (host-only, no GPU) and the
workspace size. The kernels themselves are tested on the GPU (tests/cuda/test_backward.cpp,
test_gpu.py)."""
import ctypes

import pytest
import torch

from kla import _params as P


def _backward_params(lib, *, B=1, T=100, H=2, HV=4, K=64, V=64, g=True, eta=True):
    """CPU tensors stand in for device memory: validation reads addresses and sizes only."""
    t = {"q": torch.zeros(B, T, H, K), "k": torch.zeros(B, T, H, K), "v": torch.zeros(B, T, HV, V),
         "do": torch.zeros(B, T, HV, V), "dq": torch.zeros(B, T, H, K),
         "dk": torch.zeros(B, T, H, K), "dv": torch.zeros(B, T, HV, V),
         "g": torch.zeros(B, T, HV) if g else None, "eta": torch.zeros(B, T, HV) if eta else None,
         "dg": torch.zeros(B, T, HV) if g else None, "deta": torch.zeros(B, T, HV) if eta else None}
    bp = lib.backward_params()
    P.fill(bp.forward, t["q"], t["k"], t["v"], t["do"], g=t["g"], eta=t["eta"])
    bp.forward.dtype = P.DTYPE_FP32
    size = lib.backward_workspace_size(ctypes.byref(bp))
    t["ws"] = torch.zeros(size // 4 + 4)
    P.fill_backward(bp, t["do"], t["dq"], t["dk"], t["dv"], dg=t["dg"], deta=t["deta"])
    bp.workspace, bp.workspace_size = t["ws"].data_ptr(), size
    return bp, t, size


def _validate(lib, bp):
    status = lib.cdll.kla_validate_backward(ctypes.byref(bp))
    return P.STATUS_NAMES[status], lib.cdll.kla_last_error_message().decode()


def test_good_params_validate_and_the_workspace_is_the_documented_layout(lib):
    bp, t, size = _backward_params(lib)
    assert _validate(lib, bp) == ("KLA_SUCCESS", "")
    # bwd_layout.hpp: per (chunk slot, value head) 5 [64][K] and 2 [64][V] tiles, one [64][64]
    # (A^-1), 16 x 64 scalars and 2 [K][V] states; 2 chunks x 4 value heads.
    K = V = 64
    rec = 64 * (5 * K + 2 * V) + 64 * 64 + 16 * 64 + 2 * K * V
    assert size == 2 * 4 * rec * 4


@pytest.mark.parametrize("change,status,match", [
    (lambda bp: setattr(bp, "dq", None), "KLA_ERROR_NULL_POINTER", "dq is NULL"),
    (lambda bp: setattr(bp, "dg", None), "KLA_ERROR_NULL_POINTER", "dg is NULL while forward.g"),
    (lambda bp: setattr(bp, "workspace", None), "KLA_ERROR_NULL_POINTER", "workspace is NULL"),
    (lambda bp: setattr(bp, "workspace_size", 16), "KLA_ERROR_INVALID_SIZE",
     "less than kla_backward_workspace_size"),
    (lambda bp: setattr(bp, "d_o", None), "KLA_ERROR_NULL_POINTER", "o is NULL"),
    (lambda bp: setattr(bp.forward, "eps", -1.0), "KLA_ERROR_INVALID_VALUE", "eps"),
    (lambda bp: setattr(bp, "struct_size", 8), "KLA_ERROR_ABI_MISMATCH", "backward params"),
    (lambda bp: bp.dq_strides.__setitem__(2, 8), "KLA_ERROR_BAD_STRIDE", "dq overlap"),
    (lambda bp: setattr(bp.forward, "state_pool", 16), "KLA_ERROR_INVALID_VALUE",
     "state_pool is not differentiable"),
    # the forward's arithmetic is the backward's (kla.h): an unknown one is refused, not ignored
    (lambda bp: setattr(bp.forward, "arithmetic", 7), "KLA_ERROR_INVALID_VALUE",
     "arithmetic = 7 is unknown"),
])
def test_bad_input_is_refused_by_name(lib, change, status, match):
    bp, t, _ = _backward_params(lib)
    change(bp)
    got, msg = _validate(lib, bp)
    assert got == status and match in msg, (got, msg)


@pytest.mark.parametrize("dtype", [P.DTYPE_FP32, P.DTYPE_BF16, P.DTYPE_FP16])
def test_fast_arithmetic_is_valid_in_every_dtype(lib, dtype):
    """The backward has a FAST arithmetic for every dtype (kla.h): a
    FAST call validates where an ACCURATE one does."""
    bp, t, _ = _backward_params(lib)
    bp.forward.dtype = dtype
    bp.forward.arithmetic = P.ARITHMETIC_FAST
    assert _validate(lib, bp) == ("KLA_SUCCESS", "")


def test_gradient_of_an_absent_input_is_refused(lib):
    bp, t, _ = _backward_params(lib, g=False)
    dg = torch.zeros(1, 100, 4)
    bp.dg, bp.dg_strides[:] = dg.data_ptr(), dg.stride()[:2]
    assert _validate(lib, bp)[0] == "KLA_ERROR_INVALID_VALUE"


def test_head_dims_above_128_are_refused(lib):
    bp, t, _ = _backward_params(lib, K=256, V=64)
    got, msg = _validate(lib, bp)
    assert got == "KLA_ERROR_UNSUPPORTED_HEAD_DIM" and "128" in msg


def test_backward_needs_no_gpu_to_refuse(lib):
    """kla_chunk_backward validates before it looks for a device: bad input is the same error
    with or without a GPU."""
    bp, t, _ = _backward_params(lib)
    bp.dv = None
    status = lib.chunk_backward(ctypes.byref(bp), None)
    assert P.STATUS_NAMES[status] == "KLA_ERROR_NULL_POINTER"
