"""kla.torch_impl (the chunkwise forward in PyTorch, differentiated by autograd) and kla.nn.KLA on
the CPU: against the float64 recurrence of reference.py and its autograd gradients, against the
hand-written backward (_backward.py), and the layer's contracts (FLA's constructor arguments,
errors, packed sequences equal to separate ones). Fresh random inputs every run; the seed is in
the failure message. Bounds in float64 as test_backward.py's (1000 u64, max-abs over RMS)."""
import os

import pytest
import torch

import kla
from kla import _backward, nn as kla_nn, torch_impl
from kla import _params as P
from reference import gradients, recurrence, rel_max

SEED = int.from_bytes(os.urandom(4), "little")
TOL64 = 1000 * 2.0**-53


def draw(seed, B, T, H, HV, K, V, unit_keys):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, T, H, K, generator=gen, dtype=torch.float64), \
        torch.randn(B, T, H, K, generator=gen, dtype=torch.float64)
    if unit_keys:
        k = k / k.norm(dim=-1, keepdim=True)
    v = torch.randn(B, T, HV, V, generator=gen, dtype=torch.float64)
    g = -torch.rand(B, T, HV, generator=gen, dtype=torch.float64) * 0.5
    eta = torch.rand(B, T, HV, generator=gen, dtype=torch.float64) * 0.9 + 0.05
    return q, k, v, g, eta


CASES = [(c, r, lay) for c in ("kaczmarz", "given") for r in ("scale", "q_l2norm", "qk_l2norm")
         for lay in ("dense", "varlen")
         if not (c == "given" and r == "q_l2norm")]  # FLA's GDN function has no q-only norm


@pytest.mark.parametrize("case", CASES, ids=["-".join(c) for c in CASES])
def test_torch_impl_forward_and_autograd_equal_the_recurrence(case):
    coefficient, readout, layout = case
    given = coefficient == "given"
    B, T, H, HV, K, V = (1, 150, 2, 4, 16, 8) if layout == "varlen" else (2, 100, 1, 2, 16, 8)
    q, k, v, g, eta = draw(SEED, B, T, H, HV, K, V, unit_keys=given)
    cu = torch.tensor([0, 0, 1, 70, 150]) if layout == "varlen" else None
    N = 4 if cu is not None else B
    h0 = torch.randn(N, HV, K, V, dtype=torch.float64) * 0.3
    scale = None if readout == "q_l2norm" else 0.41
    ref_o, ref_s = recurrence(q, k, v, g, eta, eps=0.0 if given else 1e-6, scale=scale,
                              initial_state=h0, cu_seqlens=cu, coefficient=coefficient,
                              readout=readout)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v, g, eta, h0)]
    kw = dict(scale=scale, initial_state=leaves[5], output_final_state=True, cu_seqlens=cu,
              use_qk_l2norm_in_kernel=readout == "qk_l2norm")
    if given:
        o, s = torch_impl.chunk_gated_delta_rule(*leaves[:5], **kw)
    else:
        o, s = torch_impl.chunk_kla(*leaves[:5], eps=1e-6,
                                    readout="q_l2norm" if readout == "q_l2norm" else "scale", **kw)
    assert rel_max(o, ref_o) <= TOL64 and rel_max(s, ref_s) <= TOL64, f"seed {SEED}"
    gen = torch.Generator().manual_seed(SEED + 1)
    do = torch.randn(o.shape, generator=gen, dtype=torch.float64)
    dht = torch.randn(s.shape, generator=gen, dtype=torch.float64)
    ((o * do).sum() + (s * dht).sum()).backward()
    want = gradients(q, k, v, g, eta, h0, do, dht, cu_seqlens=cu, eps=0.0 if given else 1e-6,
                     scale=scale, coefficient=coefficient, readout=readout)
    hand = _backward.chunk_backward(
        q, k, v, g, eta, h0, cu, None, 0.0 if scale is None else scale,
        0.0 if given else 1e-6, 1.0, P.COEFF_GIVEN if given else P.COEFF_KACZMARZ,
        {"scale": P.READOUT_SCALE, "q_l2norm": P.READOUT_Q_L2NORM,
         "qk_l2norm": P.READOUT_QK_L2NORM}[readout], do, dht)
    for name, leaf, ref, h in zip(("dq", "dk", "dv", "dg", "deta", "dh0"), leaves, want, hand):
        assert rel_max(leaf.grad, ref) <= TOL64, f"{case} {name} seed {SEED}"
        assert rel_max(h, leaf.grad) <= TOL64, f"{case} {name}: hand vs autograd, seed {SEED}"


def test_torch_impl_checks_its_arguments():
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(ValueError, match="v must be"):
        torch_impl.chunk_kla(q, q, torch.randn(1, 7, 2, 16))
    with pytest.raises(ValueError, match="needs beta"):
        torch_impl.chunk_gated_delta_rule(q, q, q, None, None)
    with pytest.raises(TypeError, match="one of"):
        torch_impl.chunk_kla(q.int(), q.int(), q.int())
    q64 = q.double()  # float64 inputs get the same shape checks
    with pytest.raises(ValueError, match="g must be"):
        torch_impl.chunk_kla(q64, q64, q64, torch.zeros(1, 8, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="initial_state must be"):
        torch_impl.chunk_kla(q64, q64, q64, initial_state=torch.zeros(1, 2, 16, 15))


def test_causal_conv_is_conv1d_and_stays_inside_each_sequence():
    gen = torch.Generator().manual_seed(SEED)
    x = torch.randn(1, 40, 6, generator=gen)
    w = torch.randn(6, 4, generator=gen)
    ref = torch.nn.functional.conv1d(torch.nn.functional.pad(x.transpose(1, 2), (3, 0)),
                                     w[:, None, :], groups=6).transpose(1, 2)
    assert torch.allclose(kla_nn._causal_conv(x, w, None, None), ref, atol=1e-5)
    cu = torch.tensor([0, 13, 13, 40])
    got = kla_nn._causal_conv(x, w, None, cu)
    for a, b in ((0, 13), (13, 40)):
        alone = kla_nn._causal_conv(x[:, a:b], w, None, None)
        assert torch.allclose(got[:, a:b], alone, atol=1e-6)


def layer(**kw):
    torch.manual_seed(SEED % 1000)
    args = dict(hidden_size=32, head_dim=16, num_heads=2, expand_v=1.5, impl="torch")
    args.update(kw)
    return kla_nn.KLA(**args)


def test_layer_takes_flas_arguments_and_refuses_others():
    m = layer(num_v_heads=4, mode="fused_recurrent", use_gate=True, use_short_conv=True,
              allow_neg_eigval=True, conv_size=3, conv_bias=True, layer_idx=0, norm_eps=1e-6)
    assert (m.num_heads, m.num_v_heads, m.head_k_dim, m.head_v_dim) == (2, 4, 16, 24)
    with pytest.raises(TypeError, match="'use_foo'"):
        layer(use_foo=True)
    with pytest.raises(ValueError, match="mode"):
        layer(mode="parallel")
    with pytest.raises(ValueError, match="num_v_heads"):
        layer(num_v_heads=3)
    with pytest.raises(ValueError, match="impl"):
        layer(impl="triton")
    with pytest.raises(ValueError, match="arithmetic"):
        layer(arithmetic="tf32")
    assert layer(arithmetic="fast").arithmetic == "fast"
    x = torch.randn(1, 5, 32)
    with pytest.raises(ValueError, match="not both"):
        layer()(x, attention_mask=torch.tensor([[1, 1, 1, 0, 0]]), cu_seqlens=torch.tensor([0, 5]))
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        layer()(x, attention_mask=torch.ones(1, 4))
    with pytest.raises(NotImplementedError, match="use_cache"):
        layer()(x, use_cache=True)


@pytest.mark.parametrize("readout", ["q_l2norm", "scale", "qk_l2norm"])
@pytest.mark.parametrize("use_short_conv", [True, False])
def test_layer_packed_sequences_equal_separate_ones(readout, use_short_conv):
    """Two sequences packed with cu_seqlens give each one's own output (the convolution and the
    state reset at the boundary), and every parameter gets a finite gradient."""
    m = layer(readout=readout, use_short_conv=use_short_conv, num_v_heads=4).double()
    gen = torch.Generator().manual_seed(SEED)
    x = torch.randn(1, 90, 32, generator=gen, dtype=torch.float64)
    cu = torch.tensor([0, 37, 90])
    y, _, _ = m(x, cu_seqlens=cu)
    assert y.shape == x.shape
    for a, b in ((0, 37), (37, 90)):
        alone, _, _ = m(x[:, a:b])
        assert rel_max(y[:, a:b], alone) <= TOL64, f"seed {SEED}"
    y.square().sum().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        if name != "q_conv1d.bias":
            assert p.grad.abs().sum() > 0, name


def test_layer_padding_mask_runs_each_rows_real_tokens():
    """FLA's attention_mask (left and right padding): each row's output at its real tokens is
    that row's tokens run alone, its padded positions are zero, gradients reach the inputs."""
    m = layer(num_v_heads=4).double()
    gen = torch.Generator().manual_seed(SEED)
    x = torch.randn(3, 20, 32, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(3, 20, dtype=torch.long)
    mask[0, :7] = 0  # left padding
    mask[1, 15:] = 0  # right padding
    y, _, _ = m(x, attention_mask=mask)
    for b in range(3):
        real = mask[b].bool()
        alone, _, _ = m(x[b:b + 1, real])
        assert rel_max(y[b, real], alone[0]) <= TOL64, f"row {b}, seed {SEED}"
        assert (y[b, ~real] == 0).all()
    y.square().sum().backward()
    assert torch.isfinite(x.grad).all() and (x.grad[0, :7] == 0).all()
    unmasked, _, _ = m(x, attention_mask=torch.ones(3, 20))
    assert torch.equal(unmasked, m(x)[0])
