"""kla's prefill functions in plain PyTorch, differentiated by torch's autograd.

    kla.torch_impl.chunk_kla(q, k, v, g=None, eta=None, eps=1e-6, scale=None, ...)
    kla.torch_impl.chunk_gated_delta_rule(q, k, v, g, beta, scale=None, ...)

The same arguments, defaults and returns as kla.chunk_kla / kla.chunk_gated_delta_rule (FLA's
layouts: q, k [B,T,H,K], v [B,T,HV,V], g and eta / beta [B,T,HV], states [N,HV,K,V] fp32,
cu_seqlens), computed by the chunkwise algorithm of _chunk_torch.py in fp32 (float64 for float64
inputs) on any device, outputs in v's dtype. What it is for: the float32 PyTorch implementation
of the recurrence that a model trained on the kernels is compared with (bench/mqar.py), and a
CPU path for kla.nn layers, always chosen explicitly (impl="torch"), never a silent fallback. It
is slow (two Python loops over the 64-token chunks, autograd's memory for every chunk tensor).
"""
import torch

from . import _params as P
from ._chunk_torch import forward_chunks, read_out
from .api import _DTYPES, _check_qkv, _enum, _gate, _qk_readout, _scale, _seqlens, _state_in


def _forward(q, k, v, g, eta, eta_value, eps, scale, initial_state, output_final_state,
             cu_seqlens, use_qk_l2norm_in_kernel, coefficient, readout):
    _check_qkv(q, k, v, _DTYPES + (torch.float64,))
    cu_seqlens, cu_cpu = _seqlens(q, cu_seqlens, None)
    n = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    scale = _scale(scale, q, readout)
    readout = _qk_readout(readout, use_qk_l2norm_in_kernel)
    cd = torch.float64 if q.dtype == torch.float64 else torch.float32  # forward_chunks' type
    g = _gate(g, "g", v, cd)
    eta = _gate(eta, "beta" if coefficient else "eta", v, cd)
    h0 = _state_in(initial_state, q, v, n, False, dtype=cd)
    c = forward_chunks(q, k, v, g, eta, h0, cu_seqlens, cu_cpu, float(eps), float(eta_value),
                       coefficient, readout)
    o = c.lay.tokens(read_out(c, 1.0 if readout == P.READOUT_Q_L2NORM else scale)).to(v.dtype)
    return o, c.final if output_final_state else None


def chunk_kla(q, k, v, g=None, eta=None, eps=1e-6, scale=None, initial_state=None,
              output_final_state=False, cu_seqlens=None, use_qk_l2norm_in_kernel=False, *,
              readout="scale"):
    """kla.chunk_kla in PyTorch (the Kaczmarz coefficient). Returns (o, final_state)."""
    eta_value = 1.0
    if eta is not None and not isinstance(eta, torch.Tensor):
        eta_value, eta = float(eta), None
    return _forward(q, k, v, g, eta, eta_value, eps, scale, initial_state, output_final_state,
                    cu_seqlens, use_qk_l2norm_in_kernel, P.COEFF_KACZMARZ,
                    _enum(P.READOUTS, readout, "readout"))


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
                           output_final_state=False, use_qk_l2norm_in_kernel=False,
                           cu_seqlens=None):
    """kla.chunk_gated_delta_rule in PyTorch (a given beta). Returns (o, final_state)."""
    if beta is None:
        raise ValueError("kla: chunk_gated_delta_rule needs beta ([B, T, HV])")
    return _forward(q, k, v, g, beta, 1.0, 0.0, scale, initial_state, output_final_state,
                    cu_seqlens, use_qk_l2norm_in_kernel, P.COEFF_GIVEN, P.READOUT_SCALE)
