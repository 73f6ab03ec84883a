"""The torch ops (namespace "kla") over the C entry points, with fake (meta) kernels and autograd.

    torch.ops.kla.chunk_fwd              kla_chunk_forward: prefill (o, final_state)
    torch.ops.kla.recurrent_fwd          kla_tokenwise_forward, new final state (o, final_state)
    torch.ops.kla.recurrent_fwd_inplace  kla_tokenwise_forward on `state` in place, or on the rows
                                         state_indices picks of a state pool (-1 skips): o
    torch.ops.kla.chunk_bwd              the gradients of chunk_fwd / recurrent_fwd, which their
                                         autograd formulas call: kla_chunk_backward on CUDA
                                         (K, V <= 128), else _backward.py (PyTorch)
    torch.ops.kla.chunk_fwd_saving       kla_chunk_forward_saving: chunk_fwd's outputs plus the
                                         saved states (uint8, kla_saved_states_size bytes)
    torch.ops.kla.chunk_bwd_saved        its backward, kla_chunk_backward_saved: chunk_bwd's
                                         gradients from the saved states (no state scan)

Arguments are the C ABI's, already checked and converted by api.py (q, k, v of one dtype with the
last dimension contiguous; g, eta fp32 [B,T,HV] with HV contiguous; states fp32 contiguous):
enums as ints (kla.h's values). final_state is an empty tensor (shape [0]) when not asked for:
custom ops cannot return None. The implementation allocates o, the final state and the
workspace with torch (the caching allocator, on the call's device and current stream), makes the
int32 copies of cu_seqlens / indices (_indices.py) and calls the library on
torch.cuda.current_stream() with the tensors' device current. It never synchronises the host,
except for the host copy of cu_seqlens or indices given only on the device (the backward reads
cu_seqlens on the host too).
"""
import ctypes
from typing import Optional, Tuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from . import _backward
from . import _lib
from . import _params as P
from ._indices import host_and_device

CHUNK, RECURRENT, CHUNK_SAVING = 0, 1, 2
_NO_INPLACE_BACKWARD = (
    "kla: a decode step that updates its state in place (inplace_final_state / "
    "ssm_state_indices) has no backward: the state it would differentiate through is "
    "overwritten. For training call with output_final_state=True instead, or run the step "
    "under torch.no_grad()")

_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream(index):
    if _raw_stream is not None:
        return _raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream


def _require_cuda(dev):
    if dev.type != "cuda":
        raise ValueError(f"kla: the kernels run on CUDA tensors; q is on {dev}")


def _call(entry, ref, dev, *extra):
    """entry(&params, *extra, stream) on the current stream of dev, with dev the current device
    (the C ABI launches on the current device); extra: the saved-states buffer and its size of
    the saving entry points. Returns the kla_status."""
    index = dev.index
    if torch.cuda.current_device() == index:
        return entry(ref, *extra, _stream(index))
    with torch.cuda.device(index):
        return entry(ref, *extra, _stream(index))


def launch(kind, q, k, v, o, *, g=None, eta=None, eta_value=1.0, eps=0.0, scale=0.0,
           coefficient=P.COEFF_KACZMARZ, readout=P.READOUT_SCALE, initial_state=None,
           final_state=None, state_pool=None, state_indices=None, state_indices_cpu=None,
           cu_seqlens=None, cu_seqlens_cpu=None, arithmetic=P.ARITHMETIC_ACCURATE,
           path=P.PATH_AUTO, value_slice=0, segments=0):
    """Fills kla_params for these tensors and enqueues the kernel on the current stream. kind
    CHUNK_SAVING runs kla_chunk_forward_saving and returns the saved states it wrote (a uint8
    device tensor of kla_saved_states_size bytes); the other kinds return None."""
    lib = _lib.load()
    dev = q.device
    _require_cuda(dev)
    cu_host = cu_dev = idx_host = idx_dev = None
    if cu_seqlens is not None:
        cu_host, cu_dev = host_and_device(cu_seqlens, cu_seqlens_cpu, dev, "cu_seqlens",
                                         remember=True)
    if state_pool is not None:
        idx_host, idx_dev = host_and_device(state_indices, state_indices_cpu, dev,
                                            "ssm_state_indices")
    p = P.fill(lib.params(), q, k, v, o, g=g, eta=eta, eta_value=eta_value, eps=eps,
               scale=scale, coefficient=coefficient, readout=readout,
               initial_state=initial_state, final_state=final_state, state_pool=state_pool,
               state_indices=idx_dev, state_indices_host=idx_host, cu_seqlens=cu_dev,
               cu_seqlens_host=cu_host, arithmetic=arithmetic, path=path,
               value_slice=value_slice, segments=segments)
    ref = ctypes.byref(p)
    workspace = saved = None
    extra = ()
    if kind in (CHUNK, CHUNK_SAVING):
        entry = lib.chunk_forward
        if path != P.PATH_GENERIC:  # the only path that runs without one
            size = lib.workspace_size(ref)
            if size:
                workspace = torch.empty(size, dtype=torch.uint8, device=dev)
                p.workspace, p.workspace_size = workspace.data_ptr(), size
        if kind == CHUNK_SAVING:
            entry = lib.chunk_forward_saving
            saved = _saved_buffer(lib, ref, q, v, cu_seqlens)
            extra = (saved.data_ptr(), saved.numel())
    else:
        entry = lib.tokenwise_forward
    status = _call(entry, ref, dev, *extra)
    if status:
        raise lib.error(status)
    # The workspace goes back to the caching allocator here, reused only by work queued after
    # this call on the same stream.
    del workspace
    return saved


SAVED_CHUNK = 64  # tokens per saved record (kla.h: per 64-token chunk and value head)


def saved_states_bytes(q, v, cu_seqlens):
    """Bytes of the saved states of a saving forward over these shapes (no data read: the fake
    kernel's size): kla.h's records [chunk slot][HV] of K V + 64 V bf16 values, chunk slots as
    the workspace's (cuda/src/layout/chunk_geometry.hpp, chunk_slots: N ceil(T / 64) unpacked,
    T // 64 + N for N packed sequences, each of which may end in a partial chunk)."""
    B, T, _, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if cu_seqlens is None:
        slots = B * ((T + SAVED_CHUNK - 1) // SAVED_CHUNK)
    else:
        slots = T // SAVED_CHUNK + (cu_seqlens.shape[0] - 1)
    return slots * HV * (K * V + SAVED_CHUNK * V) * 2


def _saved_buffer(lib, ref, q, v, cu_seqlens):
    """The saved-states buffer of this call: kla_saved_states_size bytes from the caching
    allocator (its blocks are 512-byte aligned: kla.h asks 16). The size must be the fake
    kernel's (saved_states_bytes), or compiled graphs would be traced with another shape."""
    size = lib.saved_states_size(ref)
    if not size:
        raise ValueError(f"kla: save_states=True: this call cannot save its states: "
                         f"{lib.cdll.kla_last_error_message().decode()}")
    want = saved_states_bytes(q, v, cu_seqlens)
    if size != want:
        raise RuntimeError(f"kla: kla_saved_states_size says {size} bytes where the package's "
                           f"formula says {want} (ops.saved_states_bytes): the library and the "
                           f"package disagree on the saved states' layout")
    return torch.empty(size, dtype=torch.uint8, device=q.device)


def _final_state(q, v, cu_seqlens, output_final_state):
    if not output_final_state:
        return q.new_empty(0, dtype=torch.float32)
    n = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    return q.new_empty((n, v.shape[2], q.shape[3], v.shape[3]), dtype=torch.float32)


def _out(v):
    return v.new_empty(v.shape)


# ---- kla::chunk_fwd -------------------------------------------------------------------------
def chunk_fwd_impl(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor],
                   eta: Optional[Tensor], initial_state: Optional[Tensor],
                   cu_seqlens: Optional[Tensor], cu_seqlens_cpu: Optional[Tensor],
                   scale: float, eps: float, eta_value: float, coefficient: int, readout: int,
                   output_final_state: bool, arithmetic: int, path: int,
                   value_slice: int, segments: int = 0) -> Tuple[Tensor, Tensor]:
    o = _out(v)
    final = _final_state(q, v, cu_seqlens, output_final_state)
    launch(CHUNK, q, k, v, o, g=g, eta=eta, eta_value=eta_value, eps=eps, scale=scale,
           coefficient=coefficient, readout=readout, initial_state=initial_state,
           final_state=final if output_final_state else None, cu_seqlens=cu_seqlens,
           cu_seqlens_cpu=cu_seqlens_cpu, arithmetic=arithmetic, path=path,
           value_slice=value_slice, segments=segments)
    return o, final


chunk_fwd = torch.library.custom_op("kla::chunk_fwd", chunk_fwd_impl, mutates_args=())


@chunk_fwd.register_fake
def _(q, k, v, g, eta, initial_state, cu_seqlens, cu_seqlens_cpu, scale, eps, eta_value,
      coefficient, readout, output_final_state, arithmetic, path, value_slice, segments=0):
    return _out(v), _final_state(q, v, cu_seqlens, output_final_state)


# ---- kla::chunk_fwd_saving: chunk_fwd that also saves its backward's states -----------------
def chunk_fwd_saving_impl(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor],
                          eta: Optional[Tensor], initial_state: Optional[Tensor],
                          cu_seqlens: Optional[Tensor], cu_seqlens_cpu: Optional[Tensor],
                          scale: float, eps: float, eta_value: float, coefficient: int,
                          readout: int, output_final_state: bool, arithmetic: int, path: int,
                          value_slice: int, segments: int = 0, state_grad: int = 0,
                          chain_segment: int = 0) -> Tuple[Tensor, Tensor, Tensor]:
    """chunk_fwd's (o, final_state) through kla_chunk_forward_saving, plus `saved`: each chunk's
    incoming state and U (kla.h "Saved states"), a uint8 tensor for chunk_bwd_saved. The outputs
    are kla_chunk_forward's on the scan it saves with (the plan's where it is wy_transposed or wy
    at 32 columns, else wy at 32). Only calls the library can save
    (bf16, FAST, K = V = 128; api.py checks them first): any other is refused. state_grad and
    chain_segment are not the forward's: its autograd formula hands them to chunk_bwd_saved (the
    backward's state-gradient schedule, kla.h kla_state_grad; 0, 0: the library's choice)."""
    o = _out(v)
    final = _final_state(q, v, cu_seqlens, output_final_state)
    saved = launch(CHUNK_SAVING, q, k, v, o, g=g, eta=eta, eta_value=eta_value, eps=eps,
                   scale=scale, coefficient=coefficient, readout=readout,
                   initial_state=initial_state,
                   final_state=final if output_final_state else None, cu_seqlens=cu_seqlens,
                   cu_seqlens_cpu=cu_seqlens_cpu, arithmetic=arithmetic, path=path,
                   value_slice=value_slice, segments=segments)
    return o, final, saved


chunk_fwd_saving = torch.library.custom_op("kla::chunk_fwd_saving", chunk_fwd_saving_impl,
                                           mutates_args=())


@chunk_fwd_saving.register_fake
def _(q, k, v, g, eta, initial_state, cu_seqlens, cu_seqlens_cpu, scale, eps, eta_value,
      coefficient, readout, output_final_state, arithmetic, path, value_slice, segments=0,
      state_grad=0, chain_segment=0):
    # The size from the shapes alone (kla_saved_states_size's formula; the library's own is
    # checked against it at every real call, _saved_buffer).
    saved = q.new_empty(saved_states_bytes(q, v, cu_seqlens), dtype=torch.uint8)
    return _out(v), _final_state(q, v, cu_seqlens, output_final_state), saved


# ---- kla::recurrent_fwd ---------------------------------------------------------------------
def recurrent_fwd_impl(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor],
                       eta: Optional[Tensor], initial_state: Optional[Tensor],
                       cu_seqlens: Optional[Tensor], cu_seqlens_cpu: Optional[Tensor],
                       scale: float, eps: float, eta_value: float, coefficient: int,
                       readout: int, output_final_state: bool) -> Tuple[Tensor, Tensor]:
    o = _out(v)
    final = _final_state(q, v, cu_seqlens, output_final_state)
    launch(RECURRENT, q, k, v, o, g=g, eta=eta, eta_value=eta_value, eps=eps, scale=scale,
           coefficient=coefficient, readout=readout, initial_state=initial_state,
           final_state=final if output_final_state else None, cu_seqlens=cu_seqlens,
           cu_seqlens_cpu=cu_seqlens_cpu)
    return o, final


recurrent_fwd = torch.library.custom_op("kla::recurrent_fwd", recurrent_fwd_impl,
                                        mutates_args=())


@recurrent_fwd.register_fake
def _(q, k, v, g, eta, initial_state, cu_seqlens, cu_seqlens_cpu, scale, eps, eta_value,
      coefficient, readout, output_final_state):
    return _out(v), _final_state(q, v, cu_seqlens, output_final_state)


# ---- kla::recurrent_fwd_inplace -------------------------------------------------------------
def recurrent_fwd_inplace_impl(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor],
                               eta: Optional[Tensor], state: Tensor,
                               state_indices: Optional[Tensor],
                               state_indices_cpu: Optional[Tensor],
                               cu_seqlens: Optional[Tensor], cu_seqlens_cpu: Optional[Tensor],
                               scale: float, eps: float, eta_value: float, coefficient: int,
                               readout: int) -> Tensor:
    pooled = state_indices is not None
    # Pool rows of skipped sequences (index -1) are not written: zeros, not garbage.
    o = v.new_zeros(v.shape) if pooled else _out(v)
    launch(RECURRENT, q, k, v, o, g=g, eta=eta, eta_value=eta_value, eps=eps, scale=scale,
           coefficient=coefficient, readout=readout,
           initial_state=None if pooled else state, final_state=None if pooled else state,
           state_pool=state if pooled else None, state_indices=state_indices,
           state_indices_cpu=state_indices_cpu, cu_seqlens=cu_seqlens,
           cu_seqlens_cpu=cu_seqlens_cpu)
    return o


recurrent_fwd_inplace = torch.library.custom_op("kla::recurrent_fwd_inplace",
                                                recurrent_fwd_inplace_impl,
                                                mutates_args=("state",))


@recurrent_fwd_inplace.register_fake
def _(q, k, v, g, eta, state, state_indices, state_indices_cpu, cu_seqlens, cu_seqlens_cpu,
      scale, eps, eta_value, coefficient, readout):
    return _out(v)


# ---- kla::chunk_bwd: the backward of chunk_fwd and recurrent_fwd ---------------------------
BACKWARD_MAX_HEAD_DIM = 128  # kla.h: the backward kernels' largest K and V


def launch_backward(q, k, v, g, eta, initial_state, cu_seqlens, cu_seqlens_cpu, scale, eps,
                    eta_value, coefficient, readout, do, dht, arithmetic, saved=None, state_grad=0,
                    chain_segment=0):
    """kla_chunk_backward on the current stream: the gradients, allocated here (dq, dk like q,
    dv like v, dg / deta / dh0 fp32, empty where the input is None), with a workspace from the
    caching allocator sized by kla_backward_workspace_size; `arithmetic` is the forward's (FAST:
    the backward's products on one TF32 part, its input gradients on bf16 operands for bf16 at
    K = V = 128, kla.h). With `saved` (the saving forward's states, same inputs) it runs
    kla_chunk_backward_saved, which reads them instead of recomputing them, or, with a
    state_grad / chain_segment other than 0 (kla.h kla_state_grad), kla_chunk_backward_saved_as on
    that schedule."""
    lib = _lib.load()
    dev = q.device
    cu_host = cu_dev = None
    if cu_seqlens is not None:
        cu_host, cu_dev = host_and_device(cu_seqlens, cu_seqlens_cpu, dev, "cu_seqlens",
                                         remember=True)
    if do.dtype != v.dtype or not do.is_contiguous():  # autograd may hand an expanded one
        do = do.to(v.dtype).contiguous()
    if dht is not None and (dht.dtype != torch.float32 or not dht.is_contiguous()):
        dht = dht.float().contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    empty = q.new_empty(0, dtype=torch.float32)
    dg = torch.empty(g.shape, dtype=torch.float32, device=dev) if g is not None else None
    deta = torch.empty(eta.shape, dtype=torch.float32, device=dev) if eta is not None else None
    dh0 = (torch.empty(initial_state.shape, dtype=torch.float32, device=dev)
           if initial_state is not None else None)
    bp = lib.backward_params()
    P.fill(bp.forward, q, k, v, do, g=g, eta=eta, eta_value=eta_value, eps=eps, scale=scale,
           coefficient=coefficient, readout=readout, initial_state=initial_state,
           cu_seqlens=cu_dev, cu_seqlens_host=cu_host, arithmetic=arithmetic)
    ref = ctypes.byref(bp)
    size = lib.backward_workspace_size(ref)
    workspace = torch.empty(max(size, 16), dtype=torch.uint8, device=dev)
    P.fill_backward(bp, do, dq, dk, dv, dht=dht, dg=dg, deta=deta, dh0=dh0, workspace=workspace)
    if saved is None:
        status = _call(lib.chunk_backward, ref, dev)
    elif state_grad == 0 and chain_segment == 0:
        status = _call(lib.chunk_backward_saved, ref, dev, saved.data_ptr(), saved.numel())
    else:
        status = _call(lib.chunk_backward_saved_as, ref, dev, saved.data_ptr(), saved.numel(),
                       state_grad, chain_segment)
    if status:
        raise lib.error(status)
    del workspace
    return (dq, dk, dv, dg if dg is not None else empty, deta if deta is not None else empty,
            dh0 if dh0 is not None else empty)



def chunk_bwd_impl(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], eta: Optional[Tensor],
                   initial_state: Optional[Tensor], cu_seqlens: Optional[Tensor],
                   cu_seqlens_cpu: Optional[Tensor], scale: float, eps: float, eta_value: float,
                   coefficient: int, readout: int, do: Tensor, dht: Optional[Tensor],
                   arithmetic: int = P.ARITHMETIC_ACCURATE
                   ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dg, deta, dh0) of the forward with these arguments; dg / deta / dh0 are empty
    (shape [0]) where g / eta / initial_state is None. CUDA tensors with head dims up to 128 run
    kla_chunk_backward (the kernels, launch_backward) in the forward's arithmetic (0 ACCURATE, 1
    FAST); anything else runs _backward.py (PyTorch, the same chunk form, in the inputs' compute
    type, which meets both contracts): on the CPU, and for K or V above the kernels' 128."""
    if q.is_cuda and q.shape[3] <= BACKWARD_MAX_HEAD_DIM and v.shape[3] <= BACKWARD_MAX_HEAD_DIM:
        return launch_backward(q, k, v, g, eta, initial_state, cu_seqlens, cu_seqlens_cpu, scale,
                               eps, eta_value, coefficient, readout, do, dht, arithmetic)
    grads = _backward.chunk_backward(q, k, v, g, eta, initial_state, cu_seqlens, cu_seqlens_cpu,
                                     scale, eps, eta_value, coefficient, readout, do, dht)
    return tuple(x.contiguous() if x is not None else q.new_empty(0, dtype=torch.float32)
                 for x in grads)


chunk_bwd = torch.library.custom_op("kla::chunk_bwd", chunk_bwd_impl, mutates_args=())


def _gradient_shapes(q, k, v, g, eta, initial_state):
    """The fake backwards' outputs: (dq, dk, dv, dg, deta, dh0) shaped as chunk_bwd_impl's."""
    def like(t):
        return torch.empty_like(t) if t is not None else q.new_empty(0, dtype=torch.float32)
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), like(g), like(eta),
            like(initial_state))


@chunk_bwd.register_fake
def _(q, k, v, g, eta, initial_state, cu_seqlens, cu_seqlens_cpu, scale, eps, eta_value,
      coefficient, readout, do, dht, arithmetic=P.ARITHMETIC_ACCURATE):
    return _gradient_shapes(q, k, v, g, eta, initial_state)


# ---- kla::chunk_bwd_saved: chunk_bwd from chunk_fwd_saving's states -------------------------
def chunk_bwd_saved_impl(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor],
                         eta: Optional[Tensor], initial_state: Optional[Tensor],
                         cu_seqlens: Optional[Tensor], cu_seqlens_cpu: Optional[Tensor],
                         scale: float, eps: float, eta_value: float, coefficient: int,
                         readout: int, do: Tensor, dht: Optional[Tensor], arithmetic: int,
                         saved: Tensor, state_grad: int = 0, chain_segment: int = 0
                         ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """chunk_bwd's gradients, by kla_chunk_backward_saved reading `saved` (chunk_fwd_saving's,
    from the same inputs) instead of recomputing each chunk's state, on the state-gradient
    schedule state_grad / chain_segment (launch_backward): the kernels only (the saved states
    exist only where they ran)."""
    _require_cuda(q.device)
    return launch_backward(q, k, v, g, eta, initial_state, cu_seqlens, cu_seqlens_cpu, scale,
                           eps, eta_value, coefficient, readout, do, dht, arithmetic, saved=saved,
                           state_grad=state_grad, chain_segment=chain_segment)


chunk_bwd_saved = torch.library.custom_op("kla::chunk_bwd_saved", chunk_bwd_saved_impl,
                                          mutates_args=())


@chunk_bwd_saved.register_fake
def _(q, k, v, g, eta, initial_state, cu_seqlens, cu_seqlens_cpu, scale, eps, eta_value,
      coefficient, readout, do, dht, arithmetic, saved, state_grad=0, chain_segment=0):
    return _gradient_shapes(q, k, v, g, eta, initial_state)


# ---- autograd -------------------------------------------------------------------------------
_TENSOR_INPUTS = 8  # q, k, v, g, eta, initial_state, cu_seqlens, cu_seqlens_cpu
_SCHEDULE = 18  # chunk_fwd_saving's state_grad, chain_segment: its 19th and 20th arguments


def _save(ctx, inputs, output, *more):
    ctx.save_for_backward(*inputs[:_TENSOR_INPUTS], *more)
    ctx.scalars = tuple(inputs[_TENSOR_INPUTS:_TENSOR_INPUTS + 5])  # scale .. readout
    ctx.num_inputs = len(inputs)
    ctx.arithmetic = P.ARITHMETIC_ACCURATE  # recurrent_fwd has one arithmetic


def _save_chunk(ctx, inputs, output, *more):
    _save(ctx, inputs, output, *more)
    ctx.arithmetic = inputs[_TENSOR_INPUTS + 6]  # chunk_fwd's arithmetic: the backward's too


def _save_chunk_saving(ctx, inputs, output):
    """chunk_fwd_saving's: _save_chunk plus the saved states (output[2]), kept alive in ctx from
    the forward to the backward (they are an integer tensor and get no gradient), and the
    backward's state-gradient schedule (its last two arguments)."""
    _save_chunk(ctx, inputs, output, output[2])
    ctx.schedule = tuple(inputs[_SCHEDULE:_SCHEDULE + 2]) or (0, 0)  # defaults not passed


def _gradients(ctx, do, dht, backward):
    """The gradients of chunk_fwd / recurrent_fwd's inputs (None for the non-tensor ones), from
    what _save kept, by `backward` (chunk_bwd, or its implementation on the eager path)."""
    q, k, v, g, eta, h0, cu, cu_cpu = ctx.saved_tensors[:_TENSOR_INPUTS]
    if do is None:
        do = torch.zeros_like(v)
    if dht is not None and dht.numel() == 0:  # no final state was asked for
        dht = None
    dq, dk, dv, dg, deta, dh0 = backward(q, k, v, g, eta, h0, cu, cu_cpu, *ctx.scalars, do, dht,
                                         ctx.arithmetic)
    grads = (dq, dk, dv, dg if g is not None else None, deta if eta is not None else None,
             dh0 if h0 is not None else None)
    return grads + (None,) * (ctx.num_inputs - len(grads))


def _backward_of_forward(ctx, do, dht):
    """The ops' autograd formula: _gradients through kla::chunk_bwd."""
    return _gradients(ctx, do, dht, chunk_bwd)


def _saved_backward(ctx, backward):
    """`backward` (chunk_bwd_saved or its implementation) with the saved states and the schedule
    _save_chunk_saving kept as its last arguments."""
    saved = ctx.saved_tensors[_TENSOR_INPUTS]
    return lambda *args: backward(*args, saved, *ctx.schedule)


def _backward_of_saving(ctx, do, dht, dsaved):
    """chunk_fwd_saving's autograd formula: _gradients through kla::chunk_bwd_saved (dsaved, the
    gradient of the integer saved states, is None)."""
    return _gradients(ctx, do, dht, _saved_backward(ctx, chunk_bwd_saved))


chunk_fwd.register_autograd(_backward_of_forward, setup_context=_save_chunk)
recurrent_fwd.register_autograd(_backward_of_forward, setup_context=_save)
chunk_fwd_saving.register_autograd(_backward_of_saving, setup_context=_save_chunk_saving)


class EagerAutograd(torch.autograd.Function):
    """chunk_fwd / recurrent_fwd and their backward for plain eager calls that need a gradient:
    the ops' autograd formula (_save, _gradients) with the implementations called directly. The
    registered ops pass each call through the dispatcher and the custom op's Python autograd
    wrapper: on an H100 a forward that needs a gradient spent 749 us of host time that way, 178
    here, and a backward 914 us, 614 here (docs/python.md); in eager training the host time that
    delays the next launch is idle GPU. api.py takes this path only for CUDA tensors outside
    torch.compile, functorch transforms and dispatch modes (everything else: the ops). Grads of
    the outputs are not materialised: an unused final state gives dht None, not a zero tensor.
    No double backward (once_differentiable: differentiating the gradients raises)."""

    @staticmethod
    def forward(ctx, impl, setup, *args):
        out = impl(*args)
        setup(ctx, args, out)
        ctx.set_materialize_grads(False)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, do, dht):
        return (None, None) + _gradients(ctx, do, dht, chunk_bwd_impl)


class EagerAutogradSaving(torch.autograd.Function):
    """EagerAutograd for chunk_fwd_saving: its three outputs (o, final_state, saved), the saved
    states kept in ctx (_save_chunk_saving) and handed to chunk_bwd_saved's implementation."""

    @staticmethod
    def forward(ctx, *args):
        out = chunk_fwd_saving_impl(*args)
        _save_chunk_saving(ctx, args, out)
        ctx.mark_non_differentiable(out[2])
        ctx.set_materialize_grads(False)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, do, dht, dsaved):
        return _gradients(ctx, do, dht, _saved_backward(ctx, chunk_bwd_saved_impl))


def chunk_fwd_autograd(*args):
    """chunk_fwd's arguments and results, through EagerAutograd."""
    return EagerAutograd.apply(chunk_fwd_impl, _save_chunk, *args)


def chunk_fwd_saving_autograd(*args):
    """chunk_fwd_saving's arguments and results, through EagerAutogradSaving."""
    return EagerAutogradSaving.apply(*args)


def recurrent_fwd_autograd(*args):
    """recurrent_fwd's arguments and results, through EagerAutograd."""
    return EagerAutograd.apply(recurrent_fwd_impl, _save, *args)


class NoBackward(torch.autograd.Function):
    """Identity whose backward raises _NO_INPLACE_BACKWARD (on the in-place op's output: mutating
    custom ops cannot register autograd, and their default message does not say why)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError(_NO_INPLACE_BACKWARD)
