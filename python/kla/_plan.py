"""kla.plan: which kernel path and tiling a call would run, and why, without launching.

Tensors only lend their shapes, dtypes and strides: CPU or meta tensors plan as well as CUDA
ones (addresses are made up where a tensor is not on the GPU). With device=None the plan is for
the current CUDA device (kla_plan_chunk_forward / kla_plan_tokenwise_forward: needs a GPU); with
a DeviceInfo (kla.H100, kla.H200, kla.A100 or your own) it is for that device, on any machine
(kla_plan_chunk_forward_for; chunkwise only). kla.backward_plan: the same for the backward from
saved states (which state-gradient schedule it runs, kla_plan_chunk_backward_saved(_for)).
"""
import ctypes
import dataclasses
import itertools

import torch

from . import _lib
from . import _params as P
from .api import _enum, _seqlens


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """A device as the plan sees it (kla_device_info)."""
    compute_capability: tuple
    multiprocessors: int
    max_smem_per_block: int  # opt-in dynamic shared memory per block, bytes
    tensor_maps: bool = True  # the driver encodes TMA tensor maps (the WY paths need them)

    def _c(self):
        return P.KlaDeviceInfo(self.compute_capability[0], self.compute_capability[1],
                               self.multiprocessors, self.max_smem_per_block,
                               1 if self.tensor_maps else 0)


H100 = DeviceInfo((9, 0), 132, 232448)
H200 = DeviceInfo((9, 0), 132, 232448)
A100 = DeviceInfo((8, 0), 108, 166912)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a call runs (kla_plan)."""
    path: str
    chunk_len: int
    value_slice: int
    stages: int
    threads: int
    blocks: int
    prep_blocks: int
    smem_bytes: int
    prep_smem_bytes: int
    workspace_bytes: int
    arithmetic: str  # what the kernels run: "accurate", or "fast" where asked and the path has it
    reason: str
    segments: int = 1  # > 1: the sequence split (the fields above are its second pass's)

    @classmethod
    def _from_c(cls, p):
        return cls(p.path_name.decode(), p.chunk_len, p.value_slice, p.stages, p.threads,
                   p.blocks, p.prep_blocks, p.smem_bytes, p.prep_smem_bytes, p.workspace_bytes,
                   P.ARITHMETIC_NAMES[p.arithmetic], p.reason.decode(), p.segments)


class _Shape:
    """A tensor's shape, dtype and strides at a made-up address (1 TiB apart, so aligned and
    never overlapping)."""

    def __init__(self, t, slot):
        self.shape, self.dtype, self._stride = tuple(t.shape), t.dtype, t.stride()
        self._ptr = slot << 40

    def stride(self):
        return self._stride

    def data_ptr(self):
        return self._ptr


def _addresses():
    slots = itertools.count(1)

    def addr(t):
        if t is None or (t.device.type == "cuda" and type(t) is torch.Tensor):
            return t
        return _Shape(t, next(slots))
    return addr


def _coefficient_and_cu(q, coefficient, cu_seqlens):
    """The plans' coefficient code and cu_seqlens as an int32 CPU tensor (None: unpacked), checked
    as the functions check them."""
    coef = _enum({"kaczmarz": P.COEFF_KACZMARZ, "given": P.COEFF_GIVEN}, coefficient,
                 "coefficient")
    if cu_seqlens is None:
        return coef, None
    cu_seqlens, _ = _seqlens(q, cu_seqlens, None)
    return coef, cu_seqlens.detach().to("cpu", torch.int32).contiguous()


def plan(q, k, v, g=None, eta=None, *, kind="chunk", cu_seqlens=None, initial_state=None,
         output_final_state=True, coefficient="kaczmarz", arithmetic="accurate", path="auto",
         value_slice=0, segments=0, device=None):
    """The Plan of a chunk_* (kind='chunk') or fused_recurrent_* (kind='recurrent') call with
    these tensors and options. Raises kla.KlaError (KLA_ERROR_UNSUPPORTED_PATH with the reason)
    where the requested path, or with 'auto' every path, cannot run it."""
    lib = _lib.load()
    _addr = _addresses()
    if kind not in ("chunk", "recurrent"):
        raise ValueError(f"kla: kind must be 'chunk' or 'recurrent', got {kind!r}")
    coef, cu_host = _coefficient_and_cu(q, coefficient, cu_seqlens)
    n = q.shape[0] if cu_host is None else cu_host.shape[0] - 1
    o = torch.empty(v.shape, dtype=v.dtype, device="meta")
    final = torch.empty((n, v.shape[2], q.shape[3], v.shape[3]), device="meta")
    p = P.fill(lib.params(), _addr(q), _addr(k), _addr(v), _addr(o), g=_addr(g), eta=_addr(eta),
               coefficient=coef, initial_state=_addr(initial_state),
               final_state=_addr(final) if output_final_state else None,
               cu_seqlens=_addr(cu_host), cu_seqlens_host=cu_host,
               arithmetic=_enum(P.ARITHMETIC, arithmetic, "arithmetic"),
               path=_enum(P.PATHS, path, "path"), value_slice=int(value_slice),
               segments=int(segments))
    if kind == "recurrent":
        if device is not None:
            raise ValueError("kla: a described device plans the chunkwise call only "
                             "(kla_plan_chunk_forward_for); the decode plan needs the GPU")
        return Plan._from_c(lib.plan_tokenwise(p))
    if p.path != P.PATH_GENERIC:
        p.workspace_size = lib.workspace_size(p)
        p.workspace = 1 << 62  # an address: the plan only checks it is there and aligned
    info = None if device is None else device._c()
    return Plan._from_c(lib.plan_chunk(p, info))


def device_info(index=None):
    """The DeviceInfo of CUDA device `index` (default: the current one) as the library sees it."""
    lib = _lib.load()
    if index is None:
        index = torch.cuda.current_device()
    i = lib.device_info(index)
    return DeviceInfo((i.compute_major, i.compute_minor), i.multiprocessors,
                      i.max_smem_per_block, bool(i.tensor_maps))


@dataclasses.dataclass(frozen=True)
class BackwardPlan:
    """How the backward from saved states (save_states=True) forms the state gradient
    (kla_backward_plan; docs/api.md, 'State-gradient schedule')."""
    state_grad: str      # "scan" or "chain" (never "auto")
    chain_segment: int   # "chain": chunks a segment; "scan": 0
    prep_beside: bool    # "scan": its prep runs beside it (its blocks are one wave)
    reason: str

    @classmethod
    def _from_c(cls, p):
        return cls(P.STATE_GRAD_NAMES[p.state_grad], p.chain_segment, bool(p.prep_beside),
                   p.reason.decode())


def backward_plan(q, k, v, g=None, eta=None, *, cu_seqlens=None, initial_state=None,
                  coefficient="kaczmarz", path="auto", value_slice=0, segments=0,
                  state_grad="auto", chain_segment=0, device=None):
    """The BackwardPlan of the backward of a chunk_* call with save_states=True (so
    arithmetic='fast': bf16, K = V = 128) with these tensors and options, for a state_grad /
    chain_segment request as chunk_kla takes them (kla_plan_chunk_backward_saved; with a
    DeviceInfo, kla_plan_chunk_backward_saved_for: any machine). Raises kla.KlaError where the
    library refuses (a call that cannot save, 'chain' where it cannot run: the reason says why)
    and ValueError for a request chunk_kla would refuse."""
    from .api import _schedule
    lib = _lib.load()
    _addr = _addresses()
    sg, seg = _schedule(state_grad, chain_segment, True)
    coef, cu_host = _coefficient_and_cu(q, coefficient, cu_seqlens)
    meta = {"device": "meta"}
    do = torch.empty(v.shape, dtype=v.dtype, **meta)
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, **meta) for t in (q, k, v))
    dg = None if g is None else torch.empty(g.shape, **meta)
    deta = None if eta is None else torch.empty(eta.shape, **meta)
    bp = lib.backward_params()
    P.fill(bp.forward, _addr(q), _addr(k), _addr(v), _addr(do), g=_addr(g), eta=_addr(eta),
           coefficient=coef, initial_state=_addr(initial_state), cu_seqlens=_addr(cu_host),
           cu_seqlens_host=cu_host, arithmetic=P.ARITHMETIC_FAST,
           path=_enum(P.PATHS, path, "path"), value_slice=int(value_slice),
           segments=int(segments))
    P.fill_backward(bp, _addr(do), _addr(dq), _addr(dk), _addr(dv), dg=_addr(dg),
                    deta=_addr(deta))
    bp.workspace_size = lib.backward_workspace_size(ctypes.byref(bp))
    bp.workspace = 1 << 62  # an address: the plan only checks it is there and aligned
    return BackwardPlan._from_c(lib.plan_backward_saved(bp, sg, seg,
                                                        None if device is None else device._c()))
