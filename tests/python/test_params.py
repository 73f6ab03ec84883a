"""What the ops pass to the C ABI (CPU): the kla_params of each function's call, read back from
the struct and validated by the library, with the launch replaced by a recorder (conftest)."""
import pytest
import torch

import kla
from kla import _params as P


def qkv(B=2, T=10, H=2, HV=4, K=64, V=128, dtype=torch.bfloat16):
    torch.manual_seed(0)
    return (torch.randn(B, T, H, K, dtype=dtype), torch.randn(B, T, H, K, dtype=dtype),
            torch.randn(B, T, HV, V, dtype=dtype))


def test_chunk_kla_params(launched):
    q, k, v = qkv()
    g, eta = -torch.rand(2, 10, 4), torch.rand(2, 10, 4)
    h0 = torch.randn(2, 4, 64, 128)
    o, ht = kla.chunk_kla(q, k, v, g, eta, eps=1e-5, scale=0.5, initial_state=h0,
                          output_final_state=True, arithmetic="fast", path="tf32",
                          value_slice=16)
    name, p = launched.calls[-1]
    assert name == "kla_chunk_forward"
    assert (p["dtype"], p["batch"], p["seq_len"], p["num_heads"], p["num_v_heads"],
            p["head_dim_k"], p["head_dim_v"]) == (P.DTYPE_BF16, 2, 10, 2, 4, 64, 128)
    assert (p["q"], p["k"], p["v"], p["o"]) == (q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                                o.data_ptr())
    assert p["q_strides"] == (10 * 2 * 64, 2 * 64, 64)
    assert p["v_strides"] == (10 * 4 * 128, 512, 128)
    assert (p["g"], p["eta"], p["g_strides"], p["eta_strides"]) == (
        g.data_ptr(), eta.data_ptr(), (40, 4), (40, 4))
    assert p["eps"] == pytest.approx(1e-5) and p["scale"] == 0.5 and p["eta_value"] == 1.0
    assert (p["coefficient"], p["readout"]) == (P.COEFF_KACZMARZ, P.READOUT_SCALE)
    assert p["initial_state"] == h0.data_ptr() and p["final_state"] == ht.data_ptr()
    assert (p["arithmetic"], p["path"], p["value_slice"]) == (P.ARITHMETIC_FAST, P.PATH_TF32, 16)
    assert p["workspace"] and p["workspace_size"] >= launched.plan.workspace_bytes > 0
    assert launched.plan.path_name == b"tf32" and launched.plan.value_slice == 16
    assert (p["state_pool"], p["cu_seqlens"], p["num_seqs"]) == (None, None, 0)
    assert o.shape == v.shape and o.dtype == v.dtype and ht.shape == (2, 4, 64, 128)


def test_defaults_and_auto_plan(launched):
    q, k, v = qkv()
    _, ht = kla.chunk_kla(q, k, v)
    p = launched.params
    assert ht is None and p["final_state"] is None and p["initial_state"] is None
    assert (p["g"], p["eta"], p["eta_value"]) == (None, None, 1.0)
    assert p["eps"] == pytest.approx(1e-6) and p["scale"] == pytest.approx(64 ** -0.5)
    assert (p["arithmetic"], p["path"], p["value_slice"]) == (P.ARITHMETIC_ACCURATE,
                                                             P.PATH_AUTO, 0)
    assert launched.plan.path_name in (b"wy", b"wy_transposed")  # bf16, K = 64 on an H100
    kla.chunk_kla(q, k, v, eta=0.5)
    assert launched.params["eta"] is None and launched.params["eta_value"] == 0.5


def test_generic_path_gets_no_workspace(launched):
    q, k, v = qkv()
    kla.chunk_kla(q, k, v, path="generic")
    assert launched.params["workspace"] is None and launched.plan.path_name == b"generic"


def test_gdn_maps_to_given_beta(launched):
    q, k, v = qkv(dtype=torch.float16)
    g, beta = -torch.rand(2, 10, 4).half(), torch.rand(2, 10, 4).half()  # FLA passes these too
    kla.chunk_gated_delta_rule(q, k, v, g, beta)
    p = launched.params
    assert (p["coefficient"], p["eps"], p["dtype"]) == (P.COEFF_GIVEN, 0.0, P.DTYPE_FP16)
    # g and beta arrive as fp32 copies with the same values
    assert torch.equal(launched.mem("g", torch.float32, (2, 10, 4)), g.float())
    assert torch.equal(launched.mem("eta", torch.float32, (2, 10, 4)), beta.float())
    kla.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta)
    name, p = launched.calls[-1]
    assert name == "kla_tokenwise_forward" and p["coefficient"] == P.COEFF_GIVEN
    kla.fused_recurrent_gated_delta_rule(q, k, v)  # beta None: 1, as FLA
    assert launched.params["eta"] is None and launched.params["eta_value"] == 1.0


def test_qk_l2norm_normalises_q_and_k_keeps_scale(launched):
    q, k, v = qkv(dtype=torch.float32)
    kla.chunk_gated_delta_rule(q, k, v, None, torch.rand(2, 10, 4), scale=0.25,
                               use_qk_l2norm_in_kernel=True)
    p = launched.params
    # The kernels' QK_L2NORM read-out (normalised in fp32 inside), the scale kept, q and k raw.
    assert p["readout"] == P.READOUT_QK_L2NORM and p["scale"] == 0.25
    torch.testing.assert_close(launched.mem("q", torch.float32, q.shape), q, rtol=0, atol=0)
    torch.testing.assert_close(launched.mem("k", torch.float32, k.shape), k, rtol=0, atol=0)


def test_readout_q_l2norm(launched):
    q, k, v = qkv()
    kla.fused_recurrent_kla(q, k, v, readout="q_l2norm")
    assert launched.params["readout"] == P.READOUT_Q_L2NORM and launched.params["scale"] == 0.0


def test_strided_views_pass_their_strides(launched):
    B, T, H, K = 2, 10, 2, 64
    qkv_ = torch.randn(B, T, 3, H, K, dtype=torch.bfloat16)
    q, k, v = qkv_[:, :, 0], qkv_[:, :, 1], qkv_[:, :, 2]
    kla.chunk_kla(q, k, v)
    p = launched.params
    assert p["q"] == q.data_ptr() and p["k"] == k.data_ptr() and p["v"] == v.data_ptr()
    assert p["q_strides"] == (T * 3 * H * K, 3 * H * K, K) == p["k_strides"] == p["v_strides"]
    assert p["o_strides"] == (T * H * K, H * K, K)  # o is allocated contiguous


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_cu_seqlens_int32_and_int64(launched, dtype):
    q, k, v = qkv(B=1, T=10)
    cu = torch.tensor([0, 3, 3, 10], dtype=dtype)
    for fn in (kla.chunk_kla, kla.fused_recurrent_kla):
        _, ht = fn(q, k, v, cu_seqlens=cu, output_final_state=True)
        p = launched.params
        assert p["num_seqs"] == 3 and p["batch"] == 1 and ht.shape == (3, 4, 64, 128)
        assert launched.mem("cu_seqlens_host", torch.int32).tolist() == [0, 3, 3, 10]
        assert p["cu_seqlens"]  # the device copy (here: the host one, no GPU)
    # FLA's cu_seqlens_cpu: the host copy given alongside
    kla.chunk_kla(q, k, v, cu_seqlens=cu, cu_seqlens_cpu=cu.to(torch.int64))
    assert launched.mem("cu_seqlens_host", torch.int32).tolist() == [0, 3, 3, 10]


def test_bad_cu_seqlens_is_the_librarys_message(launched):
    q, k, v = qkv(B=1, T=10)
    with pytest.raises(kla.KlaError) as e:
        kla.chunk_kla(q, k, v, cu_seqlens=torch.tensor([0, 5, 4, 10]))
    assert e.value.status_name == "KLA_ERROR_BAD_CU_SEQLENS" and "cu_seqlens" in e.value.message


def test_pool_indices(launched):
    q, k, v = qkv(B=3, T=1)
    pool = torch.zeros(5, 4, 64, 128)
    idx = torch.tensor([4, -1, 0])
    o, ret = kla.fused_recurrent_kla(q, k, v, initial_state=pool, ssm_state_indices=idx)
    p = launched.params
    assert ret is pool and p["state_pool"] == pool.data_ptr() and p["pool_size"] == 5
    assert (p["initial_state"], p["final_state"]) == (None, None)
    assert launched.mem("state_indices_host", torch.int32).tolist() == [4, -1, 0]
    assert p["state_indices"]
    assert torch.equal(o, torch.zeros_like(o))  # o is zeroed: skipped rows stay 0
    with pytest.raises(kla.KlaError) as e:  # repeated index: the library's check
        kla.fused_recurrent_kla(q, k, v, initial_state=pool,
                                ssm_state_indices=torch.tensor([1, 1, 0]))
    assert e.value.status_name == "KLA_ERROR_BAD_INDEX"


def test_inplace_state(launched):
    q, k, v = qkv(B=2, T=3)
    h = torch.zeros(2, 4, 64, 128)
    _, ret = kla.fused_recurrent_kla(q, k, v, initial_state=h, inplace_final_state=True)
    p = launched.params
    assert ret is h and p["initial_state"] == p["final_state"] == h.data_ptr()


@pytest.mark.parametrize("fn", ["chunk", "recurrent", "inplace"])
def test_state_v_first(launched, fn):
    """[N, HV, V, K] in: the kernel gets the [N, HV, K, V] transpose; out: transposed back."""
    q, k, v = qkv(B=2, T=3, K=64, V=128)
    hv = torch.randn(2, 4, 128, 64)  # V first
    written = torch.randn(2, 4, 64, 128)  # what the fake kernel writes as the final state
    launched.write_final = written
    if fn == "chunk":
        _, ht = kla.chunk_gated_delta_rule(q, k, v, None, torch.rand(2, 3, 4), initial_state=hv,
                                           output_final_state=True, state_v_first=True)
    elif fn == "recurrent":
        _, ht = kla.fused_recurrent_gated_delta_rule(q, k, v, initial_state=hv,
                                                     output_final_state=True,
                                                     state_v_first=True)
    else:
        ht = hv.clone()
        _, ret = kla.fused_recurrent_gated_delta_rule(q, k, v, initial_state=ht,
                                                      inplace_final_state=True,
                                                      state_v_first=True)
        assert ret is ht
    passed = launched.mem("initial_state", torch.float32, (2, 4, 64, 128))
    assert torch.equal(passed, hv.transpose(-1, -2))
    assert ht.shape == (2, 4, 128, 64) and torch.equal(ht, written.transpose(-1, -2))


def test_transpose_state_layout_alias(launched):
    q, k, v = qkv(B=1, T=2)
    _, ht = kla.fused_recurrent_gated_delta_rule(q, k, v, output_final_state=True,
                                                 transpose_state_layout=True)  # FLA's old name
    assert ht.shape == (1, 4, 128, 64)


def test_plan_for_a_described_device(lib):
    q = torch.empty(1, 32768, 16, 128, dtype=torch.bfloat16, device="meta")
    v = torch.empty(1, 32768, 16, 128, dtype=torch.bfloat16, device="meta")
    p = kla.plan(q, q, v, device=kla.H200)
    assert p.path == "wy" and p.chunk_len == 64 and p.workspace_bytes > 0 and "wy" in p.reason
    p32 = kla.plan(q.float(), q.float(), v.float(), device=kla.H200)
    assert p32.path == "tf32" and "arithmetic" in p32.reason
    assert kla.plan(q.float(), q.float(), v.float(), device=kla.H200,
                    arithmetic="fast").path == "wy"
    assert kla.plan(q, q, v, device=kla.A100).path == "tf32"
    # arithmetic 'fast' (issue 26): what runs is in the plan. bf16 at 1 x 32768 x 16 plans the wy
    # path, which has no FAST arithmetic for bf16; 4 x 8192 plans the transposed scan, which has.
    assert p.arithmetic == "accurate"
    pf = kla.plan(q, q, v, device=kla.H200, arithmetic="fast")
    assert pf.path == "wy" and pf.arithmetic == "accurate"
    assert pf.reason.startswith("arithmetic ACCURATE: the wy path has no FAST arithmetic")
    q4 = torch.empty(4, 8192, 16, 128, dtype=torch.bfloat16, device="meta")
    p4 = kla.plan(q4, q4, q4, device=kla.H200, arithmetic="fast")
    assert (p4.path, p4.arithmetic) == ("wy_transposed", "fast")
    assert kla.plan(q4, q4, q4, device=kla.H200).arithmetic == "accurate"
    assert kla.plan(q.float(), q.float(), v.float(), device=kla.H200,
                    arithmetic="fast").arithmetic == "fast"
    with pytest.raises(kla.KlaError) as e:
        kla.plan(q, q, v, device=kla.A100, path="wy")
    assert e.value.status_name == "KLA_ERROR_UNSUPPORTED_PATH" and "sm_90a" in e.value.message
    cu = torch.tensor([0, 100, 32768])
    assert kla.plan(q, q, v, cu_seqlens=cu, device=kla.H100).workspace_bytes > 0


def test_backward_plan_for_a_described_device(saving_lib):
    """kla.backward_plan (kla_plan_chunk_backward_saved_for): issue 25's rows on an H200 take the
    chain at the model's segments (128 chunks at 1 x 32768, 32 at 1 x 8192); the scan on request,
    its prep beside it where its blocks are one wave; 'chain' refused off sm_90 with the reason;
    chunk_kla's own checks of the request; a call that cannot save refused by the library."""
    def row(T, HV=32, dtype=torch.bfloat16):
        q = torch.empty(1, T, 16, 128, dtype=dtype, device="meta")
        v = torch.empty(1, T, HV, 128, dtype=dtype, device="meta")
        g = torch.empty(1, T, HV, device="meta")
        return q, q, v, g, g
    cu = torch.tensor([0, 32768])
    p = kla.backward_plan(*row(32768), cu_seqlens=cu, coefficient="given", device=kla.H200)
    if p.state_grad == "scan":  # a library without the sm_90a image
        assert "built without sm_90a kernels" in p.reason
        pytest.skip(f"this library has no sm_90a image: {p.reason}")
    assert (p.state_grad, p.chain_segment, p.prep_beside) == ("chain", 128, False), p
    p = kla.backward_plan(*row(8192), device=kla.H200)
    assert (p.state_grad, p.chain_segment) == ("chain", 32), p
    p = kla.backward_plan(*row(8192), state_grad="chain", chain_segment=16, device=kla.H200)
    assert (p.state_grad, p.chain_segment) == ("chain", 16) and "(requested)" in p.reason, p
    p = kla.backward_plan(*row(8192), state_grad="scan", device=kla.H200)
    assert (p.state_grad, p.chain_segment, p.prep_beside) == ("scan", 0, True), p
    assert p.reason.startswith("scan, the prep beside it (128 scan blocks on 132"), p.reason
    assert not kla.backward_plan(*row(8192, HV=64), state_grad="scan",
                                 device=kla.H200).prep_beside
    sm80 = kla.DeviceInfo((8, 0), 108, 232448)
    p = kla.backward_plan(*row(8192), device=sm80)
    assert p.state_grad == "scan" and "the chain declined: the chain is sm_90a code" in p.reason
    with pytest.raises(kla.KlaError, match="state_grad CHAIN cannot run") as e:
        kla.backward_plan(*row(8192), state_grad="chain", device=sm80)
    assert e.value.status_name == "KLA_ERROR_UNSUPPORTED_PATH"
    with pytest.raises(ValueError, match="chain_segment=8 needs state_grad='chain'"):
        kla.backward_plan(*row(8192), chain_segment=8, device=kla.H200)
    with pytest.raises(kla.KlaError, match="cannot use saved states: only bf16"):
        kla.backward_plan(*row(8192, dtype=torch.float16), device=kla.H200)


def test_lowlevel_is_what_the_bench_calls(lib):
    """kla.lowlevel keeps the names and signatures bench/side_by_side.py calls."""
    import kla.lowlevel as kc
    klib = kc.KlaLibrary()
    assert klib.version == kla.__version__ and kc.ABI_VERSION == kla.ABI_VERSION == 5
    q, k, v = qkv(dtype=torch.float32)
    o, h = torch.empty_like(v), torch.empty(2, 4, 64, 128)
    g, eta = -torch.rand(2, 10, 4), torch.rand(2, 10, 4)
    p = kc.make_params(klib, q, k, v, o, g, eta, eps=1e-6, final_state=h,
                       arithmetic=kc.ARITHMETIC_FAST)
    klib.validate(p)
    ws = torch.empty(klib.workspace_size(p), dtype=torch.uint8)
    p = kc.make_params(klib, q, k, v, o, g, eta, eps=1e-6, final_state=h, workspace=ws,
                       coefficient=kc.COEFF_GIVEN)
    klib.validate(p)
    assert (p.workspace, p.coefficient, p.dtype) == (ws.data_ptr(), kc.COEFF_GIVEN,
                                                     kc.DTYPE_FP32)
    assert kc.torch_dtype_code(torch.bfloat16) == kc.DTYPE_BF16


def test_segments_requested_planned_and_checked(launched):
    """kla_params.segments: passed through, the plan's split reported (kla_plan.segments), bad
    values refused by the package, an impossible split by the library (nothing launched)."""
    q, k, v = qkv(B=1, T=4096, H=1, HV=1, K=128, V=128)
    kla.chunk_kla(q, k, v, segments=4)
    assert launched.params["segments"] == 4 and launched.plan.segments == 4
    kla.chunk_kla(q, k, v)  # the plan's choice: 64 chunks make fewer than 4 segments of 32
    assert launched.params["segments"] == 0 and launched.plan.segments == 1
    q2, k2, v2 = qkv(B=1, T=32768, H=1, HV=1, K=128, V=128)
    kla.chunk_gated_delta_rule(q2, k2, v2, None, torch.rand(1, 32768, 1))
    assert launched.params["segments"] == 0 and launched.plan.segments == 16
    assert b"split into 16 segments" in launched.plan.reason
    calls = len(launched.calls)
    for bad in (-1, 17, 2.0, True):
        with pytest.raises(ValueError, match="segments"):
            kla.chunk_kla(q, k, v, segments=bad)
    with pytest.raises(kla.KlaError, match=r"K \+ V = 320 exceeds 256"):
        kla.chunk_kla(*qkv(B=1, T=100, H=1, HV=1, K=128, V=192), segments=2)
    assert len(launched.calls) == calls
