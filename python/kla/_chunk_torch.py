"""The chunkwise forward of KLA and the gated delta rule in PyTorch: the pieces that the PyTorch
implementation (kla.torch_impl, differentiated by torch's autograd) and the backward of the kernels'
ops (_backward.py, differentiated by hand) share.

Forms (SPEC §1, the paper's Propositions 3-4; reference/include/kla/ref/chunk.hpp). The Kaczmarz
coefficient is taken in the normalised-key form the kernels run: with r = sqrt(|k|^2 + eps),
k^ = k / r, v^ = v / r and beta = eta (0 where r = 0), which is the same function as
beta = eta / (|k|^2 + eps) with bounded chunk-system entries; given beta: k^ = k, v^ = v,
beta = eta. The q l2-norm read-out is q^ = q / |q| read out at scale 1, the qk l2-norm one
q^ = q / sqrt(|q|^2 + 1e-6) and k / sqrt(|k|^2 + 1e-6) before the coefficient, read out at the
scale. In each chunk (Γ_ij = exp(G_i - G_j), G the inclusive cumulative log decay, A = I + L):
  L_ij = β_i Γ_ij k^_i.k^_j (j < i)        U = A^-1 (β V^) - A^-1 diag(β e^G) K^ S  = U0 - W S
  y_i  = e^G_i S^T q^_i + Σ_{j<=i} Γ_ij (q^_i.k^_j) u_j        o = scale * y
  S'   = e^G_C S + Σ_j Γ_Cj k^_j u_j^T
Sequences are padded to whole chunks with tokens that change nothing (k = v = q = 0, g = 0,
eta = 0), so varlen packs and ragged ends need no special case.

Numerical contract: the arithmetic of the inputs' compute type (fp32 for fp32 / bf16 / fp16
inputs, float64 for float64 ones), no TF32 unless the caller enabled it for torch matmuls
globally (torch.backends.cuda.matmul.allow_tf32, which this module leaves alone).
"""
from types import SimpleNamespace

import torch

from ._params import COEFF_KACZMARZ, READOUT_Q_L2NORM, READOUT_QK_L2NORM

NORM_EPS = 1e-6  # the qk l2-norm's epsilon (FLA's l2norm; kla.h KLA_READOUT_QK_L2NORM)
CHUNK = 64


def normalised(x, c):
    """x * s with s = (|x|^2 + c)^-1/2 over the last dimension (s = 0 where |x|^2 + c = 0): the
    normalised x and s [..., 1]."""
    n2 = (x * x).sum(-1, keepdim=True) + c
    s = torch.where(n2 > 0, torch.rsqrt(torch.where(n2 > 0, n2, torch.ones_like(n2))),
                    torch.zeros_like(n2))
    return x * s, s


class Layout:
    """Token rows of [B, T, heads, D] tensors as [N, heads, NT, C, D] chunks of padded
    sequences, and back. Dense batches pad each row to whole chunks; varlen packs (B = 1,
    cu_seqlens) gather each sequence into its own row."""

    def __init__(self, B, T, cu, device):
        self.B, self.T = B, T
        if cu is None:
            self.N, lens = B, [T] * B
        else:
            self.N, lens = len(cu) - 1, [cu[i + 1] - cu[i] for i in range(len(cu) - 1)]
        longest = max(lens) if lens else 0
        self.NT = (longest + CHUNK - 1) // CHUNK
        self.Tp = self.NT * CHUNK
        self.index = None
        if cu is not None:
            t = torch.arange(self.Tp, device=device)
            starts = torch.tensor(cu[:-1], device=device, dtype=torch.long)
            lengths = torch.tensor(lens, device=device, dtype=torch.long)
            self.mask = t[None, :] < lengths[:, None]  # [N, Tp]
            self.index = torch.where(self.mask, starts[:, None] + t[None, :], 0)

    def chunks(self, x, dtype):
        """[B, T, heads(, D)] -> [N, heads, NT, C(, D)] in dtype, padding rows zero."""
        x = x.to(dtype)
        if self.index is None:
            x = torch.nn.functional.pad(x, (0, 0) * (x.dim() - 2) + (0, self.Tp - self.T))
        else:
            m = self.mask.view(self.N, self.Tp, *([1] * (x.dim() - 2)))
            x = x[0][self.index] * m
        shape = (self.N, self.NT, CHUNK) + tuple(x.shape[2:])
        x = x.reshape(shape)
        return x.permute(0, 3, 1, 2, 4) if x.dim() == 5 else x.permute(0, 3, 1, 2)

    def tokens(self, x):
        """The inverse of chunks for a gradient: [N, heads, NT, C(, D)] -> [B, T, heads(, D)]."""
        x = x.permute(0, 2, 3, 1, 4) if x.dim() == 5 else x.permute(0, 2, 3, 1)
        x = x.reshape((self.N, self.Tp) + tuple(x.shape[3:]))
        if self.index is None:
            return x[:, :self.T]
        out = x.new_zeros((1, self.T) + tuple(x.shape[2:]))
        out[0, self.index[self.mask]] = x[self.mask]
        return out


def forward_chunks(q, k, v, g, eta, initial_state, cu_seqlens, cu_seqlens_cpu, eps, eta_value,
                   coefficient, readout):
    """Every chunk's tensors and incoming state (the forward up to the outputs), as a namespace:
    lay (the Layout), cd (compute dtype), group, the per-chunk inputs q0, k0, v0 [N,HV,NT,C,D],
    the prologue's qh, k1, kh, vh, beta and scales qs, kns, ks (None where not used), valid
    (1 on real tokens), the chunk tensors G, eG, eGC, gC, gam, strict, KK, A, U0, W, M, KG, the
    incoming states Sst [N,HV,NT,K,V], U = U0 - W S and the final state."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    group = HV // H
    dev = q.device
    cd = torch.float64 if q.dtype == torch.float64 else torch.float32
    cu = None
    if cu_seqlens is not None:
        cu = [int(x) for x in (cu_seqlens_cpu if cu_seqlens_cpu is not None
                               else cu_seqlens).tolist()]
    lay = Layout(B, T, cu, dev)
    N, NT, C = lay.N, lay.NT, CHUNK

    def per_value_head(x):  # [B,T,H,K] -> [B,T,HV,K]
        return x if group == 1 else x.repeat_interleave(group, dim=2)

    q0 = lay.chunks(per_value_head(q), cd)
    k0 = lay.chunks(per_value_head(k), cd)
    v0 = lay.chunks(v, cd)
    gl = lay.chunks(g, cd) if g is not None else q0.new_zeros(N, HV, NT, C)
    valid = lay.chunks(torch.ones(B, T, HV, device=dev), cd)
    if eta is not None:
        beta = lay.chunks(eta, cd)
    else:
        beta = valid * eta_value

    # The prologue: q^, k^, v^ and the scales the chain rule needs.
    qs = ks = kns = None
    if readout == READOUT_Q_L2NORM:
        qh, qs = normalised(q0, 0.0)
    elif readout == READOUT_QK_L2NORM:
        qh, qs = normalised(q0, NORM_EPS)
    else:
        qh = q0
    k1 = k0
    if readout == READOUT_QK_L2NORM:
        k1, kns = normalised(k0, NORM_EPS)
    if coefficient == COEFF_KACZMARZ:
        kh, ks = normalised(k1, eps)
        vh = v0 * ks
    else:
        kh, vh = k1, v0

    # Chunk tensors, every chunk at once.
    G = gl.cumsum(-1)
    eG = torch.exp(G)
    eGC = eG[..., -1]  # [N,HV,NT]
    gC = torch.exp(G[..., -1:] - G)  # Γ_Cj
    ones = torch.ones(C, C, dtype=torch.bool, device=dev)
    lower, strict = torch.tril(ones), torch.tril(ones, -1)
    diff = (G[..., :, None] - G[..., None, :]).masked_fill(~lower, float("-inf"))
    gam = torch.exp(diff)  # Γ_ij, 0 above the diagonal
    KK = kh @ kh.transpose(-1, -2)
    L = (beta[..., None] * KK * gam).masked_fill(~strict, 0.0)
    A = L + torch.eye(C, dtype=cd, device=dev)
    U0 = torch.linalg.solve_triangular(A, beta[..., None] * vh, upper=False, unitriangular=True)
    W = torch.linalg.solve_triangular(A, (beta * eG)[..., None] * kh, upper=False,
                                      unitriangular=True)
    M = (qh @ kh.transpose(-1, -2)) * gam
    KG = kh * gC[..., None]

    # Forward over the chunks: each chunk's incoming state.
    S = (initial_state.to(cd) if initial_state is not None
         else q0.new_zeros(N, HV, K, V))
    states = []
    for c in range(NT):
        states.append(S)
        Uc = U0[:, :, c] - W[:, :, c] @ S
        S = eGC[:, :, c, None, None] * S + KG[:, :, c].transpose(-1, -2) @ Uc
    Sst = torch.stack(states, 2) if NT else q0.new_zeros(N, HV, 0, K, V)
    U = U0 - W @ Sst

    return SimpleNamespace(lay=lay, cd=cd, group=group, q0=q0, k0=k0, v0=v0, valid=valid,
                           beta=beta, qh=qh, qs=qs, k1=k1, kns=kns, kh=kh, ks=ks, vh=vh, G=G,
                           eG=eG, eGC=eGC, gC=gC, gam=gam, strict=strict, KK=KK, A=A, U0=U0, W=W,
                           M=M, KG=KG, Sst=Sst, U=U, final=S)


def read_out(c, scale):
    """o [N,HV,NT,C,V] of forward_chunks' chunks: scale * (e^G (q^ S) + M U)."""
    return scale * ((c.qh * c.eG[..., None]) @ c.Sst + c.M @ c.U)
