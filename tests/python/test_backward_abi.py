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


# ---- saved states (kla.h "Saved states"): kla_saved_states_size, host arithmetic ---------------
def _saving_params(lib, *, B=1, T=100, H=2, HV=4, K=128, V=128, cu=None, dtype=torch.bfloat16):
    """A forward call that can save (bf16, FAST, K = V = 128), on CPU tensors standing in for
    device memory; cu: packed cu_seqlens (B = 1), its values as the host and the device copy."""
    t = {"q": torch.zeros(B, T, H, K, dtype=dtype), "k": torch.zeros(B, T, H, K, dtype=dtype),
         "v": torch.zeros(B, T, HV, V, dtype=dtype), "o": torch.zeros(B, T, HV, V, dtype=dtype),
         "g": torch.zeros(B, T, HV), "eta": torch.zeros(B, T, HV),
         "cu": None if cu is None else torch.tensor(cu, dtype=torch.int32)}
    p = P.fill(lib.params(), t["q"], t["k"], t["v"], t["o"], g=t["g"], eta=t["eta"],
               cu_seqlens=t["cu"], cu_seqlens_host=t["cu"], arithmetic=P.ARITHMETIC_FAST)
    return p, t


_POOL = torch.zeros(4, 4, 128, 128)
_POOL_INDICES = torch.tensor([2], dtype=torch.int32)


def _pool(p):
    """A valid state pool (rows of [4, HV, K, V], one index per sequence): a call that would
    validate but, as kla.h says, cannot save."""
    p.state_pool, p.pool_size = _POOL.data_ptr(), _POOL.shape[0]
    p.state_indices = p.state_indices_host = _POOL_INDICES.data_ptr()


def _saved_size(lib, p):
    return lib.saved_states_size(ctypes.byref(p)), lib.cdll.kla_last_error_message().decode()


@pytest.mark.parametrize("B,T,HV,cu,slots", [
    (1, 100, 4, None, 2),                              # ceil(100 / 64)
    (2, 300, 4, None, 2 * 5),
    (3, 64, 2, None, 3),
    (1, 1, 1, None, 1),
    (1, 300, 4, [0, 100, 164, 300], 300 // 64 + 3),    # packed: T // 64 + N (chunk_slots)
    (1, 700, 4, [0, 200, 264, 700], 700 // 64 + 3),
    (1, 129, 2, [0, 0, 1, 129], 129 // 64 + 3),        # an empty and a one-token sequence
    (1, 128, 2, [0, 128], 128 // 64 + 1),
])
def test_saved_states_size_is_the_package_formula(saving_lib, B, T, HV, cu, slots):
    """kla_saved_states_size: chunk slots (the workspace's) x HV records of (K V + 64 V) bf16 =
    48 KiB at K = V = 128; the bytes the fake kernel allocates (ops.saved_states_bytes)."""
    from kla import ops
    p, t = _saving_params(saving_lib, B=B, T=T, H=2 if HV % 2 == 0 else 1, HV=HV, cu=cu)
    size, msg = _saved_size(saving_lib, p)
    assert size == slots * HV * (128 * 128 + 64 * 128) * 2, (size, msg)
    assert size == ops.saved_states_bytes(t["q"], t["v"], t["cu"])


@pytest.mark.parametrize("path,value_slice,segments", [
    (P.PATH_AUTO, 0, 0), (P.PATH_WY, 0, 0), (P.PATH_WY, 32, 1), (P.PATH_AUTO, 32, 1),
    (P.PATH_WY_TRANSPOSED, 0, 0), (P.PATH_WY_TRANSPOSED, 64, 1)])
def test_saved_states_size_of_every_path_request_that_can_save(saving_lib, path, value_slice,
                                                              segments):
    p, _ = _saving_params(saving_lib)
    p.path, p.value_slice, p.segments = path, value_slice, segments
    assert _saved_size(saving_lib, p)[0] == 2 * 4 * 48 * 1024


@pytest.mark.parametrize("change,words", [
    (lambda p: setattr(p, "dtype", P.DTYPE_FP16), ("bf16", "dtype")),
    (lambda p: setattr(p, "dtype", P.DTYPE_FP32), ("bf16", "dtype")),
    (lambda p: setattr(p, "arithmetic", P.ARITHMETIC_ACCURATE), ("fast", "arithmetic")),
    (lambda p: setattr(p, "head_dim_k", 64), ("128", "head_dim")),
    (lambda p: setattr(p, "head_dim_v", 64), ("128", "head_dim")),
    (lambda p: _pool(p), ("pool",)),
    (lambda p: setattr(p, "path", P.PATH_TF32), ("path", "wy")),
    (lambda p: setattr(p, "path", P.PATH_GENERIC), ("path", "wy")),
    (lambda p: setattr(p, "value_slice", 16), ("value_slice", "slice")),
    (lambda p: (setattr(p, "path", P.PATH_WY_TRANSPOSED), setattr(p, "value_slice", 32)),
     ("wy_transposed",)),
    (lambda p: setattr(p, "segments", 2), ("segment",)),
])
def test_saved_states_size_is_zero_with_a_reason_where_the_call_cannot_save(saving_lib, change,
                                                                             words):
    """0 bytes, and kla_last_error_message says why (a word of the condition in it)."""
    p, _ = _saving_params(saving_lib)
    change(p)
    size, msg = _saved_size(saving_lib, p)
    assert size == 0 and msg, (size, msg)
    assert any(w in msg.lower() for w in words), msg


def test_saved_states_size_of_unusable_params_is_zero(saving_lib):
    assert saving_lib.saved_states_size(None) == 0
    p, _ = _saving_params(saving_lib)
    p.struct_size = 8
    assert _saved_size(saving_lib, p)[0] == 0


# ---- the saved backward's state-gradient schedule (kla.h kla_state_grad), planned on the CPU ---
def _saved_backward_params(lib, **kw):
    p, t = _saving_params(lib, **kw)
    bp = lib.backward_params()
    bp.forward = p
    t.update(do=torch.zeros_like(t["v"]), dq=torch.zeros_like(t["q"]),
             dk=torch.zeros_like(t["k"]), dv=torch.zeros_like(t["v"]))
    P.fill_backward(bp, t["do"], t["dq"], t["dk"], t["dv"], dg=torch.zeros_like(t["g"]),
                    deta=torch.zeros_like(t["eta"]))
    t["dg"], t["deta"] = bp.dg, bp.deta
    size = lib.backward_workspace_size(ctypes.byref(bp))
    t["ws"] = torch.zeros(size // 4 + 4)
    bp.workspace, bp.workspace_size = t["ws"].data_ptr(), size
    return bp, t


def test_the_saved_backward_plan_on_a_described_gpu(saving_lib):
    """Library.plan_backward_saved (kla_plan_chunk_backward_saved_for: no GPU needed) on an H100:
    the chain where AUTO can run it (this build has an sm_90a image, or the reason says it has
    not), the scan on request with its prep beside it (4 value heads x 4 slices: one wave), and a
    request the device cannot run refused with the reason. tests/cuda/test_validate.cpp checks
    the plans of issue 25's rows."""
    import kla
    from kla._lib import KlaError
    bp, _ = _saved_backward_params(saving_lib, T=1000)
    plan = saving_lib.plan_backward_saved(bp, device=kla.H100._c())
    if plan.state_grad == P.STATE_GRAD_SCAN:
        assert b"built without sm_90a kernels" in plan.reason, plan.reason
    else:
        assert plan.state_grad == P.STATE_GRAD_CHAIN and plan.chain_segment in P.CHAIN_SEGMENTS
        assert plan.reason.startswith(b"chain: segments of"), plan.reason
    plan = saving_lib.plan_backward_saved(bp, P.STATE_GRAD_SCAN, device=kla.H100._c())
    assert (plan.state_grad, plan.chain_segment, plan.prep_beside) == (P.STATE_GRAD_SCAN, 0, 1)
    assert b"scan, the prep beside it (16 scan blocks on 132" in plan.reason, plan.reason
    sm80 = kla.DeviceInfo((8, 0), 108, 232448)._c()  # shared memory ample: refused for the chain
    with pytest.raises(KlaError, match="state_grad CHAIN cannot run: the chain is sm_90a code"):
        saving_lib.plan_backward_saved(bp, P.STATE_GRAD_CHAIN, device=sm80)
    with pytest.raises(KlaError, match="chain_segment = 12 is not 0 or a power of two"):
        saving_lib.plan_backward_saved(bp, P.STATE_GRAD_CHAIN, 12, device=kla.H100._c())
