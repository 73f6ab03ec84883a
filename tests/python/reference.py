"""The KLA / gated-delta-rule recurrence (SPEC §1) in float64 PyTorch, vectorised over heads: the
ground truth of the GPU tests, on the same rounded inputs the kernels see.

Per token and value head: S~ = exp(g) S; e = v - S~^T k; beta = eta / (|k|^2 + eps) (Kaczmarz;
0 where |k|^2 + eps = 0) or beta = eta (given); S = S~ + beta k e^T; o = S^T q * scale (or / |q|).
"""
import torch


def recurrence(q, k, v, g=None, eta=None, *, eta_value=1.0, eps=0.0, scale=None,
               initial_state=None, cu_seqlens=None, coefficient="kaczmarz", readout="scale"):
    """o [B,T,HV,V] float64 and the final states [N,HV,K,V] float64."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    rep = HV // H
    dev = q.device
    q64 = q.double().repeat_interleave(rep, dim=2)
    k64 = k.double().repeat_interleave(rep, dim=2)
    v64 = v.double()
    g64 = None if g is None else g.double()
    eta64 = None if eta is None else eta.double()
    scale = K ** -0.5 if scale is None else scale
    if cu_seqlens is None:
        seqs = [(b, 0, T) for b in range(B)]
    else:
        cu = [int(x) for x in cu_seqlens.tolist()]
        seqs = [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
    o = torch.zeros(B, T, HV, V, dtype=torch.float64, device=dev)
    finals = []
    for n, (b, t0, t1) in enumerate(seqs):
        S = (torch.zeros(HV, K, V, dtype=torch.float64, device=dev) if initial_state is None
             else initial_state[n].double().clone())
        for t in range(t0, t1):
            if g64 is not None:
                S = S * torch.exp(g64[b, t])[:, None, None]
            kt, vt, qt = k64[b, t], v64[b, t], q64[b, t]
            e = vt - torch.einsum("hkv,hk->hv", S, kt)
            et = eta64[b, t] if eta64 is not None else torch.full((HV,), eta_value,
                                                                  dtype=torch.float64, device=dev)
            if coefficient == "kaczmarz":
                nk = (kt * kt).sum(-1) + eps
                beta = torch.where(nk > 0, et / torch.where(nk > 0, nk, 1.0), 0.0)
            else:
                beta = et
            S = S + beta[:, None, None] * kt[:, :, None] * e[:, None, :]
            ot = torch.einsum("hkv,hk->hv", S, qt)
            if readout == "q_l2norm":
                nq = qt.norm(dim=-1)
                ot = torch.where(nq[:, None] > 0, ot / torch.where(nq > 0, nq, 1.0)[:, None], 0.0)
            else:
                ot = ot * scale
            o[b, t] = ot
        finals.append(S)
    return o, torch.stack(finals)


def rel_rms(x, ref):
    """Relative RMS error of x against ref (float64)."""
    x, ref = x.double(), ref.double()
    den = ref.square().mean().sqrt()
    return ((x - ref).square().mean().sqrt() / den).item()
