"""The eager decode path: fused_recurrent_* on plain, contiguous CUDA tensors, no grad needed.

A decode step at B = 1 runs a ~4 us kernel, so the host's Python work is most of its cost. This
path does the least per call: one template of kla_params per call signature (shapes, dtype,
options; sizes, contiguous strides and options already filled, built once with the general
path's checks), per call only identity checks that keep the template valid (shapes, dtypes,
contiguity, one device), the output allocation, eight pointers and the C call. Anything else
(strided or non-fp32 gates, varlen, pools, l2norm, state_v_first, FakeTensors, torch.compile,
autograd) returns None and takes the general path (api.py -> ops.py), which gives the errors.
"""
import ctypes

import torch

from . import _lib
from . import _params as P
from .ops import _stream

_I64 = ctypes.c_int64 * (P.EXPECTED_SIZE // 8)
# int64 slots of the pointers in kla_params (offset / 8)
_Q, _K, _V, _O, _G, _ETA, _H0, _HT = 8, 12, 16, 20, 24, 27, 33, 34
_F32 = torch.float32
_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled
_templates = {}  # key -> (params bytes, gate shape, state shape), or False: not this path
_entry = None  # kla_tokenwise_forward taking (void*, void*)
_current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)


def _template(key):
    sq, sv, dtype, no_g, no_eta, _, _, _, eta_value, eps, scale, readout, coefficient = key
    code = P.dtype_code(dtype)
    if code is None or len(sq) != 4 or len(sv) != 4 or sv[:2] != sq[:2] or sv[2] % sq[2]:
        return False
    lib = _lib.load()
    B, T, H, K = sq
    HV, V = sv[2], sv[3]
    p = lib.params()
    p.dtype = code
    p.batch, p.seq_len, p.num_heads, p.num_v_heads, p.head_dim_k, p.head_dim_v = B, T, H, HV, K, V
    p.q_strides[:] = p.k_strides[:] = (T * H * K, H * K, K)
    p.v_strides[:] = p.o_strides[:] = (T * HV * V, HV * V, V)
    if not no_g:
        p.g_strides[:] = (T * HV, HV)
    if not no_eta:
        p.eta_strides[:] = (T * HV, HV)
    p.eta_value, p.eps = eta_value, eps
    p.scale = 0.0 if readout == P.READOUT_Q_L2NORM else K ** -0.5 if scale is None else scale
    p.coefficient, p.readout = coefficient, readout
    return bytes(p), (B, T, HV), (B, HV, K, V)


def _launch(params, dev):
    """kla_tokenwise_forward(params, current stream of dev) with dev current; the status."""
    global _entry
    if _entry is None:
        fn = _lib.load().cdll["kla_tokenwise_forward"]  # its own function object
        fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p]
        _entry = fn
    if _current_device() == dev:
        return _entry(ctypes.addressof(params), _stream(dev))
    with torch.cuda.device(dev):
        return _entry(ctypes.addressof(params), _stream(dev))


def decode(q, k, v, g, eta, eta_value, eps, scale, readout, coefficient, state, inplace,
           output_final_state):
    """(o, final_state) of a plain eager decode call, or None where the general path must run."""
    if type(q) is not torch.Tensor or not q.is_cuda or _is_compiling():
        return None
    if readout == P.READOUT_Q_L2NORM and scale is not None:
        return None  # the general path says why
    if _grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or
                            (g is not None and g.requires_grad) or
                            (eta is not None and eta.requires_grad) or
                            (state is not None and state.requires_grad)):
        return None
    return run(q, k, v, g, eta, eta_value, eps, scale, readout, coefficient, state, inplace,
               output_final_state)


def run(q, k, v, g, eta, eta_value, eps, scale, readout, coefficient, state, inplace,
        output_final_state):
    sq, dtype = q.shape, q.dtype
    key = (sq, v.shape, dtype, g is None, eta is None, state is None, inplace,
           output_final_state, eta_value, eps, scale, readout, coefficient)
    tpl = _templates.get(key)
    if tpl is None:
        tpl = _templates[key] = _template(key)
    if not tpl:
        return None
    params, gate_shape, state_shape = tpl
    dev = q.get_device()
    if not (k.shape == sq and k.dtype == dtype and v.dtype == dtype and q.is_contiguous() and
            k.is_contiguous() and v.is_contiguous() and k.get_device() == dev and
            v.get_device() == dev):
        return None
    p = _I64.from_buffer_copy(params)
    if g is not None:
        if not (g.dtype == _F32 and g.shape == gate_shape and g.is_contiguous() and
                g.get_device() == dev):
            return None
        p[_G] = g.data_ptr()
    if eta is not None:
        if not (eta.dtype == _F32 and eta.shape == gate_shape and eta.is_contiguous() and
                eta.get_device() == dev):
            return None
        p[_ETA] = eta.data_ptr()
    if state is not None:
        if not (state.dtype == _F32 and state.shape == state_shape and state.is_contiguous() and
                state.get_device() == dev):
            return None
        p[_H0] = state.data_ptr()
    if inplace:
        if state is None:
            return None
        final = state
    elif output_final_state:
        final = v.new_empty(state_shape, dtype=_F32)
    else:
        final = None
    if final is not None:
        p[_HT] = final.data_ptr()
    o = torch.empty_like(v)
    p[_Q], p[_K], p[_V], p[_O] = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()
    status = _launch(p, dev)
    if status:
        raise _lib.load().error(status)
    return o, final
