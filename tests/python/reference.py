"""The KLA / gated-delta-rule recurrence (SPEC §1) in float64 PyTorch, vectorised over heads: the
ground truth of the GPU tests, on the same rounded inputs the kernels see.

Per token and value head: S~ = exp(g) S; e = v - S~^T k; beta = eta / (|k|^2 + eps) (Kaczmarz;
0 where |k|^2 + eps = 0) or beta = eta (given); S = S~ + beta k e^T; o = S^T q * scale (or / |q|;
or, readout "qk_l2norm", q and k first replaced by x / sqrt(|x|^2 + 1e-6) and o = S^T q * scale).
Written with differentiable torch operations only: autograd through it (in float64) is the
independent oracle of the backward pass's tests.
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
    if readout == "qk_l2norm":
        q64 = q64 / torch.sqrt(q64.square().sum(-1, keepdim=True) + 1e-6)
        k64 = k64 / torch.sqrt(k64.square().sum(-1, keepdim=True) + 1e-6)
    v64 = v.double()
    g64 = None if g is None else g.double()
    eta64 = None if eta is None else eta.double()
    scale = K ** -0.5 if scale is None else scale
    if cu_seqlens is None:
        seqs = [(b, 0, T) for b in range(B)]
    else:
        cu = [int(x) for x in cu_seqlens.tolist()]
        seqs = [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
    rows = [[None] * T for _ in range(B)]
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
            rows[b][t] = ot
        finals.append(S)
    zero = torch.zeros(HV, V, dtype=torch.float64, device=dev)
    o = torch.stack([torch.stack([r if r is not None else zero for r in row]) for row in rows])
    return o, torch.stack(finals)


def gradients(q, k, v, g, eta, h0, do, dht, *, cu_seqlens=None, eta_value=1.0, eps=0.0,
              scale=None, coefficient="kaczmarz", readout="scale"):
    """[dq, dk, dv, dg, deta, dh0] (float64; None for an input that is None) of
    <o, do> + <final, dht> by torch's autograd through `recurrence`: the oracle of the backward
    pass's tests, on the same rounded inputs."""
    leaves = [None if x is None else x.detach().double().requires_grad_(True)
              for x in (q, k, v, g, eta, h0)]
    o, final = recurrence(*leaves[:5], eta_value=eta_value, eps=eps, scale=scale,
                          initial_state=leaves[5], cu_seqlens=cu_seqlens,
                          coefficient=coefficient, readout=readout)
    loss = (o * do.double()).sum() + (final * dht.double()).sum()
    want = [x for x in leaves if x is not None]
    got = iter(torch.autograd.grad(loss, want))
    return [None if x is None else next(got) for x in leaves]


def rel_max(x, ref):
    """Largest absolute error of x over the RMS of ref (float64)."""
    ref = ref.double()
    return ((x.double() - ref).abs().max() / ref.square().mean().sqrt()).item()


def rel_rms(x, ref):
    """Relative RMS error of x against ref (float64)."""
    x, ref = x.double(), ref.double()
    den = ref.square().mean().sqrt()
    return ((x - ref).square().mean().sqrt() / den).item()
