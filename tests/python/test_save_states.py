"""save_states=True (kla.h "Saved states": kla_chunk_forward_saving, kla_chunk_backward_saved) on
the CPU: the argument checks (each condition the library puts on saving refused by name, before
anything runs), the ordinary forward where no gradient is wanted, the fake kernels' sizes,
tracing forward and backward under torch.compile(fullgraph=True), and, with the library, what
the ops pass to the saving entry points (the launch replaced by conftest's recorder) and
torch.library.opcheck. The numbers are tested on the GPU (test_gpu.py, 'saved states')."""
import types

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import kla
from kla import _lib, api, ops
from kla import _params as P

RECORD = (128 * 128 + 64 * 128) * 2  # bytes per (chunk slot, value head): S [K][V], U [64][V]
FNS = ["chunk_kla", "chunk_gated_delta_rule"]


def inputs(B=1, T=70, H=2, HV=4, K=128, V=128, dtype=torch.bfloat16, device="meta",
           grad=True):
    """q, k, v, g, beta (fp32 gates); meta tensors unless told: nothing runs."""
    gen = dict(device=device)
    xs = [torch.zeros(B, T, H, K, dtype=dtype, **gen), torch.zeros(B, T, H, K, dtype=dtype, **gen),
          torch.zeros(B, T, HV, V, dtype=dtype, **gen), torch.zeros(B, T, HV, **gen),
          torch.zeros(B, T, HV, **gen)]
    return [x.requires_grad_(grad) for x in xs]


def call(fn, q, k, v, g, beta, **kw):
    kw.setdefault("arithmetic", "fast")
    if fn == "chunk_kla":
        return kla.chunk_kla(q, k, v, g, beta, **kw)
    return kla.chunk_gated_delta_rule(q, k, v, g, beta, **kw)


# ---- the argument checks ---------------------------------------------------------------------
@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
@pytest.mark.parametrize("fn", FNS)
@pytest.mark.parametrize("shape,kw,match", [
    ({"device": "cpu"}, {}, "needs CUDA tensors"),
    ({"dtype": torch.float16}, {}, "needs bfloat16 q, k, v"),
    ({"dtype": torch.float32}, {}, "needs bfloat16 q, k, v"),
    ({}, {"arithmetic": "accurate"}, "needs arithmetic='fast'"),
    ({"K": 64}, {}, "needs head dims K = V = 128"),
    ({"V": 64}, {}, "needs head dims K = V = 128"),
    ({"K": 256, "V": 256}, {}, "needs head dims K = V = 128"),
    ({}, {"path": "tf32"}, "path 'auto', 'wy' or 'wy_transposed'"),
    ({}, {"path": "generic"}, "path 'auto', 'wy' or 'wy_transposed'"),
    ({}, {"value_slice": 16}, "on path 'auto' takes value_slice 0 or 32 "),
    ({}, {"path": "wy", "value_slice": 8}, "on path 'wy' takes value_slice 0 or 32 "),
    ({}, {"path": "wy", "value_slice": 64}, "on path 'wy' takes value_slice 0 or 32 "),
    ({}, {"path": "wy_transposed", "value_slice": 32},
     "on path 'wy_transposed' takes value_slice 0 or 64 "),
    ({}, {"segments": 2}, "segments 0 or 1"),
])
def test_a_call_that_cannot_save_is_refused_by_name(fn, shape, kw, match, grad):
    """Each condition of kla_saved_states_size, checked in Python before any library call: a
    ValueError naming it, with or without a gradient to compute (never a silent fallback)."""
    xs = inputs(grad=grad, **shape)
    with pytest.raises(ValueError, match=match) as e:
        call(fn, *xs, save_states=True, **kw)
    assert "save_states=True" in str(e.value)
    if shape.get("device", "meta") == "meta":  # the refusal is save_states' own
        call(fn, *xs, save_states=False, **kw)


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_save_states_must_be_a_bool(value):
    with pytest.raises(ValueError, match="save_states must be True or False"):
        kla.chunk_kla(*inputs(), arithmetic="fast", save_states=value)


@pytest.mark.parametrize("fn", FNS)
@pytest.mark.parametrize("kw", [{}, {"path": "wy"}, {"path": "wy", "value_slice": 32},
                                {"path": "wy_transposed"},
                                {"path": "wy_transposed", "value_slice": 64},
                                {"value_slice": 0, "segments": 1}, {"path": "auto",
                                                                     "segments": 0}])
def test_calls_that_can_save_pass_the_checks(fn, kw):
    o, s = call(fn, *inputs(), save_states=True, output_final_state=True, **kw)
    assert o.shape == (1, 70, 4, 128) and s.shape == (1, 4, 128, 128)


@pytest.mark.parametrize("how", ["no_requires_grad", "no_grad"])
def test_no_gradient_runs_the_ordinary_forward(monkeypatch, how):
    """Nothing to save for: save_states=True runs chunk_fwd, with the call's own path."""
    def refuse(*a, **kw):
        raise AssertionError("the saving forward ran without a gradient to compute")
    ran = []
    fwd = ops.chunk_fwd
    monkeypatch.setattr(ops, "chunk_fwd_saving", refuse)
    monkeypatch.setattr(ops, "chunk_fwd_saving_autograd", refuse)
    monkeypatch.setattr(ops, "chunk_fwd", lambda *a: ran.append(a) or fwd(*a))
    xs = inputs(grad=how == "no_grad")
    if how == "no_grad":
        with torch.no_grad():
            o, _ = kla.chunk_kla(*xs, arithmetic="fast", save_states=True)
    else:
        o, _ = kla.chunk_kla(*xs, arithmetic="fast", save_states=True)
    assert len(ran) == 1 and o.shape == xs[2].shape
    assert ran[0][14:17] == (P.ARITHMETIC_FAST, P.PATH_AUTO, 0)  # arithmetic, path, value_slice


def test_a_gradient_runs_the_saving_op(monkeypatch):
    ran = []
    op = ops.chunk_fwd_saving
    monkeypatch.setattr(ops, "chunk_fwd_saving", lambda *a: ran.append(a) or op(*a))
    o, _ = kla.chunk_gated_delta_rule(*inputs(), arithmetic="fast", save_states=True,
                                      path="wy", value_slice=32)
    assert len(ran) == 1 and ran[0][14:17] == (P.ARITHMETIC_FAST, P.PATH_WY, 32)
    assert o.requires_grad


# ---- fake kernels, autograd and torch.compile on fake / meta tensors -------------------------
@pytest.mark.parametrize("B,T,HV,cu,slots", [
    (2, 300, 4, None, 2 * 5),          # ceil(300 / 64) = 5 chunks a sequence
    (1, 64, 1, None, 1),
    (3, 1, 2, None, 3),
    (1, 300, 4, [0, 100, 164, 300], 300 // 64 + 3),  # packed: T // 64 + N (chunk_slots)
    (1, 129, 2, [0, 0, 1, 129], 129 // 64 + 3),       # an empty and a one-token sequence
])
def test_fake_saved_states_size(B, T, HV, cu, slots):
    """The fake kernel's saved tensor: uint8, on the inputs' device, of kla_saved_states_size's
    formula (chunk slots x HV x (K V + 64 V) bf16); test_backward_abi.py checks the library
    returns the same bytes."""
    with FakeTensorMode():
        q, k, v, g, beta = inputs(B, T, 2 if HV % 2 == 0 else 1, HV, device="cuda", grad=False)
        cut = None if cu is None else torch.tensor(cu, dtype=torch.int32, device="cuda")
        o, s, saved = torch.ops.kla.chunk_fwd_saving(
            q, k, v, g, beta, None, cut, None, 0.125, 0.0, 1.0, P.COEFF_GIVEN, P.READOUT_SCALE,
            True, P.ARITHMETIC_FAST, P.PATH_AUTO, 0, 0)
        assert (saved.shape, saved.dtype, saved.device.type) == (
            (slots * HV * RECORD,), torch.uint8, "cuda")
        assert o.shape == v.shape and s.shape == ((B if cu is None else len(cu) - 1), HV, 128,
                                                  128)


def test_documented_memory_cost():
    """48 KB per 64-token chunk and value head; 0.75 GiB at 32768 tokens x 32 value heads."""
    q, _, v, _, _ = inputs(1, 32768, 32, 32, grad=False)
    assert RECORD == 48 * 1024
    assert ops.saved_states_bytes(q, v, None) == 0.75 * 2 ** 30


@pytest.mark.parametrize("fn", FNS)
def test_autograd_on_meta_tensors(fn):
    """Forward and backward on meta tensors (the fake kernels; FakeTensors of device cuda cannot
    run autograd's engine without a GPU): the saving op, then kla::chunk_bwd_saved."""
    q, k, v, g, beta = inputs(1, 200, 2, 4)
    h0 = torch.zeros(3, 4, 128, 128, device="meta", requires_grad=True)
    cu = torch.tensor([0, 70, 71, 200], dtype=torch.int32)
    o, s = call(fn, q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                save_states=True)
    assert "chunk_fwd_saving" in type(o.grad_fn).__name__, type(o.grad_fn).__name__
    (o.float().sum() + s.sum()).backward()
    for x in (q, k, v, g, beta, h0):
        assert x.grad is not None and x.grad.shape == x.shape and x.grad.dtype == x.dtype


@pytest.mark.parametrize("fn", FNS)
def test_compile_fullgraph_forward_and_backward(fn):
    """torch.compile(fullgraph=True) over a loss through save_states=True and its backward: the
    forward graph holds kla.chunk_fwd_saving, the backward graph kla.chunk_bwd_saved (no graph
    break, the saved states passed from one to the other), on meta tensors."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    torch._dynamo.reset()
    codes = {}

    def compiler(name):
        def fn_(gm, example_inputs):
            codes[name] = gm.code
            return make_boxed_func(gm.forward)
        return fn_

    backend = aot_autograd(fw_compiler=compiler("fw"), bw_compiler=compiler("bw"))

    def loss(q, k, v, g, beta):
        o, s = call(fn, q, k, v, g, beta, output_final_state=True, save_states=True,
                    use_qk_l2norm_in_kernel=True)
        return o.float().square().sum() + s.square().sum()

    leaves = inputs(2, 70, 2, 4)
    torch.compile(loss, fullgraph=True, backend=backend)(*leaves).backward()
    assert "kla.chunk_fwd_saving" in codes["fw"], codes["fw"]
    assert "kla.chunk_bwd_saved" in codes["bw"], codes["bw"]
    assert "kla.chunk_bwd.default" not in codes["bw"]
    for x in leaves:
        assert x.grad is not None and x.grad.shape == x.shape


# ---- nn.KLA ------------------------------------------------------------------------------------
def test_nn_layer_save_states():
    layer = kla.nn.KLA(hidden_size=64, head_dim=128, num_heads=1, expand_v=1, arithmetic="fast",
                       save_states=True)
    assert layer.save_states is True
    assert kla.nn.KLA(hidden_size=64, head_dim=128, num_heads=1).save_states is False
    for kw in ({"impl": "torch"}, {"mode": "fused_recurrent"}):
        with pytest.raises(ValueError, match="save_states=True needs impl='kernels'"):
            kla.nn.KLA(hidden_size=64, head_dim=128, num_heads=1, save_states=True, **kw)
    with pytest.raises(ValueError, match="save_states must be True or False"):
        kla.nn.KLA(hidden_size=64, head_dim=128, num_heads=1, save_states="yes")


def test_nn_layer_passes_save_states(monkeypatch):
    got = []
    monkeypatch.setattr(api, "chunk_kla", lambda *a, **kw: got.append(kw) or (a[2], None))
    layer = kla.nn.KLA(hidden_size=64, head_dim=128, num_heads=1, expand_v=1, arithmetic="fast",
                       save_states=True, use_short_conv=False)
    layer(torch.zeros(1, 8, 64))
    assert got[0]["save_states"] is True and got[0]["arithmetic"] == "fast"


# ---- the library binding ------------------------------------------------------------------------
def test_a_library_without_saved_states_still_loads_and_says_so():
    """An ABI 5 library built before saved states lacks the three entry points: it loads (the
    ABI is the same), and save_states=True raises KlaLibraryError naming the missing one."""
    fake = types.SimpleNamespace(missing=["kla_saved_states_size"], path="/x/libkla_cuda.so.5")
    stand_in = _lib.Library._saving_entry(fake, "kla_saved_states_size")
    assert stand_in.__name__ == "kla_saved_states_size"
    with pytest.raises(kla.KlaLibraryError, match="has no kla_saved_states_size"):
        stand_in(None)


@pytest.fixture
def launched_saving(saving_lib, launched, monkeypatch):
    """conftest.launched, with CPU tensors let through save_states' device check."""
    monkeypatch.setattr(api, "_SAVE_DEVICES", ("cuda", "meta", "cpu"))
    return launched


def _cpu_inputs(T=150, H=2, HV=4, N=None):
    torch.manual_seed(0)
    q, k, v, g, beta = inputs(1 if N else 2, T, H, HV, device="cpu", grad=False)
    for x in (q, k, v):
        x.normal_()
    g.uniform_(-0.1, 0.0)
    beta.uniform_(0.0, 1.0)
    return [x.requires_grad_(True) for x in (q, k, v, g, beta)]


@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
@pytest.mark.parametrize("fn", FNS)
def test_saving_calls_pass_the_saved_states_from_forward_to_backward(launched_saving, fn,
                                                                    packed):
    """Through the op (CPU tensors take the registered ops): the forward's params are
    chunk_fwd's with a saved-states buffer of the formula's size; the backward gets that very
    buffer (address and size) and the forward's arithmetic."""
    cu = torch.tensor([0, 40, 41, 150], dtype=torch.int32) if packed else None
    q, k, v, g, beta = _cpu_inputs(N=3 if packed else None)
    h0 = torch.zeros(3 if packed else 2, 4, 128, 128, requires_grad=True)
    o, s = call(fn, q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                save_states=True)
    name, p = launched_saving.calls[-1]
    assert name == "kla_chunk_forward_saving"
    assert (p["arithmetic"], p["path"], p["value_slice"], p["segments"]) == (
        P.ARITHMETIC_FAST, P.PATH_AUTO, 0, 0)
    assert p["o"] == o.data_ptr() and p["final_state"] == s.data_ptr()
    (fname, (ptr, size)), = launched_saving.extra
    assert ptr % 16 == 0 and size == ops.saved_states_bytes(q, v, cu) > 0
    (o.float().sum() + s.sum()).backward()
    name, bp = launched_saving.calls[-1]
    assert name == "kla_chunk_backward_saved" and bp["arithmetic"] == P.ARITHMETIC_FAST
    assert launched_saving.extra[-1] == ("kla_chunk_backward_saved", (ptr, size))
    assert len(launched_saving.calls) == 2  # no kla_chunk_backward: nothing recomputed


def test_eager_autograd_saving_passes_the_saved_states(launched_saving):
    """ops.EagerAutogradSaving (plain eager CUDA calls' path, called here directly): the same
    hand-off, through the implementations."""
    q, k, v, g, beta = _cpu_inputs()
    args = (q, k, v, g, beta, None, None, None, 0.125, 0.0, 1.0, P.COEFF_GIVEN,
            P.READOUT_QK_L2NORM, False, P.ARITHMETIC_FAST, P.PATH_WY, 32, 1)
    o, s, saved = ops.chunk_fwd_saving_autograd(*args)
    assert type(o.grad_fn).__name__ == "EagerAutogradSavingBackward"
    assert not saved.requires_grad and saved.dtype == torch.uint8 and s.numel() == 0
    assert saved.numel() == ops.saved_states_bytes(q, v, None)
    assert launched_saving.extra[-1] == ("kla_chunk_forward_saving",
                                         (saved.data_ptr(), saved.numel()))
    o.float().sum().backward()
    assert launched_saving.extra[-1] == ("kla_chunk_backward_saved",
                                         (saved.data_ptr(), saved.numel()))
    for x in (q, k, v, g, beta):
        assert x.grad is not None and x.grad.shape == x.shape


def test_the_library_refusing_to_save_is_a_value_error(launched_saving):
    """A call that passes the Python checks but not kla_saved_states_size's (here a dtype the
    op is handed directly): ValueError with the library's reason, nothing launched."""
    q, k, v, g, beta = [x.detach().half() if x.dim() == 4 else x.detach()
                        for x in _cpu_inputs()]
    with pytest.raises(ValueError, match="cannot save its states: .+"):
        ops.chunk_fwd_saving_impl(q, k, v, g, beta, None, None, None, 0.125, 0.0, 1.0,
                                  P.COEFF_GIVEN, P.READOUT_SCALE, False, P.ARITHMETIC_FAST,
                                  P.PATH_AUTO, 0, 0)
    assert launched_saving.calls == []


# ---- the saved backward's state-gradient schedule (state_grad, chain_segment) -------------------
@pytest.mark.parametrize("kw,match", [
    ({"state_grad": "fastest"}, r"state_grad must be one of \['auto', 'chain', 'scan'\]"),
    ({"state_grad": 2}, "state_grad must be one of"),
    ({"state_grad": "chain", "chain_segment": 12}, r"chain_segment must be 0 \(the plan's "
                                                   r"choice\) or one of \(8, 16, 32, 64, 128\)"),
    ({"state_grad": "chain", "chain_segment": 256}, "chain_segment must be 0"),
    ({"state_grad": "chain", "chain_segment": True}, "chain_segment must be 0"),
    ({"state_grad": "chain", "chain_segment": 16.0}, "chain_segment must be 0"),
    ({"state_grad": "scan", "chain_segment": 16}, "chain_segment=16 needs state_grad='chain'"),
    ({"chain_segment": 32}, "chain_segment=32 needs state_grad='chain'"),
])
@pytest.mark.parametrize("fn", FNS)
def test_a_bad_schedule_is_refused_by_name(fn, kw, match):
    with pytest.raises(ValueError, match=match):
        call(fn, *inputs(), save_states=True, **kw)


@pytest.mark.parametrize("fn", FNS)
@pytest.mark.parametrize("kw", [{"state_grad": "scan"}, {"state_grad": "chain"},
                                {"state_grad": "chain", "chain_segment": 8}])
def test_a_schedule_needs_save_states(fn, kw):
    """The schedule is the saved backward's: asked for without save_states=True, a ValueError
    (never silently ignored)."""
    with pytest.raises(ValueError, match="needs save_states=True"):
        call(fn, *inputs(), **kw)


@pytest.mark.parametrize("fn", FNS)
@pytest.mark.parametrize("kw,want", [
    ({"state_grad": "scan"}, (P.STATE_GRAD_SCAN, 0)),
    ({"state_grad": "chain"}, (P.STATE_GRAD_CHAIN, 0)),
    ({"state_grad": "chain", "chain_segment": 16}, (P.STATE_GRAD_CHAIN, 16)),
])
def test_the_schedule_reaches_the_backward(launched_saving, fn, kw, want):
    """Through the ops: the forward is the same saving call, and the backward runs
    kla_chunk_backward_saved_as on that buffer with the schedule asked for (the default, AUTO,
    runs kla_chunk_backward_saved: test_saving_calls_pass_the_saved_states_from_forward_to_
    backward)."""
    q, k, v, g, beta = _cpu_inputs()
    o, s = call(fn, q, k, v, g, beta, output_final_state=True, save_states=True, **kw)
    name, _ = launched_saving.calls[-1]
    assert name == "kla_chunk_forward_saving"
    (_, (ptr, size)), = launched_saving.extra
    (o.float().sum() + s.sum()).backward()
    assert launched_saving.extra[-1] == ("kla_chunk_backward_saved_as", (ptr, size) + want)
    assert len(launched_saving.calls) == 2


def test_eager_autograd_saving_passes_the_schedule(launched_saving):
    """ops.EagerAutogradSaving (plain eager CUDA calls' path): the schedule, the saving op's last
    two arguments, reaches the backward's implementation."""
    q, k, v, g, beta = _cpu_inputs()
    args = (q, k, v, g, beta, None, None, None, 0.125, 0.0, 1.0, P.COEFF_GIVEN,
            P.READOUT_QK_L2NORM, False, P.ARITHMETIC_FAST, P.PATH_WY, 32, 1,
            P.STATE_GRAD_CHAIN, 64)
    o, s, saved = ops.chunk_fwd_saving_autograd(*args)
    o.float().sum().backward()
    assert launched_saving.extra[-1] == ("kla_chunk_backward_saved_as",
                                         (saved.data_ptr(), saved.numel(), P.STATE_GRAD_CHAIN, 64))


@pytest.mark.parametrize("op", ["fwd", "bwd"])
def test_opcheck(launched_saving, op):
    """torch.library.opcheck's schema / fake / autograd-registration checks of the two ops, the
    launch replaced by the library's validation (conftest.launched): the fake's saved size is
    the library's."""
    q, k, v, g, beta = [x.detach() for x in _cpu_inputs(T=70, N=None)]
    h = torch.zeros(2, 4, 128, 128)
    fwd = (q, k, v, g, beta, h, None, None, 0.125, 1e-6, 1.0, P.COEFF_KACZMARZ,
           P.READOUT_SCALE, True, P.ARITHMETIC_FAST, P.PATH_AUTO, 0, 0)
    if op == "fwd":
        fn, args = torch.ops.kla.chunk_fwd_saving.default, fwd
    else:
        saved = torch.zeros(ops.saved_states_bytes(q, v, None), dtype=torch.uint8)
        fn = torch.ops.kla.chunk_bwd_saved.default
        args = fwd[:13] + (torch.zeros_like(v), torch.zeros_like(h), P.ARITHMETIC_FAST, saved)
    torch.library.opcheck(fn, args, test_utils=("test_schema", "test_autograd_registration",
                                                "test_faketensor"))
