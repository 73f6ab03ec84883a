"""The C structs of kla.h (ABI 5) mirrored in ctypes, their constants, and filling kla_params.

The layout is checked three ways: the offsets ctypes computes must equal EXPECTED_OFFSETS (read
off kla.h with offsetof on x86-64 / LP64) at import; at load, _lib.py asks the library to fill a
struct through kla_params_init_abi and checks it wrote exactly sizeof(KlaParams) bytes and its
defaults where this file expects them; and every entry point refuses a struct stamped for another
layout (KLA_ERROR_ABI_MISMATCH).
"""
import ctypes
from ctypes import c_char, c_char_p, c_float, c_int, c_int32, c_int64, c_size_t, c_uint32, c_void_p

ABI_VERSION = 5  # KLA_ABI_VERSION of the kla.h this file mirrors

DTYPE_FP32, DTYPE_BF16, DTYPE_FP16 = 0, 1, 2
COEFF_KACZMARZ, COEFF_GIVEN = 0, 1
READOUT_SCALE, READOUT_Q_L2NORM, READOUT_QK_L2NORM = 0, 1, 2
ARITHMETIC_ACCURATE, ARITHMETIC_FAST = 0, 1
PATH_AUTO, PATH_WY, PATH_WY_TRANSPOSED, PATH_TF32, PATH_GENERIC, PATH_TOKENWISE = range(6)

PATHS = {"auto": PATH_AUTO, "wy": PATH_WY, "wy_transposed": PATH_WY_TRANSPOSED,
         "tf32": PATH_TF32, "generic": PATH_GENERIC, "tokenwise": PATH_TOKENWISE}
ARITHMETIC = {"accurate": ARITHMETIC_ACCURATE, "fast": ARITHMETIC_FAST}
ARITHMETIC_NAMES = {code: name for name, code in ARITHMETIC.items()}  # kla_plan.arithmetic
READOUTS = {"scale": READOUT_SCALE, "q_l2norm": READOUT_Q_L2NORM}
# kla_state_grad: the saved backward's state-gradient schedule, and the chain's segments (chunks).
STATE_GRAD_AUTO, STATE_GRAD_SCAN, STATE_GRAD_CHAIN = 0, 1, 2
STATE_GRADS = {"auto": STATE_GRAD_AUTO, "scan": STATE_GRAD_SCAN, "chain": STATE_GRAD_CHAIN}
STATE_GRAD_NAMES = {code: name for name, code in STATE_GRADS.items()}
CHAIN_SEGMENTS = (8, 16, 32, 64, 128)
STATUS_NAMES = (
    "KLA_SUCCESS", "KLA_ERROR_NULL_POINTER", "KLA_ERROR_INVALID_SIZE", "KLA_ERROR_SHAPE_MISMATCH",
    "KLA_ERROR_BAD_STRIDE", "KLA_ERROR_MISALIGNED", "KLA_ERROR_UNSUPPORTED_DTYPE",
    "KLA_ERROR_UNSUPPORTED_HEAD_DIM", "KLA_ERROR_BAD_CU_SEQLENS", "KLA_ERROR_BAD_INDEX",
    "KLA_ERROR_INVALID_VALUE", "KLA_ERROR_NO_DEVICE", "KLA_ERROR_CUDA",
    "KLA_ERROR_UNSUPPORTED_PATH", "KLA_ERROR_ABI_MISMATCH")


class KlaParams(ctypes.Structure):
    _fields_ = [
        ("abi_version", c_uint32), ("struct_size", c_uint32), ("dtype", c_int),
        ("batch", c_int64), ("seq_len", c_int64), ("num_heads", c_int64),
        ("num_v_heads", c_int64), ("head_dim_k", c_int64), ("head_dim_v", c_int64),
        ("q", c_void_p), ("q_strides", c_int64 * 3), ("k", c_void_p), ("k_strides", c_int64 * 3),
        ("v", c_void_p), ("v_strides", c_int64 * 3), ("o", c_void_p), ("o_strides", c_int64 * 3),
        ("g", c_void_p), ("g_strides", c_int64 * 2), ("eta", c_void_p),
        ("eta_strides", c_int64 * 2), ("eta_value", c_float), ("eps", c_float),
        ("scale", c_float), ("coefficient", c_int), ("readout", c_int),
        ("initial_state", c_void_p), ("final_state", c_void_p), ("state_pool", c_void_p),
        ("pool_size", c_int64), ("state_indices", c_void_p), ("state_indices_host", c_void_p),
        ("cu_seqlens", c_void_p), ("cu_seqlens_host", c_void_p), ("num_seqs", c_int64),
        ("workspace", c_void_p), ("workspace_size", c_size_t), ("arithmetic", c_int),
        ("path", c_int), ("value_slice", c_int32), ("segments", c_int32),
    ]


class KlaPlan(ctypes.Structure):
    _fields_ = [
        ("path", c_int), ("segments", c_int32), ("path_name", c_char_p), ("chunk_len", c_int32),
        ("value_slice", c_int32), ("stages", c_int32), ("threads", c_int32),
        ("blocks", c_int64), ("prep_blocks", c_int64), ("smem_bytes", c_int64),
        ("prep_smem_bytes", c_int64), ("workspace_bytes", c_size_t), ("arithmetic", c_int),
        ("reason", c_char * 768),
    ]


class KlaBackwardPlan(ctypes.Structure):
    _fields_ = [
        ("state_grad", c_int), ("chain_segment", c_int32), ("prep_beside", c_int32),
        ("reason", c_char * 256),
    ]


class KlaDeviceInfo(ctypes.Structure):
    _fields_ = [
        ("compute_major", c_int32), ("compute_minor", c_int32), ("multiprocessors", c_int32),
        ("max_smem_per_block", c_int64), ("tensor_maps", c_int32),
    ]


class KlaBackwardParams(ctypes.Structure):
    _fields_ = [
        ("abi_version", c_uint32), ("struct_size", c_uint32), ("forward", KlaParams),
        ("d_o", c_void_p), ("d_o_strides", c_int64 * 3), ("d_final_state", c_void_p),
        ("dq", c_void_p), ("dq_strides", c_int64 * 3), ("dk", c_void_p),
        ("dk_strides", c_int64 * 3), ("dv", c_void_p), ("dv_strides", c_int64 * 3),
        ("dg", c_void_p), ("dg_strides", c_int64 * 2), ("deta", c_void_p),
        ("deta_strides", c_int64 * 2), ("d_initial_state", c_void_p), ("workspace", c_void_p),
        ("workspace_size", c_size_t),
    ]


# offsetof(kla_params, f) and sizeof(kla_params) from kla.h (gcc, x86-64).
EXPECTED_SIZE = 368
EXPECTED_OFFSETS = {
    "abi_version": 0, "struct_size": 4, "dtype": 8, "batch": 16, "seq_len": 24, "num_heads": 32,
    "num_v_heads": 40, "head_dim_k": 48, "head_dim_v": 56, "q": 64, "q_strides": 72, "k": 96,
    "k_strides": 104, "v": 128, "v_strides": 136, "o": 160, "o_strides": 168, "g": 192,
    "g_strides": 200, "eta": 216, "eta_strides": 224, "eta_value": 240, "eps": 244, "scale": 248,
    "coefficient": 252, "readout": 256, "initial_state": 264, "final_state": 272,
    "state_pool": 280, "pool_size": 288, "state_indices": 296, "state_indices_host": 304,
    "cu_seqlens": 312, "cu_seqlens_host": 320, "num_seqs": 328, "workspace": 336,
    "workspace_size": 344, "arithmetic": 352, "path": 356, "value_slice": 360, "segments": 364,
}


# offsetof(kla_backward_params, f) and its size from kla.h (gcc, x86-64).
EXPECTED_BACKWARD_SIZE = 584
EXPECTED_BACKWARD_OFFSETS = {
    "abi_version": 0, "struct_size": 4, "forward": 8, "d_o": 376, "d_o_strides": 384,
    "d_final_state": 408, "dq": 416, "dq_strides": 424, "dk": 448, "dk_strides": 456, "dv": 480,
    "dv_strides": 488, "dg": 512, "dg_strides": 520, "deta": 536, "deta_strides": 544,
    "d_initial_state": 560, "workspace": 568, "workspace_size": 576,
}


def check_struct_layout():
    """Raises AssertionError if this file's structs do not have kla.h's layout (x86-64)."""
    assert ctypes.sizeof(KlaParams) == EXPECTED_SIZE, ctypes.sizeof(KlaParams)
    assert [f[0] for f in KlaParams._fields_] == list(EXPECTED_OFFSETS), "field order"
    for name, off in EXPECTED_OFFSETS.items():
        assert getattr(KlaParams, name).offset == off, (name, getattr(KlaParams, name).offset)
    assert ctypes.sizeof(KlaBackwardParams) == EXPECTED_BACKWARD_SIZE
    assert [f[0] for f in KlaBackwardParams._fields_] == list(EXPECTED_BACKWARD_OFFSETS)
    for name, off in EXPECTED_BACKWARD_OFFSETS.items():
        assert getattr(KlaBackwardParams, name).offset == off, name
    assert ctypes.sizeof(KlaPlan) == 848, ctypes.sizeof(KlaPlan)
    assert ctypes.sizeof(KlaDeviceInfo) == 32, ctypes.sizeof(KlaDeviceInfo)


check_struct_layout()


def dtype_code(dtype):
    """kla_dtype of a torch dtype, or None when kla has none."""
    import torch
    return {torch.float32: DTYPE_FP32, torch.bfloat16: DTYPE_BF16,
            torch.float16: DTYPE_FP16}.get(dtype)


def _ptr(t):
    return None if t is None else t.data_ptr()


def fill(p, q, k, v, o, *, g=None, eta=None, eta_value=1.0, eps=0.0, scale=0.0,
         coefficient=COEFF_KACZMARZ, readout=READOUT_SCALE, initial_state=None,
         final_state=None, state_pool=None, state_indices=None, state_indices_host=None,
         cu_seqlens=None, cu_seqlens_host=None, workspace=None, arithmetic=ARITHMETIC_ACCURATE,
         path=PATH_AUTO, value_slice=0, segments=0):
    """Fills kla_params p (from kla_params_init_abi) for torch tensors, as the ops pass it.

    q, k [B,T,H,K]; v, o [B,T,HV,V] (last dimension contiguous, other strides free); g, eta
    [B,T,HV] fp32 (HV contiguous) or None; states [N,HV,K,V] fp32 contiguous; state_pool
    [P,HV,K,V]; state_indices / cu_seqlens int32 on the device and *_host the same values in
    int32 CPU tensors; workspace a uint8 tensor (None: the workspace-free generic path only).
    Only addresses are taken: nothing is read, and no reference is kept (the caller keeps the
    tensors alive until the call is enqueued).
    """
    B, T, H, K = q.shape
    p.dtype = dtype_code(q.dtype)
    p.batch, p.seq_len, p.num_heads, p.head_dim_k = B, T, H, K
    p.num_v_heads, p.head_dim_v = v.shape[2], v.shape[3]
    p.q, p.k, p.v, p.o = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()
    p.q_strides[:] = q.stride()[:3]
    p.k_strides[:] = k.stride()[:3]
    p.v_strides[:] = v.stride()[:3]
    p.o_strides[:] = o.stride()[:3]
    if g is not None:
        p.g = g.data_ptr()
        p.g_strides[:] = g.stride()[:2]
    if eta is not None:
        p.eta = eta.data_ptr()
        p.eta_strides[:] = eta.stride()[:2]
    p.eta_value, p.eps, p.scale = eta_value, eps, scale
    p.coefficient, p.readout = coefficient, readout
    p.initial_state, p.final_state = _ptr(initial_state), _ptr(final_state)
    if state_pool is not None:
        p.state_pool, p.pool_size = state_pool.data_ptr(), state_pool.shape[0]
        p.state_indices, p.state_indices_host = _ptr(state_indices), _ptr(state_indices_host)
    if cu_seqlens_host is not None:
        p.cu_seqlens, p.cu_seqlens_host = _ptr(cu_seqlens), cu_seqlens_host.data_ptr()
        p.num_seqs = cu_seqlens_host.shape[0] - 1
    if workspace is not None:
        p.workspace, p.workspace_size = workspace.data_ptr(), workspace.numel()
    p.arithmetic, p.path, p.value_slice, p.segments = arithmetic, path, value_slice, segments
    return p


def as_dict(p):
    """The fields of a KlaParams as a dict (arrays as tuples): for tests and debugging."""
    out = {}
    for name, _ in KlaParams._fields_:
        val = getattr(p, name)
        out[name] = tuple(val) if isinstance(val, ctypes.Array) else val
    return out


def fill_backward(bp, do, dq, dk, dv, *, dht=None, dg=None, deta=None, dh0=None, workspace=None):
    """Fills the gradient fields of kla_backward_params bp (its .forward filled by fill with o =
    do): do, dv [B,T,HV,V]; dq, dk [B,T,H,K]; dht / dh0 [N,HV,K,V] fp32 contiguous or None; dg /
    deta [B,T,HV] fp32 or None; workspace a uint8 tensor. Addresses only, as fill."""
    bp.d_o = do.data_ptr()
    bp.d_o_strides[:] = do.stride()[:3]
    bp.d_final_state = _ptr(dht)
    for name, t in (("dq", dq), ("dk", dk), ("dv", dv)):
        setattr(bp, name, t.data_ptr())
        getattr(bp, name + "_strides")[:] = t.stride()[:3]
    if dg is not None:
        bp.dg = dg.data_ptr()
        bp.dg_strides[:] = dg.stride()[:2]
    if deta is not None:
        bp.deta = deta.data_ptr()
        bp.deta_strides[:] = deta.stride()[:2]
    bp.d_initial_state = _ptr(dh0)
    if workspace is not None:
        bp.workspace, bp.workspace_size = workspace.data_ptr(), workspace.numel()
    return bp
