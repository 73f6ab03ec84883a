"""The backward pass of kla's forward ops (chunk_fwd, recurrent_fwd), in PyTorch.

This is the chunkwise backward of reference/include/kla/ref/grad_chunk.hpp (SPEC §8) written with
batched torch matrix products: the backward of the ops where the CUDA kernels (kla_chunk_backward,
ops.launch_backward) do not run, on the CPU and for head dims above their 128; the same algorithm
as the kernels, and the oracle their Python tests share with the float64 recurrence. It saves
nothing from the forward: it recomputes each chunk's incoming state from the inputs
(_chunk_torch.forward_chunks, whose docstring has the forms and the numerical contract), then
runs two passes, one sequential over the chunks (the state gradient, eq. (chunk_state)
transposed) and one parallel over them (every input gradient).

Each normalisation of the prologue, x^ = x * s(x) with s = (|x|^2 + c)^-1/2, goes back as
dx = s (dx^ - x^ (x^ . dx^)) (and, for the Kaczmarz key, v^'s share: dk = s (dk^ - k^ (k^ . dk^ +
v^ . dv^)), dv = s dv^), the chain of proofs_check grad.normalized_key. The back substitution
with A^T amplifies rounding as the forward substitution does; A's entries are bounded by eta in
the normalised-key form.
"""
import torch

from ._chunk_torch import forward_chunks
from ._params import COEFF_KACZMARZ, READOUT_Q_L2NORM, READOUT_QK_L2NORM


def _normalised_backward(xh, s, dxh, extra=None):
    """The gradient of x from that of x^ = x * s(x) (see the module docstring); `extra` adds
    (y^ . dy^) for a y^ = y * s(x) that shares the scale (the Kaczmarz value)."""
    dot = (xh * dxh).sum(-1, keepdim=True)
    if extra is not None:
        dot = dot + extra
    return s * (dxh - xh * dot)


def chunk_backward(q, k, v, g, eta, initial_state, cu_seqlens, cu_seqlens_cpu, scale, eps,
                   eta_value, coefficient, readout, do, dht):
    """Gradients (dq, dk, dv, dg, deta, dh0) of the forward with these arguments (ops.py's
    chunk_fwd / recurrent_fwd) given do [B,T,HV,V] and dht [N,HV,K,V] (None: zero). dq, dk in
    q's dtype [B,T,H,K] (summed over each key head's value heads), dv in v's; dg, deta [B,T,HV]
    and dh0 [N,HV,K,V] in the dtypes of g, eta and initial_state (fp32 from the ops), None where
    that input is None."""
    B, T, H, K = q.shape
    c = forward_chunks(q, k, v, g, eta, initial_state, cu_seqlens, cu_seqlens_cpu, eps, eta_value,
                       coefficient, readout)
    lay, N, NT, HV, V = c.lay, c.lay.N, c.lay.NT, v.shape[2], v.shape[3]
    qh, kh, vh, beta, eG, eGC, gC, gam = c.qh, c.kh, c.vh, c.beta, c.eG, c.eGC, c.gC, c.gam
    W, M, KG, Sst, U = c.W, c.M, c.KG, c.Sst, c.U
    dy = lay.chunks(do, c.cd) * (1.0 if readout == READOUT_Q_L2NORM else scale)

    # Backward over the chunks: the gradient of each chunk's outgoing state.
    MtdY = M.transpose(-1, -2) @ dy
    QdY = (qh * eG[..., None]).transpose(-1, -2) @ dy
    dS = dht.to(c.cd) if dht is not None else dy.new_zeros(N, HV, K, V)
    douts = [None] * NT
    for j in reversed(range(NT)):
        douts[j] = dS
        dUc = MtdY[:, :, j] + KG[:, :, j] @ dS
        dS = eGC[:, :, j, None, None] * dS + QdY[:, :, j] - W[:, :, j].transpose(-1, -2) @ dUc
    dh0 = dS
    dSo = torch.stack(douts, 2) if NT else Sst

    # Every input gradient, all chunks at once.
    dU = MtdY + KG @ dSo
    SdY = dy @ Sst.transpose(-1, -2)  # row i: (S dy_i)^T
    dqh = eG[..., None] * SdY
    Pm = (dy @ U.transpose(-1, -2)) * gam  # (dy_i . u_j) Γ_ij, j <= i
    dqh = dqh + Pm @ kh
    dkh = Pm.transpose(-1, -2) @ qh
    X = Pm * (qh @ kh.transpose(-1, -2))
    dG = X.sum(-1) - X.sum(-2) + eG * (qh * SdY).sum(-1)
    UdS = U @ dSo.transpose(-1, -2)  # row j: (dS' u_j)^T
    dkh = dkh + gC[..., None] * UdS
    z = gC * (kh * UdS).sum(-1)
    carry = eGC * (dSo * Sst).sum((-1, -2)) + z.sum(-1)
    dG = dG - z
    dG[..., -1] += carry
    # The solve: dR = A^-T dU, dL = -dR U^T on the strict lower part.
    dR = torch.linalg.solve_triangular(c.A.transpose(-1, -2), dU, upper=True, unitriangular=True)
    dL = -(dR @ U.transpose(-1, -2)).masked_fill(~c.strict, 0.0)
    dLg = dL * gam
    Z = dLg * beta[..., None]
    dkh = dkh + Z @ kh + Z.transpose(-1, -2) @ kh
    Y = Z * c.KK
    dG = dG + Y.sum(-1) - Y.sum(-2)
    dbeta = (dLg * c.KK).sum(-1)
    # R_i = β_i (v^_i - e^G_i S^T k^_i).
    E = vh - eG[..., None] * (kh @ Sst)
    dbeta = dbeta + (dR * E).sum(-1)
    bdR = beta[..., None] * dR
    dvh = bdR
    SbdR = bdR @ Sst.transpose(-1, -2)
    dkh = dkh - eG[..., None] * SbdR
    dG = dG - eG * (kh * SbdR).sum(-1)
    dgl = dG.flip(-1).cumsum(-1).flip(-1)  # dg_s = Σ_{i>=s} dG_i

    # The prologue backwards.
    if coefficient == COEFF_KACZMARZ:
        dk1 = _normalised_backward(kh, c.ks, dkh, extra=(vh * dvh).sum(-1, keepdim=True))
        dv0 = c.ks * dvh
    else:
        dk1, dv0 = dkh, dvh
    dk0 = _normalised_backward(c.k1, c.kns, dk1) if readout == READOUT_QK_L2NORM else dk1
    dq0 = _normalised_backward(qh, c.qs, dqh) if c.qs is not None else dqh

    def per_key_head(x):  # [B,T,HV,K] -> [B,T,H,K], summed over each key head's value heads
        return x if c.group == 1 else x.view(B, T, H, c.group, K).sum(3)

    dq = per_key_head(lay.tokens(dq0)).to(q.dtype)
    dk = per_key_head(lay.tokens(dk0)).to(k.dtype)
    dv = lay.tokens(dv0).to(v.dtype)
    dg = lay.tokens(dgl * c.valid).to(g.dtype) if g is not None else None
    deta = lay.tokens(dbeta * c.valid).to(eta.dtype) if eta is not None else None
    dh0 = dh0.to(initial_state.dtype) if initial_state is not None else None
    return dq, dk, dv, dg, deta, dh0
