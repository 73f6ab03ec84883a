"""The ops as torch sees them (CPU): fake-tensor shapes, torch.library.opcheck, torch.compile
with fullgraph=True over every function, and the autograd error."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import kla
from kla import _params as P


def test_fake_tensor_shapes_on_fake_cuda():
    with FakeTensorMode():
        q = torch.empty(1, 50, 2, 64, device="cuda", dtype=torch.float16)
        v = torch.empty(1, 50, 6, 128, device="cuda", dtype=torch.float16)
        g = torch.empty(1, 50, 6, device="cuda")
        cu = torch.tensor([0, 10, 50], device="cuda")
        o, s = kla.chunk_kla(q, q, v, g, g, cu_seqlens=cu, output_final_state=True)
        assert (o.shape, o.dtype, o.device.type) == (v.shape, torch.float16, "cuda")
        assert (s.shape, s.dtype) == ((2, 6, 64, 128), torch.float32)
        o, s = kla.chunk_gated_delta_rule(q, q, v, g, g, output_final_state=True,
                                          state_v_first=True)
        assert s.shape == (1, 6, 128, 64)
        o, s = kla.fused_recurrent_gated_delta_rule(q, q, v, g, beta=g)
        assert o.shape == v.shape and s is None
        pool = torch.empty(9, 6, 64, 128, device="cuda")
        o, s = kla.fused_recurrent_kla(q[:, :1], q[:, :1], v[:, :1], initial_state=pool,
                                       ssm_state_indices=torch.tensor([3], device="cuda"))
        assert o.shape == (1, 1, 6, 128) and s is pool


def _layer(q, k, v, g, eta, h, pool, idx):
    o, s = kla.chunk_kla(q, k, v, g, eta, output_final_state=True)
    o2, _ = kla.fused_recurrent_kla(q[:, -1:], k[:, -1:], v[:, -1:], g[:, -1:], eta[:, -1:],
                                    initial_state=h, inplace_final_state=True)
    o3, s3 = kla.chunk_gated_delta_rule(q, k, v, g, eta, use_qk_l2norm_in_kernel=True,
                                        output_final_state=True, state_v_first=True)
    o4, _ = kla.fused_recurrent_gated_delta_rule(q[:, -1:], k[:, -1:], v[:, -1:], g[:, -1:],
                                                 beta=eta[:, -1:], initial_state=pool,
                                                 ssm_state_indices=idx)
    return o * 2, s, o2, o3, s3, o4


def _meta_inputs():
    B, T, H, HV, K, V = 2, 70, 2, 4, 64, 128
    m = dict(device="meta")
    return (torch.empty(B, T, H, K, dtype=torch.bfloat16, **m),
            torch.empty(B, T, H, K, dtype=torch.bfloat16, **m),
            torch.empty(B, T, HV, V, dtype=torch.bfloat16, **m),
            torch.empty(B, T, HV, **m), torch.empty(B, T, HV, **m),
            torch.empty(B, HV, K, V, **m), torch.empty(5, HV, K, V, **m),
            torch.tensor([4, -1]))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compile_fullgraph(backend):
    torch._dynamo.reset()
    args = _meta_inputs()
    out = torch.compile(_layer, backend=backend, fullgraph=True)(*args)
    want = _layer(*args)
    assert [(x.shape, x.dtype) for x in out] == [(x.shape, x.dtype) for x in want]
    assert out[4].shape == (2, 4, 128, 64)


def test_compile_graph_holds_the_ops():
    torch._dynamo.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch.compile(_layer, backend=backend, fullgraph=True)(*_meta_inputs())
    code = graphs[0].code
    for op in ("kla.chunk_fwd", "kla.recurrent_fwd_inplace"):
        assert op in code, code


def _op_args(q, k, v, g, eta, h):
    return {
        "chunk": (torch.ops.kla.chunk_fwd.default,
                  (q, k, v, g, eta, h, None, None, 0.125, 1e-6, 1.0, P.COEFF_KACZMARZ,
                   P.READOUT_SCALE, True, P.ARITHMETIC_ACCURATE, P.PATH_AUTO, 0)),
        "recurrent": (torch.ops.kla.recurrent_fwd.default,
                      (q, k, v, g, eta, h, None, None, 0.125, 1e-6, 1.0, P.COEFF_GIVEN,
                       P.READOUT_SCALE, True)),
        "inplace": (torch.ops.kla.recurrent_fwd_inplace.default,
                    (q, k, v, g, eta, h.clone(), None, None, None, None, 0.125, 1e-6, 1.0,
                     P.COEFF_KACZMARZ, P.READOUT_SCALE)),
    }


@pytest.mark.parametrize("op", ["chunk", "recurrent", "inplace"])
def test_opcheck(launched, op):
    """torch.library.opcheck's schema / fake / autograd-registration checks, with the launch
    replaced by the library's validation (conftest.launched)."""
    torch.manual_seed(0)
    B, T, H, HV, K, V = 2, 9, 2, 4, 64, 64
    q, k = torch.randn(B, T, H, K), torch.randn(B, T, H, K)
    v = torch.randn(B, T, HV, V)
    g, eta = -torch.rand(B, T, HV), torch.rand(B, T, HV)
    h = torch.randn(B, HV, K, V)
    fn, args = _op_args(q, k, v, g, eta, h)[op]
    tests = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(fn, args, test_utils=tests)


@pytest.mark.parametrize("fn", ["chunk_kla", "fused_recurrent_kla", "chunk_gated_delta_rule",
                                "fused_recurrent_gated_delta_rule"])
def test_backward_traces_under_compile(launched, fn):
    """torch.compile(fullgraph=True) over forward and backward: the backward is the kla::chunk_bwd
    op (no graph break) and gives the eager gradients. The forward's launch is the recorder; the
    backward reads only the inputs (test_backward.py checks its numbers)."""
    torch.manual_seed(1)
    q, k, v = torch.randn(1, 70, 2, 64), torch.randn(1, 70, 2, 64), torch.randn(1, 70, 2, 64)
    g, beta = -torch.rand(1, 70, 2), torch.rand(1, 70, 2)
    k = torch.nn.functional.normalize(k, dim=-1)
    w, ws = torch.randn(1, 70, 2, 64), torch.randn(1, 2, 64, 64)

    def loss(q, k, v, g, beta):
        if fn == "chunk_gated_delta_rule":
            o, s = kla.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)
        elif fn == "fused_recurrent_gated_delta_rule":
            o, s = kla.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta,
                                                        output_final_state=True)
        else:
            o, s = getattr(kla, fn)(q, k, v, g, beta, output_final_state=True)
        # The recorder leaves o and the state unwritten: the loss's value is garbage, its
        # gradients (w, ws) are not, and they are all the backward reads.
        return (o * w).sum() + (s * ws).sum()

    grads = []
    for f in (loss, torch.compile(loss, fullgraph=True, backend="aot_eager")):
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v, g, beta)]
        f(*leaves).backward()
        grads.append([x.grad for x in leaves])
    for a, b in zip(*grads):
        assert a is not None and torch.isfinite(a).all()
        torch.testing.assert_close(a, b)
