"""The eager decode path (_fast.py, CPU): it passes the general path's kla_params, and hands
every call it is not for back to the general path (None)."""
import pytest
import torch

import kla
from kla import _fast
from kla import _params as P


@pytest.fixture
def fast(launched, monkeypatch):
    """_fast.run's calls, recorded (params bytes) instead of launched."""
    calls = []

    def record(p, dev):
        params = P.KlaParams.from_buffer_copy(bytes(p))
        launched.lib.validate(params)
        calls.append(P.as_dict(params))
        return 0
    monkeypatch.setattr(_fast, "_launch", record)
    return calls


def decode_inputs(B=2, T=1, H=2, HV=4, K=64, V=128, dtype=torch.bfloat16):
    torch.manual_seed(0)
    return (torch.randn(B, T, H, K, dtype=dtype), torch.randn(B, T, H, K, dtype=dtype),
            torch.randn(B, T, HV, V, dtype=dtype), -torch.rand(B, T, HV), torch.rand(B, T, HV),
            torch.zeros(B, HV, K, V))


OPTS = [  # (inplace, output_final_state, with g, with eta, readout, scale, coefficient)
    (True, False, True, True, P.READOUT_SCALE, None, P.COEFF_KACZMARZ),
    (False, True, True, False, P.READOUT_SCALE, 0.3, P.COEFF_GIVEN),
    (False, False, False, True, P.READOUT_Q_L2NORM, None, P.COEFF_KACZMARZ),
]


@pytest.mark.parametrize("inplace,final,with_g,with_eta,readout,scale,coef", OPTS)
def test_same_params_as_the_general_path(fast, launched, inplace, final, with_g, with_eta,
                                         readout, scale, coef):
    q, k, v, g, eta, h = decode_inputs()
    g, eta = (g if with_g else None), (eta if with_eta else None)
    o, ht = _fast.run(q, k, v, g, eta, 1.0, 1e-6, scale, readout, coef, h, inplace, final)
    fp = fast[-1]
    fn = kla.fused_recurrent_kla if coef == P.COEFF_KACZMARZ else (
        lambda *a, eps, **kw: kla.fused_recurrent_gated_delta_rule(*a[:4], beta=a[4], **kw))
    # the same call through the public function: CPU tensors take the general path
    fn(q, k, v, g, eta, eps=1e-6, scale=scale, initial_state=h, inplace_final_state=inplace,
       output_final_state=final, **({"readout": "q_l2norm"} if readout else {}))
    gp = launched.params
    if coef == P.COEFF_GIVEN:
        gp["eps"] = fp["eps"]  # GDN calls pass eps 0; the fast path was given 1e-6 above
    differ = {f for f in fp if fp[f] != gp[f]}
    assert differ <= {"o", "final_state", "eps"}, differ  # fresh outputs; eps only for GDN
    assert fp["o"] == o.data_ptr() and (ht is None) == (not inplace and not final)
    if inplace:
        assert ht is h and fp["final_state"] == fp["initial_state"] == h.data_ptr()


@pytest.mark.parametrize("case", ["strided q", "bf16 g", "bf16 state", "k shape", "HV % H",
                                  "k dtype", "state shape", "inplace without state"])
def test_declines_what_it_is_not_for(fast, case):
    q, k, v, g, eta, h = decode_inputs()
    inplace = True
    if case == "strided q":
        q = torch.randn(2, 1, 2, 128, dtype=torch.bfloat16)[..., :64]
    elif case == "bf16 g":
        g = g.bfloat16()
    elif case == "bf16 state":
        h = h.bfloat16()
    elif case == "k shape":
        k = k[:1]
    elif case == "HV % H":
        v = torch.randn(2, 1, 3, 128, dtype=torch.bfloat16)
        g = eta = None
    elif case == "k dtype":
        k = k.half()
    elif case == "state shape":
        h = torch.zeros(2, 4, 128, 64)
    else:
        h = None
    assert _fast.run(q, k, v, g, eta, 1.0, 1e-6, None, 0, 0, h, inplace, False) is None
    assert not fast


def test_guard_sends_cpu_fake_and_grad_calls_elsewhere(fast):
    q, k, v, g, eta, h = decode_inputs()
    assert _fast.decode(q, k, v, g, eta, 1.0, 1e-6, None, 0, 0, h, True, False) is None
    assert not fast
