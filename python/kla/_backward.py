"""The backward pass of kla's forward ops (chunk_fwd, recurrent_fwd), in PyTorch.

This is the chunkwise backward of reference/include/kla/ref/grad_chunk.hpp (SPEC §8) written with
batched torch matrix products, so that autograd works through kla.chunk_kla and the given-beta
functions on any device while the CUDA backward kernels (issue 25) do not exist yet. It saves
nothing from the forward: it recomputes each chunk's incoming state from the inputs (fp32,
[N, HV, NT, K, V] for NT chunks of 64 tokens: the memory cost of the backward, beside the same
again for the state gradients), then runs two passes, one sequential over the chunks (the state
gradient, eq. (chunk_state) transposed) and one parallel over them (every input gradient).

Forms. The Kaczmarz coefficient is taken in the normalised-key form the kernels run: with
r = sqrt(|k|^2 + eps), k^ = k / r, v^ = v / r and beta = eta (0 where r = 0), which is the same
function as beta = eta / (|k|^2 + eps) with bounded chunk-system entries; given beta: k^ = k,
v^ = v, beta = eta. The q l2-norm read-out is q^ = q / |q| read out at scale 1, the qk l2-norm one
q^ = q / sqrt(|q|^2 + 1e-6) and k / sqrt(|k|^2 + 1e-6) before the coefficient, read out at the
scale. Each normalisation x^ = x * s(x), s = (|x|^2 + c)^-1/2, goes back as
dx = s (dx^ - x^ (x^ . dx^)) (and, for the key, v^'s share: dk = s (dk^ - k^ (k^ . dk^ + v^ . dv^)),
dv = s dv^), the chain of proofs_check grad.normalized_key.

Chunks (Γ_ij = exp(G_i - G_j), G the inclusive cumulative log decay within the chunk, A = I + L):
  L_ij = β_i Γ_ij k^_i.k^_j (j < i)        U = A^-1 (β V^) - A^-1 diag(β e^G) K^ S  = U0 - W S
  y_i  = e^G_i S^T q^_i + Σ_{j<=i} Γ_ij (q^_i.k^_j) u_j        o = scale * y
  S'   = e^G_C S + Σ_j Γ_Cj k^_j u_j^T
Sequences are padded to whole chunks with tokens that change nothing (k = v = q = 0, g = 0,
eta = 0), so varlen packs and ragged ends need no special case.

Numerical contract: the arithmetic of the inputs' compute type (fp32 for fp32 / bf16 / fp16
inputs, float64 for float64 ones, which only the tests pass), no TF32 unless the caller enabled
it for torch matmuls globally (torch.backends.cuda.matmul.allow_tf32, which this module leaves
alone). The back substitution with A^T amplifies rounding as the forward substitution does, and
A's entries are bounded by eta in the normalised-key form.
"""
import torch

NORM_EPS = 1e-6  # the qk l2-norm's epsilon (FLA's l2norm; kla.h KLA_READOUT_QK_L2NORM)
CHUNK = 64
SCALE, Q_L2NORM, QK_L2NORM = 0, 1, 2  # kla.h's kla_readout values
KACZMARZ, GIVEN = 0, 1  # kla.h's kla_coefficient values


def _normalised(x, c):
    """x * s with s = (|x|^2 + c)^-1/2 over the last dimension (s = 0 where |x|^2 + c = 0): the
    normalised x and s [..., 1]."""
    n2 = (x * x).sum(-1, keepdim=True) + c
    s = torch.where(n2 > 0, torch.rsqrt(torch.where(n2 > 0, n2, torch.ones_like(n2))),
                    torch.zeros_like(n2))
    return x * s, s


def _normalised_backward(xh, s, dxh, extra=None):
    """The gradient of x from that of x^ = x * s(x) (see the module docstring); `extra` adds
    (y^ . dy^) for a y^ = y * s(x) that shares the scale (the Kaczmarz value)."""
    dot = (xh * dxh).sum(-1, keepdim=True)
    if extra is not None:
        dot = dot + extra
    return s * (dxh - xh * dot)


class _Layout:
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


def chunk_backward(q, k, v, g, eta, initial_state, cu_seqlens, cu_seqlens_cpu, scale, eps,
                   eta_value, coefficient, readout, do, dht):
    """Gradients (dq, dk, dv, dg, deta, dh0) of the forward with these arguments (ops.py's
    chunk_fwd / recurrent_fwd) given do [B,T,HV,V] and dht [N,HV,K,V] (None: zero). dq, dk in
    q's dtype [B,T,H,K] (summed over each key head's value heads), dv in v's; dg, deta [B,T,HV]
    and dh0 [N,HV,K,V] in the dtypes of g, eta and initial_state (fp32 from the ops), None where
    that input is None."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    group = HV // H
    dev = q.device
    cd = torch.float64 if q.dtype == torch.float64 else torch.float32
    cu = None
    if cu_seqlens is not None:
        cu = [int(x) for x in (cu_seqlens_cpu if cu_seqlens_cpu is not None
                               else cu_seqlens).tolist()]
    lay = _Layout(B, T, cu, dev)
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
    dy = lay.chunks(do, cd) * (1.0 if readout == Q_L2NORM else scale)

    # The prologue: q^, k^, v^ and the scales the chain rule needs.
    qs = ks = kns = None
    if readout == Q_L2NORM:
        qh, qs = _normalised(q0, 0.0)
    elif readout == QK_L2NORM:
        qh, qs = _normalised(q0, NORM_EPS)
    else:
        qh = q0
    k1 = k0
    if readout == QK_L2NORM:
        k1, kns = _normalised(k0, NORM_EPS)
    if coefficient == KACZMARZ:
        kh, ks = _normalised(k1, eps)
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

    # Backward over the chunks: the gradient of each chunk's outgoing state.
    MtdY = M.transpose(-1, -2) @ dy
    QdY = (qh * eG[..., None]).transpose(-1, -2) @ dy
    dS = dht.to(cd) if dht is not None else q0.new_zeros(N, HV, K, V)
    douts = [None] * NT
    for c in reversed(range(NT)):
        douts[c] = dS
        dUc = MtdY[:, :, c] + KG[:, :, c] @ dS
        dS = eGC[:, :, c, None, None] * dS + QdY[:, :, c] - W[:, :, c].transpose(-1, -2) @ dUc
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
    dR = torch.linalg.solve_triangular(A.transpose(-1, -2), dU, upper=True, unitriangular=True)
    dL = -(dR @ U.transpose(-1, -2)).masked_fill(~strict, 0.0)
    dLg = dL * gam
    Z = dLg * beta[..., None]
    dkh = dkh + Z @ kh + Z.transpose(-1, -2) @ kh
    Y = Z * KK
    dG = dG + Y.sum(-1) - Y.sum(-2)
    dbeta = (dLg * KK).sum(-1)
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
    if coefficient == KACZMARZ:
        dk1 = _normalised_backward(kh, ks, dkh, extra=(vh * dvh).sum(-1, keepdim=True))
        dv0 = ks * dvh
    else:
        dk1, dv0 = dkh, dvh
    dk0 = _normalised_backward(k1, kns, dk1) if readout == QK_L2NORM else dk1
    dq0 = _normalised_backward(qh, qs, dqh) if qs is not None else dqh

    def per_key_head(x):  # [B,T,HV,K] -> [B,T,H,K], summed over each key head's value heads
        return x if group == 1 else x.view(B, T, H, group, K).sum(3)

    dq = per_key_head(lay.tokens(dq0)).to(q.dtype)
    dk = per_key_head(lay.tokens(dk0)).to(k.dtype)
    dv = lay.tokens(dv0).to(v.dtype)
    dg = lay.tokens(dgl * valid).to(g.dtype) if g is not None else None
    deta = lay.tokens(dbeta * valid).to(eta.dtype) if eta is not None else None
    dh0 = dh0.to(initial_state.dtype) if initial_state is not None else None
    return dq, dk, dv, dg, deta, dh0
