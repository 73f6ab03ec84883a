"""Argument checks of the FLA-shaped functions (CPU, meta tensors: nothing runs): bad shapes and
dtypes, and every FLA 0.6 argument kla does not implement, each named in its error."""
import pytest
import torch

import kla

M = "meta"


def t(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device=M)


Q, V = t(1, 8, 2, 64), t(1, 8, 4, 64)
G = t(1, 8, 4, dtype=torch.float32)
FUNCS = {
    "chunk_kla": lambda **kw: kla.chunk_kla(Q, Q, V, **kw),
    "fused_recurrent_kla": lambda **kw: kla.fused_recurrent_kla(Q, Q, V, **kw),
    "chunk_gated_delta_rule": lambda **kw: kla.chunk_gated_delta_rule(Q, Q, V, G, G, **kw),
    "fused_recurrent_gated_delta_rule":
        lambda **kw: kla.fused_recurrent_gated_delta_rule(Q, Q, V, G, beta=G, **kw),
}
GDN = ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"]


@pytest.mark.parametrize("fn", FUNCS)
def test_meta_call_works(fn):
    o, s = FUNCS[fn](output_final_state=True)
    assert o.shape == V.shape and o.dtype == V.dtype
    assert s.shape == (1, 4, 64, 64) and s.dtype == torch.float32


@pytest.mark.parametrize("fn", GDN)
@pytest.mark.parametrize("kw,name", [
    ({"use_beta_sigmoid_in_kernel": True}, "use_beta_sigmoid_in_kernel"),
    ({"allow_neg_eigval": True}, "allow_neg_eigval"),
    ({"use_gate_in_kernel": True}, "use_gate_in_kernel"),
    ({"A_log": t(4)}, "A_log"),
    ({"dt_bias": t(4)}, "dt_bias"),
])
def test_unsupported_fla_arguments_are_named(fn, kw, name):
    with pytest.raises(NotImplementedError, match=f"kla: {name}="):
        FUNCS[fn](**kw)


def test_unsupported_arguments_of_one_function():
    with pytest.raises(NotImplementedError, match="kla: cp_context="):
        kla.chunk_gated_delta_rule(Q, Q, V, G, G, cp_context=object())
    for name in ("gk", "gv"):
        with pytest.raises(NotImplementedError, match=f"kla: {name}="):
            kla.fused_recurrent_gated_delta_rule(Q, Q, V, **{name: t(1, 8, 4, 64)})
    with pytest.raises(NotImplementedError, match="kla: beta="):
        kla.fused_recurrent_gated_delta_rule(Q, Q, V, beta=t(1, 8, 4, 64))
    with pytest.raises(NotImplementedError, match="kla: state_v_first="):
        kla.fused_recurrent_kla(Q, Q, V, initial_state=t(3, 4, 64, 64, dtype=torch.float32),
                                ssm_state_indices=torch.tensor([0]), state_v_first=True)


@pytest.mark.parametrize("fn", GDN)
def test_unknown_keyword_is_a_type_error(fn):
    with pytest.raises(TypeError, match="unexpected keyword argument 'use_qk_norm'"):
        FUNCS[fn](use_qk_norm=True)


def test_fla_arguments_accepted_and_ignored():
    kla.chunk_gated_delta_rule(Q, Q, V, G, G, chunk_size=32, chunk_indices=torch.tensor([0]))
    with pytest.raises(ValueError, match="chunk_size must be 16, 32 or 64"):
        kla.chunk_gated_delta_rule(Q, Q, V, G, G, chunk_size=128)
    with pytest.raises(ValueError, match="head_first"):
        kla.chunk_gated_delta_rule(Q, Q, V, G, G, head_first=False)


@pytest.mark.parametrize("fn", FUNCS)
@pytest.mark.parametrize("args,err,match", [
    ((t(8, 2, 64), t(8, 2, 64), V), ValueError, "q must be 4-d"),
    ((Q, t(1, 8, 2, 32), V), ValueError, "k must have q's shape"),
    ((Q, Q, t(1, 8, 3, 64)), ValueError, r"HV = 3 must be a multiple of .* H = 2"),
    ((Q, Q, t(1, 7, 4, 64)), ValueError, "v must be"),
    ((Q, Q, t(1, 8, 4, 64, dtype=torch.float16)), TypeError, "one dtype"),
    ((t(1, 8, 2, 64, dtype=torch.float64),) * 2 + (t(1, 8, 4, 64, dtype=torch.float64),),
     TypeError, "float32, bfloat16, float16"),
])
def test_bad_tensors(fn, args, err, match):
    f = getattr(kla, fn)
    extra = (G, G) if fn == "chunk_gated_delta_rule" else ()
    with pytest.raises(err, match=match):
        f(*args, *extra)


@pytest.mark.parametrize("fn", FUNCS)
def test_bad_options(fn):
    f = FUNCS[fn]
    with pytest.raises(ValueError, match="batch size must be 1 with cu_seqlens"):
        kla.chunk_kla(t(2, 8, 2, 64), t(2, 8, 2, 64), t(2, 8, 4, 64),
                      cu_seqlens=torch.tensor([0, 8]))
    with pytest.raises(TypeError, match="cu_seqlens must be int32 or int64"):
        f(cu_seqlens=torch.tensor([0.0, 8.0]))
    with pytest.raises(ValueError, match="cu_seqlens must be 1-d"):
        f(cu_seqlens=torch.tensor([[0, 8]]))
    with pytest.raises(ValueError, match=r"initial_state must be \[N, HV, K, V\]"):
        f(initial_state=t(1, 4, 32, 64, dtype=torch.float32))
    with pytest.raises(ValueError, match=r"initial_state must be \[N, HV, V, K\]"):
        f(initial_state=t(1, 4, 64, 32, dtype=torch.float32), state_v_first=True)


def test_bad_gates_and_enums():
    with pytest.raises(ValueError, match=r"g must be \[B, T, HV\]"):
        kla.chunk_kla(Q, Q, V, g=t(1, 8, 2, dtype=torch.float32))
    with pytest.raises(ValueError, match=r"beta must be \[B, T, HV\]"):
        kla.chunk_gated_delta_rule(Q, Q, V, G, t(1, 8, 3))
    with pytest.raises(TypeError, match="eta must be a floating-point"):
        kla.chunk_kla(Q, Q, V, eta=t(1, 8, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="arithmetic must be one of"):
        kla.chunk_kla(Q, Q, V, arithmetic="tf32")
    with pytest.raises(ValueError, match="path must be one of"):
        kla.chunk_kla(Q, Q, V, path="fastest")
    with pytest.raises(ValueError, match="path='tokenwise' is the decode kernel"):
        kla.chunk_kla(Q, Q, V, path="tokenwise")
    with pytest.raises(ValueError, match="readout must be one of"):
        kla.chunk_kla(Q, Q, V, readout="l2")
    with pytest.raises(ValueError, match="takes no scale"):
        kla.chunk_kla(Q, Q, V, scale=0.1, readout="q_l2norm")


def test_inplace_and_pool_checks():
    h = t(1, 4, 64, 64, dtype=torch.float32)
    with pytest.raises(ValueError, match="need initial_state"):
        kla.fused_recurrent_kla(Q, Q, V, inplace_final_state=True)
    with pytest.raises(ValueError, match="contiguous float32"):
        kla.fused_recurrent_kla(Q, Q, V, initial_state=h.bfloat16(), inplace_final_state=True)
    with pytest.raises(ValueError, match="contiguous float32"):
        strided = t(1, 4, 64, 128, dtype=torch.float32)[..., :64]
        kla.fused_recurrent_kla(Q, Q, V, initial_state=strided, inplace_final_state=True)
    with pytest.raises(ValueError, match=r"state pool .* must be \[pool_size, HV, K, V\]"):
        kla.fused_recurrent_kla(Q, Q, V, initial_state=t(5, 4, 32, 64, dtype=torch.float32),
                                ssm_state_indices=torch.tensor([0]))
    with pytest.raises(ValueError, match="one index per sequence"):
        kla.fused_recurrent_kla(Q, Q, V, initial_state=t(5, 4, 64, 64, dtype=torch.float32),
                                ssm_state_indices=torch.tensor([0, 1]))
    with pytest.raises(TypeError, match="ssm_state_indices must be int32 or int64"):
        kla.fused_recurrent_kla(Q, Q, V, initial_state=t(5, 4, 64, 64, dtype=torch.float32),
                                ssm_state_indices=torch.tensor([0.0]))
    with pytest.raises(ValueError, match="ssm_state_indices_cpu is given without"):
        kla.fused_recurrent_kla(Q, Q, V, ssm_state_indices_cpu=torch.tensor([0]))
