"""FLA-shaped functions over kla's ops (names, argument order, defaults and returns of
flash-linear-attention 0.6; docs/python.md has the argument-by-argument table).

    chunk_kla / fused_recurrent_kla                          the Kaczmarz coefficient in the kernel
    chunk_gated_delta_rule / fused_recurrent_gated_delta_rule   a given beta (plain GDN)

Eager calls on plain CUDA tensors call the implementation directly (the dispatcher's round trip
through a Python custom op costs more than the rest of a decode call), through ops.EagerAutograd
where a gradient is needed (the ops' autograd formula without the dispatcher: a quarter of the
host time for a forward, two thirds for a backward); everything else (torch.compile, fake / meta
tensors, functorch transforms, dispatch modes) goes through the registered torch ops, with the
same implementation and formula behind them.
"""
import torch

from . import _fast
from . import _params as P
from . import ops

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# ---- argument checks ------------------------------------------------------------------------
def _unsupported(name, value, hint=""):
    raise NotImplementedError(f"kla: {name}={value!r} is not supported by kla" +
                              (f": {hint}" if hint else ""))


def _check_kwargs(kwargs, fn):
    """FLA 0.6 keyword arguments kla has no counterpart for; anything else is a TypeError."""
    if kwargs.pop("use_gate_in_kernel", False):
        _unsupported("use_gate_in_kernel", True, "compute g = -exp(A_log) * softplus(g + dt_bias) "
                     "in PyTorch and pass it as g")
    for name in ("A_log", "dt_bias"):
        if kwargs.pop(name, None) is not None:
            _unsupported(name, "<tensor>", "kla takes the decay g already in log space "
                         "(use_gate_in_kernel is not supported)")
    chunk_size = kwargs.pop("chunk_size", 64)
    if chunk_size not in (16, 32, 64):
        raise ValueError(f"kla: chunk_size must be 16, 32 or 64 (it is ignored: kla picks its "
                         f"own chunking), got {chunk_size}")
    if "head_first" in kwargs:
        raise ValueError("kla: head_first was removed from FLA and is not supported: inputs are "
                         "[B, T, H, ...]")
    if kwargs:
        raise TypeError(f"{fn}() got an unexpected keyword argument '{next(iter(kwargs))}'")


def _state_v_first_alias(kwargs, state_v_first):
    if "transpose_state_layout" in kwargs:  # FLA's deprecated name
        if state_v_first:
            raise ValueError("kla: pass state_v_first or transpose_state_layout, not both")
        return bool(kwargs.pop("transpose_state_layout"))
    return state_v_first


def _check_qkv(q, k, v, dtypes=_DTYPES):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"kla: {name} must be 4-d ([B, T, heads, dim]), got shape "
                             f"{tuple(t.shape)}")
    if q.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"kla: q, k, v must be one of {names}, got {q.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"kla: q, k, v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape != q.shape:
        raise ValueError(f"kla: k must have q's shape {tuple(q.shape)}, got {tuple(k.shape)}")
    B, T, H, _ = q.shape
    if v.shape[:2] != q.shape[:2]:
        raise ValueError(f"kla: v must be [B, T, HV, V] with q's B = {B}, T = {T}, got "
                         f"{tuple(v.shape)}")
    if v.shape[2] % H:
        raise ValueError(f"kla: the value heads HV = {v.shape[2]} must be a multiple of the "
                         f"query/key heads H = {H}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"kla: q, k, v must be on one device, got {q.device}, {k.device}, "
                         f"{v.device}")


def _last_contiguous(t):
    return t if t.stride(-1) == 1 else t.contiguous()


def _gate(t, name, v, dtype=torch.float32):
    """g / eta / beta: [B, T, HV], converted to `dtype` (the kernels': fp32) with HV contiguous
    (a copy otherwise)."""
    if t is None:
        return None
    if t.dim() == 4 and name == "beta":
        _unsupported("beta", "<[B, T, HV, V] tensor>", "kla takes one beta per head and token "
                     "([B, T, HV])")
    if tuple(t.shape) != tuple(v.shape[:3]):
        raise ValueError(f"kla: {name} must be [B, T, HV] = {tuple(v.shape[:3])}, got "
                         f"{tuple(t.shape)}")
    if t.dtype != dtype:
        if not t.is_floating_point():
            raise TypeError(f"kla: {name} must be a floating-point tensor, got {t.dtype}")
        t = t.to(dtype)
    return _last_contiguous(t)


def _qk_readout(readout, use_qk_l2norm_in_kernel):
    """use_qk_l2norm_in_kernel: the kernels' QK_L2NORM read-out, which normalises q and k as FLA's
    l2norm does (x / sqrt(sum x^2 + 1e-6)) in fp32 inside the kernel, nothing rounded to the
    dtype, and keeps the scale."""
    if not use_qk_l2norm_in_kernel:
        return readout
    if readout == P.READOUT_Q_L2NORM:
        raise ValueError("kla: use_qk_l2norm_in_kernel=True and readout='q_l2norm' both normalise "
                         "q: pick one")
    return P.READOUT_QK_L2NORM


def _seqlens(q, cu_seqlens, cu_seqlens_cpu):
    if cu_seqlens is None:
        if cu_seqlens_cpu is not None:
            raise ValueError("kla: cu_seqlens_cpu is given without cu_seqlens")
        return None, None
    if q.shape[0] != 1:
        raise ValueError(f"kla: the batch size must be 1 with cu_seqlens (flatten the "
                         f"sequences into one row), got B = {q.shape[0]}")
    if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2:
        raise ValueError(f"kla: cu_seqlens must be 1-d with N + 1 >= 2 entries, got shape "
                         f"{tuple(cu_seqlens.shape)}")
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"kla: cu_seqlens must be int32 or int64, got {cu_seqlens.dtype}")
    if cu_seqlens_cpu is None and cu_seqlens.device.type == "cpu":
        return cu_seqlens, None
    return cu_seqlens, cu_seqlens_cpu


def _state_in(state, q, v, n, state_v_first, name="initial_state", dtype=torch.float32):
    """A `dtype` (the kernels': fp32) [N, HV, K, V] contiguous state (copied if it is not one, or
    transposed from [N, HV, V, K] with state_v_first)."""
    if state is None:
        return None
    HV, K, V = v.shape[2], q.shape[3], v.shape[3]
    want = (n, HV, V, K) if state_v_first else (n, HV, K, V)
    if tuple(state.shape) != want:
        layout = "[N, HV, V, K]" if state_v_first else "[N, HV, K, V]"
        raise ValueError(f"kla: {name} must be {layout} = {want}, got {tuple(state.shape)}")
    if state_v_first:
        state = state.transpose(-1, -2)
    if state.dtype != dtype:
        state = state.to(dtype)
    return state.contiguous()


def _enum(table, value, name):
    try:
        return table[value]
    except KeyError:
        raise ValueError(f"kla: {name} must be one of {sorted(table)}, got {value!r}") from None


def _scale(scale, q, readout):
    if readout == P.READOUT_Q_L2NORM:
        if scale is not None:
            raise ValueError("kla: readout='q_l2norm' divides by |q| and takes no scale")
        return 0.0
    return float(q.shape[-1] ** -0.5 if scale is None else scale)


_functorch_stack = torch._C._functorch.peek_interpreter_stack
_dispatch_modes = torch._C._len_torch_dispatch_stack


def _plain_eager(q):
    """True for an eager call on plain CUDA tensors: no torch.compile, no FakeTensor or other
    subclass, no functorch transform and no dispatch mode, which need the registered ops."""
    return (type(q) is torch.Tensor and q.is_cuda and not torch.compiler.is_compiling() and
            _functorch_stack() is None and _dispatch_modes() == 0)


def _eager(*tensors):
    """True when the direct call may replace the op: a plain eager call (_plain_eager) that
    needs no autograd graph."""
    return _plain_eager(tensors[0]) and not _grad_needed(*tensors)


def _forward_op(op, impl, autograd, q, k, v, g, eta, h0):
    """The function a forward call runs: `impl` directly (_eager), `autograd` (ops.EagerAutograd)
    for a plain eager call that needs a gradient, else the registered `op`."""
    if not _plain_eager(q):
        return op
    return autograd if _grad_needed(q, k, v, g, eta, h0) else impl


def _grad_needed(*tensors):
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


# ---- the shared bodies -------------------------------------------------------------------------
def _chunk(q, k, v, g, eta, eta_value, eps, scale, initial_state, output_final_state,
           cu_seqlens, cu_seqlens_cpu, use_qk_l2norm_in_kernel, state_v_first, coefficient,
           readout, arithmetic, path, value_slice, segments=0, save_states=False,
           state_grad="auto", chain_segment=0):
    _check_qkv(q, k, v)
    arithmetic = _enum(P.ARITHMETIC, arithmetic, "arithmetic")
    path = _enum(P.PATHS, path, "path")
    if path == P.PATH_TOKENWISE:
        raise ValueError("kla: path='tokenwise' is the decode kernel: call fused_recurrent_*")
    segments, value_slice = _segments(segments), int(value_slice)
    if _save_states(save_states):
        _check_can_save(q, v, arithmetic, path, value_slice, segments)
    schedule = _schedule(state_grad, chain_segment, save_states)
    cu_seqlens, cu_seqlens_cpu = _seqlens(q, cu_seqlens, cu_seqlens_cpu)
    n = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    scale = _scale(scale, q, readout)
    readout = _qk_readout(readout, use_qk_l2norm_in_kernel)
    q, k, v = _last_contiguous(q), _last_contiguous(k), _last_contiguous(v)
    g, eta = _gate(g, "g", v), _gate(eta, "beta" if coefficient else "eta", v)
    h0 = _state_in(initial_state, q, v, n, state_v_first)
    args = (q, k, v, g, eta, h0, cu_seqlens, cu_seqlens_cpu, scale, float(eps),
            float(eta_value), coefficient, readout, bool(output_final_state), arithmetic, path,
            value_slice, segments)
    if save_states and _grad_needed(q, k, v, g, eta, h0):
        # The saving forward and, through its autograd formula, the backward from its states;
        # the states live in the autograd graph (ctx) until the backward has run.
        fn = (ops.chunk_fwd_saving_autograd if _plain_eager(q) else ops.chunk_fwd_saving)
        o, final, _ = fn(*args, *schedule)
    else:  # no gradient wanted (or save_states=False): nothing to save, the ordinary forward
        fn = _forward_op(ops.chunk_fwd, ops.chunk_fwd_impl, ops.chunk_fwd_autograd, q, k, v, g,
                         eta, h0)
        o, final = fn(*args)
    return o, _state_out(final, output_final_state, state_v_first)


def _save_states(save_states):
    if not isinstance(save_states, bool):
        raise ValueError(f"kla: save_states must be True or False, got {save_states!r}")
    return save_states


# What kla_saved_states_size accepts (kla.h "Saved states"): the backward's bf16 kernels' calls,
# with the forward on the WY path at 32-column slices in one pass.
SAVE_HEAD_DIM, SAVE_SEGMENTS = 128, (0, 1)
# The paths with a saving scan and the value slices each takes (0: the plan's), as
# kla_saved_states_size checks them.
SAVE_VALUE_SLICES = {P.PATH_AUTO: (0, 32), P.PATH_WY: (0, 32), P.PATH_WY_TRANSPOSED: (0, 64)}
_SAVE_DEVICES = ("cuda", "meta")  # meta: shapes only (the fake kernels), as the other ops


def _check_can_save(q, v, arithmetic, path, value_slice, segments):
    """save_states=True is only valid where the library can save: each condition of
    kla_saved_states_size checked here, on the host before anything runs, so that a call that
    cannot save is a ValueError naming the condition (never a silent fallback to recomputing).
    The library checks again (kla_saved_states_size, then the launch: the WY path needs a sm_90a
    device)."""
    arg = "save_states=True"
    if q.device.type not in _SAVE_DEVICES:
        raise ValueError(f"kla: {arg} needs CUDA tensors (the saving forward and its backward "
                         f"are the kernels), got q on {q.device}")
    if q.dtype != torch.bfloat16:
        raise ValueError(f"kla: {arg} needs bfloat16 q, k, v (the states are saved for the "
                         f"backward's bf16 kernels), got {str(q.dtype).replace('torch.', '')}")
    if arithmetic != P.ARITHMETIC_FAST:
        raise ValueError(f"kla: {arg} needs arithmetic='fast' (the states are saved for the FAST "
                         f"backward's bf16 kernels), got "
                         f"arithmetic={P.ARITHMETIC_NAMES[arithmetic]!r}")
    K, V = q.shape[3], v.shape[3]
    if K != SAVE_HEAD_DIM or V != SAVE_HEAD_DIM:
        raise ValueError(f"kla: {arg} needs head dims K = V = {SAVE_HEAD_DIM} (the backward's "
                         f"bf16 kernels'), got K = {K}, V = {V}")
    name = next(n for n, c in P.PATHS.items() if c == path)
    if path not in SAVE_VALUE_SLICES:
        raise ValueError(f"kla: {arg} runs the forward on a WY scan that saves (path 'auto', "
                         f"'wy' or 'wy_transposed'), got path={name!r}")
    if value_slice not in SAVE_VALUE_SLICES[path]:
        raise ValueError(f"kla: {arg} on path {name!r} takes value_slice "
                         f"{' or '.join(map(str, SAVE_VALUE_SLICES[path]))} (the saving scan's "
                         f"columns), got value_slice={value_slice!r}")
    if segments not in SAVE_SEGMENTS:
        raise ValueError(f"kla: {arg} runs the forward in one pass (segments 0 or 1), got "
                         f"segments={segments!r}")


def _schedule(state_grad, chain_segment, save_states):
    """(state_grad, chain_segment) as chunk_fwd_saving takes them: the saved backward's
    state-gradient schedule (kla.h kla_state_grad), checked here so that a bad one is a ValueError
    before anything runs; anything but the default needs save_states=True (it is the schedule of
    the backward from saved states)."""
    sg = _enum(P.STATE_GRADS, state_grad, "state_grad")
    if isinstance(chain_segment, bool) or not isinstance(chain_segment, int) or (
            chain_segment != 0 and chain_segment not in P.CHAIN_SEGMENTS):
        raise ValueError(f"kla: chain_segment must be 0 (the plan's choice) or one of "
                         f"{P.CHAIN_SEGMENTS} chunks, got {chain_segment!r}")
    if chain_segment and sg != P.STATE_GRAD_CHAIN:
        raise ValueError(f"kla: chain_segment={chain_segment} needs state_grad='chain', got "
                         f"state_grad={state_grad!r}")
    if (sg or chain_segment) and not save_states:
        raise ValueError(f"kla: state_grad={state_grad!r} chooses the schedule of the backward "
                         f"from saved states: it needs save_states=True")
    return sg, chain_segment


def _segments(segments):
    if isinstance(segments, bool) or not isinstance(segments, int) or not 0 <= segments <= 16:
        raise ValueError(f"kla: segments must be an int in [0, 16] (0: the plan's choice, 1: no "
                         f"split), got {segments!r}")
    return segments


def _state_out(final, output_final_state, state_v_first):
    if not output_final_state:
        return None
    return final.transpose(-1, -2).contiguous() if state_v_first else final


def _recurrent(q, k, v, g, eta, eta_value, eps, scale, initial_state, output_final_state,
               cu_seqlens, cu_seqlens_cpu, use_qk_l2norm_in_kernel, state_v_first,
               inplace_final_state, ssm_state_indices, ssm_state_indices_cpu, coefficient,
               readout):
    if (cu_seqlens is None and ssm_state_indices is None and not use_qk_l2norm_in_kernel and
            not state_v_first and cu_seqlens_cpu is None and ssm_state_indices_cpu is None):
        r = _fast.decode(q, k, v, g, eta, eta_value, eps, scale, readout, coefficient,
                         initial_state, inplace_final_state, output_final_state)
        if r is not None:
            return r
    _check_qkv(q, k, v)
    cu_seqlens, cu_seqlens_cpu = _seqlens(q, cu_seqlens, cu_seqlens_cpu)
    n = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    scale = _scale(scale, q, readout)
    readout = _qk_readout(readout, use_qk_l2norm_in_kernel)
    q, k, v = _last_contiguous(q), _last_contiguous(k), _last_contiguous(v)
    g, eta = _gate(g, "g", v), _gate(eta, "beta" if coefficient else "eta", v)
    common = (scale, float(eps), float(eta_value), coefficient, readout)
    if ssm_state_indices is None and not inplace_final_state:
        if ssm_state_indices_cpu is not None:
            raise ValueError("kla: ssm_state_indices_cpu is given without ssm_state_indices")
        h0 = _state_in(initial_state, q, v, n, state_v_first)
        args = (q, k, v, g, eta, h0, cu_seqlens, cu_seqlens_cpu) + common + (
            bool(output_final_state),)
        fn = _forward_op(ops.recurrent_fwd, ops.recurrent_fwd_impl, ops.recurrent_fwd_autograd,
                         q, k, v, g, eta, h0)
        o, final = fn(*args)
        return o, _state_out(final, output_final_state, state_v_first)

    # In place: the state [N, HV, K, V] itself, or the pool rows ssm_state_indices picks.
    state = initial_state
    if state is None:
        raise ValueError("kla: inplace_final_state / ssm_state_indices need initial_state (the "
                         "state, or the state pool, updated in place)")
    if state.dtype != torch.float32 or not state.is_contiguous():
        raise ValueError(f"kla: a state updated in place must be a contiguous float32 tensor, "
                         f"got {state.dtype}" + ("" if state.is_contiguous() else
                                                 ", not contiguous"))
    HV, K, V = v.shape[2], q.shape[3], v.shape[3]
    if ssm_state_indices is not None:
        if state_v_first:
            _unsupported("state_v_first", True, "with ssm_state_indices the pool must be "
                         "[pool_size, HV, K, V]")
        if state.dim() != 4 or tuple(state.shape[1:]) != (HV, K, V):
            raise ValueError(f"kla: the state pool (initial_state with ssm_state_indices) must "
                             f"be [pool_size, HV, K, V] = [P, {HV}, {K}, {V}], got "
                             f"{tuple(state.shape)}")
        if ssm_state_indices.dim() != 1 or ssm_state_indices.shape[0] != n:
            raise ValueError(f"kla: ssm_state_indices must be 1-d with one index per sequence "
                             f"(N = {n}), got shape {tuple(ssm_state_indices.shape)}")
        if ssm_state_indices.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"kla: ssm_state_indices must be int32 or int64, got "
                            f"{ssm_state_indices.dtype}")
        work = state
    else:
        want = (n, HV, V, K) if state_v_first else (n, HV, K, V)
        if tuple(state.shape) != want:
            layout = "[N, HV, V, K]" if state_v_first else "[N, HV, K, V]"
            raise ValueError(f"kla: initial_state must be {layout} = {want}, got "
                             f"{tuple(state.shape)}")
        work = state.transpose(-1, -2).contiguous() if state_v_first else state
    args = (q, k, v, g, eta, work, ssm_state_indices, ssm_state_indices_cpu, cu_seqlens,
            cu_seqlens_cpu) + common
    if _eager(q, k, v, g, eta, work):
        o = ops.recurrent_fwd_inplace_impl(*args)
    else:
        o = ops.recurrent_fwd_inplace(*args)
        if _grad_needed(q, k, v, g, eta, work):
            o = ops.NoBackward.apply(o)
    if work is not state:
        state.copy_(work.transpose(-1, -2))
    return o, state


# ---- the public functions ----------------------------------------------------------------------
def chunk_kla(q, k, v, g=None, eta=None, eps=1e-6, scale=None, initial_state=None,
              output_final_state=False, cu_seqlens=None, use_qk_l2norm_in_kernel=False, *,
              cu_seqlens_cpu=None, state_v_first=False, readout="scale", arithmetic="accurate",
              path="auto", value_slice=0, segments=0, save_states=False, state_grad="auto",
              chain_segment=0):
    """KLA prefill (kla_chunk_forward, the Kaczmarz coefficient beta = eta / (|k|^2 + eps)
    computed in the kernel in fp32 from the raw key). Returns (o, final_state).

    q, k [B,T,H,K]; v [B,T,HV,V] (HV a multiple of H), fp32 / bf16 / fp16 alike; g [B,T,HV] log
    decay (None: no decay); eta [B,T,HV] gate, or a float for every token (None: 1); eps >= 0;
    scale (None: K^-1/2); initial_state [N,HV,K,V] fp32 ([N,HV,V,K] with state_v_first: a
    transposed copy); final_state likewise when output_final_state, else None. cu_seqlens
    [N+1] int32/int64 packs N sequences in B = 1 (on the device it costs one device-to-host copy
    unless cu_seqlens_cpu holds the same values on the CPU). readout 'scale' or 'q_l2norm'
    (o = S^T q / |q|, no scale); arithmetic 'accurate' (default) or 'fast', the FAST contract:
    an output error no larger than FLA's (bf16 / fp16 on the wy_transposed path round the state
    once to the dtype, 7-9% faster; fp32 runs the WY path, ~3x faster; other paths run
    'accurate'; kla.plan(...).arithmetic says which runs; the backward of a 'fast' call runs its
    products on one TF32 part per operand, and for bf16 at K = V = 128 its prep and state scan
    on split bf16 operands and its input gradients on bf16 operands: gradients still no further
    from float64 than FLA's backward, docs/accuracy.md);
    path / value_slice pin the kernel path (kla.plan shows
    what 'auto' picks); segments splits every sequence into that many segments run side by side
    (0: the plan's choice, which splits only where few sequences and value heads leave the GPU
    idle; 1: never; docs/python.md, 'Sequence split').

    save_states=True (training, opt-in) trades memory for backward time: the forward
    (kla_chunk_forward_saving) also saves each 64-token chunk's incoming state S and its U, in
    bf16, as the backward's own state scan would compute them, and the backward
    (kla_chunk_backward_saved) reads them instead of recomputing them: the same gradients'
    contract as save_states=False, about 15% faster. The saved states stay alive in the autograd
    graph from the forward until the backward has run (or the graph is freed): 48 KB per 64-token
    chunk and value head, 0.75 GiB at 32768 tokens x 32 value heads, on top of what the forward
    keeps anyway. The forward runs in one pass on a scan that saves: the plan's own path where it
    is 'wy_transposed' or 'wy' at 32 columns, otherwise 'wy' at 32 columns; its outputs are
    bitwise those of that path with save_states=False (the same kernels). Valid only where the
    library can save: CUDA tensors, bf16, arithmetic='fast', K = V = 128, path 'auto', 'wy'
    (value_slice 0 or 32) or 'wy_transposed' (0 or 64), segments 0 or 1 (and a sm_90a GPU);
    anything else raises ValueError naming the condition,
    checked on every call, never a silent fallback. Where no gradient is needed
    (torch.is_grad_enabled() false, or no input requires grad) there is nothing to save for: the
    ordinary forward runs (the path the plan picks, as with save_states=False).

    state_grad / chain_segment (with save_states=True) pin how that backward forms the state
    gradient, as path pins the forward's kernels (kla.h kla_state_grad): 'auto' (the library's
    choice: 'chain' where it can run, a sm_90a GPU, else 'scan'), 'scan' (one sequential scan a
    sequence, value head and 32 value columns) or 'chain' (each sequence cut into segments of
    chain_segment chunks, 8 to 128, a power of two; 0: the library's pick, run side by side from
    certified warm-up windows). The same gradients' contract on each; a schedule the GPU cannot
    run raises KlaError from the backward, saying why.
    """
    eta_value = 1.0
    if eta is not None and not isinstance(eta, torch.Tensor):
        eta_value, eta = float(eta), None
    return _chunk(q, k, v, g, eta, eta_value, eps, scale, initial_state, output_final_state,
                  cu_seqlens, cu_seqlens_cpu, use_qk_l2norm_in_kernel, state_v_first,
                  P.COEFF_KACZMARZ, _enum(P.READOUTS, readout, "readout"), arithmetic, path,
                  value_slice, segments, save_states, state_grad, chain_segment)


def fused_recurrent_kla(q, k, v, g=None, eta=None, eps=1e-6, scale=None, initial_state=None,
                        output_final_state=False, cu_seqlens=None,
                        use_qk_l2norm_in_kernel=False, *, cu_seqlens_cpu=None,
                        inplace_final_state=False, ssm_state_indices=None,
                        ssm_state_indices_cpu=None, state_v_first=False, readout="scale"):
    """KLA decode and short speculative steps (kla_tokenwise_forward): T >= 1 tokens per
    sequence, the arguments of chunk_kla. Returns (o, final_state).

    inplace_final_state=True updates initial_state ([N,HV,K,V] fp32 contiguous) in place and
    returns it as final_state. ssm_state_indices [N] (int32/int64; -1 skips a sequence, whose o
    rows are zero and whose pool row is untouched) makes initial_state a state pool
    [pool_size,HV,K,V] updated in place at those rows; indices on the device cost one
    device-to-host copy unless ssm_state_indices_cpu holds them on the CPU.
    """
    eta_value = 1.0
    if eta is not None and not isinstance(eta, torch.Tensor):
        eta_value, eta = float(eta), None
    return _recurrent(q, k, v, g, eta, eta_value, eps, scale, initial_state, output_final_state,
                      cu_seqlens, cu_seqlens_cpu, use_qk_l2norm_in_kernel, state_v_first,
                      inplace_final_state, ssm_state_indices, ssm_state_indices_cpu,
                      P.COEFF_KACZMARZ, _enum(P.READOUTS, readout, "readout"))


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
                           output_final_state=False, use_qk_l2norm_in_kernel=False,
                           use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                           state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
                           chunk_indices=None, cp_context=None, *, arithmetic="accurate",
                           path="auto", value_slice=0, segments=0, save_states=False,
                           state_grad="auto", chain_segment=0, **kwargs):
    """FLA 0.6's chunk_gated_delta_rule (plain GDN, beta given) on kla_chunk_forward.

    Same arguments and returns as FLA's; chunk_indices and chunk_size are accepted and ignored.
    use_gate_in_kernel / A_log / dt_bias, use_beta_sigmoid_in_kernel, allow_neg_eigval and
    cp_context raise NotImplementedError naming the argument. kla extras: arithmetic, path,
    value_slice, segments, save_states (as chunk_kla: save_states=True with bf16,
    arithmetic='fast', K = V = 128 saves each 64-token chunk's state and U for the backward, 48 KB
    per chunk and value head, 0.75 GiB at 32768 tokens x 32 value heads, for a backward about 15%
    faster; outputs bitwise those of save_states=False on the saving scan chunk_kla names; without
    a gradient to compute the ordinary forward runs; a call that cannot save raises ValueError
    saying why), state_grad / chain_segment (as chunk_kla: the saved backward's schedule).
    """
    state_v_first = _state_v_first_alias(kwargs, state_v_first)
    _check_kwargs(kwargs, "chunk_gated_delta_rule")
    _check_gdn_flags(use_beta_sigmoid_in_kernel, allow_neg_eigval, cp_context)
    if beta is None:
        raise ValueError("kla: chunk_gated_delta_rule needs beta ([B, T, HV])")
    return _chunk(q, k, v, g, beta, 1.0, 0.0, scale, initial_state, output_final_state,
                  cu_seqlens, cu_seqlens_cpu, use_qk_l2norm_in_kernel, state_v_first,
                  P.COEFF_GIVEN, P.READOUT_SCALE, arithmetic, path, value_slice, segments,
                  save_states, state_grad, chain_segment)


def fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None, scale=None,
                                     initial_state=None, output_final_state=False,
                                     use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                                     A_log=None, dt_bias=None, use_beta_sigmoid_in_kernel=False,
                                     allow_neg_eigval=False, state_v_first=False,
                                     cu_seqlens=None, *, cu_seqlens_cpu=None,
                                     inplace_final_state=False, ssm_state_indices=None,
                                     ssm_state_indices_cpu=None, **kwargs):
    """FLA 0.6's fused_recurrent_gated_delta_rule (plain GDN decode) on kla_tokenwise_forward.

    beta None means 1 (as FLA). gk / gv (per-channel decay), use_gate_in_kernel / A_log /
    dt_bias, use_beta_sigmoid_in_kernel and allow_neg_eigval raise NotImplementedError naming
    the argument. kla extras: cu_seqlens_cpu, inplace_final_state, ssm_state_indices(_cpu) (as
    fused_recurrent_kla).
    """
    if kwargs or use_gate_in_kernel or A_log is not None or dt_bias is not None:
        state_v_first = _state_v_first_alias(kwargs, state_v_first)
        kwargs.update(use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias)
        _check_kwargs(kwargs, "fused_recurrent_gated_delta_rule")
    if use_beta_sigmoid_in_kernel or allow_neg_eigval:
        _check_gdn_flags(use_beta_sigmoid_in_kernel, allow_neg_eigval, None)
    if gk is not None or gv is not None:
        _unsupported("gk" if gk is not None else "gv", "<tensor>",
                     "kla's decay is one scalar per head and token (g)")
    return _recurrent(q, k, v, g, beta, 1.0, 0.0, scale, initial_state, output_final_state,
                      cu_seqlens, cu_seqlens_cpu, use_qk_l2norm_in_kernel, state_v_first,
                      inplace_final_state, ssm_state_indices, ssm_state_indices_cpu,
                      P.COEFF_GIVEN, P.READOUT_SCALE)


def _check_gdn_flags(use_beta_sigmoid_in_kernel, allow_neg_eigval, cp_context):
    if use_beta_sigmoid_in_kernel:
        _unsupported("use_beta_sigmoid_in_kernel", True, "pass beta.sigmoid() as beta")
    if allow_neg_eigval:
        _unsupported("allow_neg_eigval", True, "pass 2 * beta.sigmoid() as beta")
    if cp_context is not None:
        _unsupported("cp_context", "<FLACPContext>", "context parallelism is "
                     "kla.cp.chunk_gated_delta_rule_cp (a process group, a time shard a rank)")


chunk_gdn = chunk_gated_delta_rule
fused_recurrent_gdn = fused_recurrent_gated_delta_rule
