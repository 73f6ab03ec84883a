"""The backward pass (python/kla/_backward.py, torch.ops.kla.chunk_bwd) against autograd through the
float64 recurrence of reference.py: an independent oracle (torch's own differentiation of the
tokenwise recurrence; the code under test is the chunkwise backward, written by hand).

CPU only: the backward is PyTorch, so its arithmetic is the same on any device; test_gpu.py runs
the autograd wiring through the real kernels. Inputs are fresh random draws at every run (the seed
is in the failure message); tolerances, in units of the compute type's unit roundoff u:
  * float64 compute: 1000 u64 = 1.1e-13, max-abs error over the gradient's RMS. Measured worst
    over 32 draws of every case: 3.9e-14 (350 u64). The bound is 2.8x that because a maximum over
    ~10^4 entries has a long tail between draws (re-measured in round 2, session 31 over 901
    draws of the cases in turn: median 102 u64, worst 349); any wrong term (a dropped carry,
    decay or coefficient term) is O(1), a wrong rounding of an input O(u32) = 1e-8 away;
  * fp32 compute (fp32 inputs, what the GPU runs): 20 u32 = 1.2e-6 relative RMS, 1.5x the
    measured worst of 7.9e-7 (dg; 32 draws): roundoff through T <= 200 tokens, four chunks and
    the back substitution. Re-measured over 1,200 draws (round 2, session 31): median 8.6 u32,
    99.9th percentile 14.0, worst 16.0 (dg), 0.8 of the bound.
Each bound was shown to fail for planted faults in _backward.py (dropping the carry's decay term,
the Kaczmarz value term of the key chain, one side of the Gram term): docs/python.md, 'Backward'.
"""
import os

import pytest
import torch

import kla
from kla import _backward
from kla import _params as P
from reference import gradients, rel_max, rel_rms

GENERATOR_SEED = int.from_bytes(os.urandom(4), "little")
TOL64 = 1000 * 2.0**-53  # max-abs / RMS, float64 compute (module docstring)
TOL32 = 20 * 2.0**-24  # relative RMS, fp32 compute


def draw(seed, B, T, H, HV, K, V, dtype=torch.float64, *, knorm=None, zero_keys=False):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    q, k, v = randn(B, T, H, K), randn(B, T, H, K), randn(B, T, HV, V)
    if knorm is not None:
        k = k / k.norm(dim=-1, keepdim=True) * knorm
    if zero_keys:  # every third token's key is zero (the degenerate coefficient at eps = 0)
        k[:, ::3] = 0.0
    g = -torch.rand(B, T, HV, generator=gen, dtype=torch.float64) * 0.5
    eta = torch.rand(B, T, HV, generator=gen, dtype=torch.float64) * 0.9 + 0.05
    return [x.to(dtype) for x in (q, k, v, g, eta)]


def oracle(q, k, v, g, eta, h0, do, dht, *, scale, readout, **kw):
    return gradients(q, k, v, g, eta, h0, do, dht, scale=None if readout == "q_l2norm" else scale,
                     readout=readout, **kw)


READOUT = {"scale": P.READOUT_SCALE, "q_l2norm": P.READOUT_Q_L2NORM,
           "qk_l2norm": P.READOUT_QK_L2NORM}
COEFF = {"kaczmarz": P.COEFF_KACZMARZ, "given": P.COEFF_GIVEN}
NAMES = ("dq", "dk", "dv", "dg", "deta", "dh0")


def compare(case, dtype, seed, *, measure, tol, with_eta=True, eta_value=1.0, knorm=None,
            zero_keys=False, eps=1e-6, with_g=True):
    coefficient, readout, layout = case
    B, T, H, HV, K, V = (1, 200, 2, 6, 32, 24) if layout == "varlen" else (2, 150, 2, 4, 32, 16)
    if coefficient == "given" and knorm is None:
        knorm = 1.0  # the given-beta rule is stable for beta |k|^2 <= 2 only (as GDN's users have)
    q, k, v, g, eta = draw(seed, B, T, H, HV, K, V, knorm=knorm, zero_keys=zero_keys)
    cu = torch.tensor([0, 0, 1, 65, 130, 200]) if layout == "varlen" else None
    N = 5 if cu is not None else B
    gen = torch.Generator().manual_seed(seed + 1)
    h0 = torch.randn(N, HV, K, V, generator=gen, dtype=torch.float64) * 0.3
    do = torch.randn(B, T, HV, V, generator=gen, dtype=torch.float64)
    dht = torch.randn(N, HV, K, V, generator=gen, dtype=torch.float64)
    if not with_eta:
        eta = None
    if not with_g:
        g = None
    scale = 0.37
    want = oracle(q, k, v, g, eta, h0, do, dht, cu_seqlens=cu, eta_value=eta_value, eps=eps,
                  scale=scale, coefficient=coefficient, readout=readout)
    cast = [None if x is None else x.to(dtype) for x in (q, k, v)]
    fp32 = [None if x is None else x.to(torch.float32 if dtype != torch.float64 else dtype)
            for x in (g, eta, h0)]
    got = _backward.chunk_backward(*cast, *fp32, cu, None, scale if readout != "q_l2norm" else 0.0,
                                   eps, eta_value, COEFF[coefficient], READOUT[readout],
                                   do.to(dtype), dht.to(torch.float32 if dtype != torch.float64
                                                        else dtype))
    worst = {}
    for name, x, ref in zip(NAMES, got, want):
        if ref is None:
            assert x is None, name
            continue
        assert x.shape == ref.shape, name
        assert torch.isfinite(x).all(), f"{name}: not finite (seed {seed})"
        worst[name] = measure(x, ref)
    bad = {n: e for n, e in worst.items() if not e <= tol}
    assert not bad, f"{case} seed {seed}: {bad} above {tol} (all: {worst})"
    return worst


CASES = [(c, r, lay) for c in COEFF for r in READOUT for lay in ("dense", "varlen")]


@pytest.mark.parametrize("case", CASES, ids=["-".join(c) for c in CASES])
def test_float64_equals_autograd_of_the_recurrence(case):
    compare(case, torch.float64, GENERATOR_SEED, measure=rel_max, tol=TOL64)


@pytest.mark.parametrize("case", CASES, ids=["-".join(c) for c in CASES])
def test_fp32_compute_within_its_roundoff(case):
    compare(case, torch.float32, GENERATOR_SEED + 7, measure=rel_rms, tol=TOL32)


@pytest.mark.parametrize("knorm", [1e-3, 30.0])
def test_key_norm_extremes(knorm):
    """Tiny and huge keys at eps = 1e-6: the normalised-key form keeps the solve bounded."""
    compare(("kaczmarz", "scale", "dense"), torch.float64, GENERATOR_SEED + 11, measure=rel_max,
            tol=TOL64, knorm=knorm)


def test_zero_keys_at_eps_zero_are_finite_and_exact():
    """k = 0 with eps = 0: beta is the constant 0 (the degenerate convention), the gradient
    flows around it; nothing NaN."""
    compare(("kaczmarz", "scale", "varlen"), torch.float64, GENERATOR_SEED + 13, measure=rel_max,
            tol=TOL64, zero_keys=True, eps=0.0)


def test_constant_eta_and_no_decay():
    compare(("kaczmarz", "qk_l2norm", "dense"), torch.float64, GENERATOR_SEED + 17,
            measure=rel_max, tol=TOL64, with_eta=False, eta_value=0.6, with_g=False)


def test_no_sequence_tokens():
    """Every sequence empty: no chunk at all; dh0 = dht and the token gradients are empty."""
    q, k, v, g, eta = draw(1, 1, 0, 1, 1, 16, 16)
    cu = torch.tensor([0, 0, 0])
    h0, dht = torch.randn(2, 1, 16, 16, dtype=torch.float64), torch.randn(2, 1, 16, 16,
                                                                          dtype=torch.float64)
    dq, dk, dv, dg, deta, dh0 = _backward.chunk_backward(
        q, k, v, g, eta, h0, cu, None, 0.25, 1e-6, 1.0, P.COEFF_KACZMARZ, P.READOUT_SCALE,
        torch.zeros(1, 0, 1, 16, dtype=torch.float64), dht)
    assert dq.shape == q.shape and dv.shape == v.shape and dg.shape == g.shape
    assert torch.equal(dh0, dht)
    assert dq.numel() == 0 and dg.numel() == 0 and deta.numel() == 0


# ---- the autograd wiring: kla's functions through torch.ops.kla.chunk_bwd ------------------------
def _functions():
    return {
        "chunk_kla": lambda q, k, v, g, eta, h0: kla.chunk_kla(
            q, k, v, g, eta, eps=1e-6, scale=0.37, initial_state=h0, output_final_state=True),
        "fused_recurrent_kla": lambda q, k, v, g, eta, h0: kla.fused_recurrent_kla(
            q, k, v, g, eta, eps=1e-6, scale=0.37, initial_state=h0, output_final_state=True),
        "chunk_gated_delta_rule": lambda q, k, v, g, eta, h0: kla.chunk_gated_delta_rule(
            q, k, v, g, eta, scale=0.37, initial_state=h0, output_final_state=True,
            use_qk_l2norm_in_kernel=True),
        "fused_recurrent_gated_delta_rule": lambda q, k, v, g, eta, h0:
            kla.fused_recurrent_gated_delta_rule(q, k, v, g, beta=eta, scale=0.37,
                                                 initial_state=h0, output_final_state=True),
    }


@pytest.mark.parametrize("fn", sorted(_functions()))
def test_autograd_through_the_public_functions(launched, fn):
    """loss.backward() through each public function gives the oracle's gradients for q, k, v, g,
    eta (beta) and the initial state. The forward's launch is the recorder (conftest.launched):
    the backward reads only the inputs, so the gradients are real."""
    B, T, H, HV, K, V = 1, 70, 2, 4, 64, 64
    given = "gated_delta_rule" in fn
    q, k, v, g, eta = draw(GENERATOR_SEED + 19, B, T, H, HV, K, V, torch.float32,
                           knorm=1.0 if given else None)
    h0 = torch.randn(B, HV, K, V) * 0.3
    do, dht = torch.randn(B, T, HV, V), torch.randn(B, HV, K, V)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v, g, eta, h0)]
    o, final = _functions()[fn](*leaves)
    ((o * do).sum() + (final * dht).sum()).backward()
    want = oracle(q, k, v, g, eta, h0, do, dht, eps=0.0 if given else 1e-6, scale=0.37,
                  coefficient="given" if given else "kaczmarz",
                  readout="qk_l2norm" if fn == "chunk_gated_delta_rule" else "scale")
    for name, leaf, ref in zip(NAMES, leaves, want):
        assert leaf.grad is not None, name
        assert leaf.grad.dtype == leaf.dtype
        assert rel_rms(leaf.grad, ref) <= TOL32, (fn, name, rel_rms(leaf.grad, ref))


def test_bf16_inputs_get_bf16_gradients(launched):
    q, k, v, g, eta = draw(GENERATOR_SEED + 23, 1, 20, 1, 1, 16, 16, torch.bfloat16)
    q.requires_grad_(True)
    v.requires_grad_(True)
    g = g.float().requires_grad_(True)
    o, _ = kla.chunk_kla(q, k, v, g, eta.float())
    o.float().sum().backward()
    assert q.grad.dtype == torch.bfloat16 and v.grad.dtype == torch.bfloat16
    assert g.grad.dtype == torch.float32 and torch.isfinite(g.grad).all()


def test_inplace_decode_has_no_backward(launched):
    q = torch.randn(1, 4, 2, 64, requires_grad=True)
    k, v = torch.randn(1, 4, 2, 64), torch.randn(1, 4, 2, 64)
    o, _ = kla.fused_recurrent_kla(q, k, v, initial_state=torch.zeros(1, 2, 64, 64),
                                   inplace_final_state=True)
    with pytest.raises(NotImplementedError, match="in place"):
        o.sum().backward()


def test_opcheck_chunk_bwd():
    """The backward op's schema and fake kernel (torch.library.opcheck), on CPU tensors."""
    q, k, v, g, eta = draw(3, 1, 40, 2, 4, 16, 16, torch.float32)
    h0, do, dht = torch.randn(1, 4, 16, 16), torch.randn(1, 40, 4, 16), torch.randn(1, 4, 16, 16)
    args = (q, k, v, g, eta, h0, None, None, 0.25, 1e-6, 1.0, P.COEFF_KACZMARZ, P.READOUT_SCALE,
            do, dht)
    torch.library.opcheck(torch.ops.kla.chunk_bwd.default, args,
                          test_utils=("test_schema", "test_faketensor"))
    args = (q, k, v, None, None, None, None, None, 0.25, 1e-6, 1.0, P.COEFF_GIVEN,
            P.READOUT_SCALE, do, None)
    torch.library.opcheck(torch.ops.kla.chunk_bwd.default, args,
                          test_utils=("test_schema", "test_faketensor"))
