"""Context parallelism: one sequence split over ranks along time, each rank holding a contiguous
shard, forward and backward (issue 27).

    o, final = kla.cp.chunk_kla_cp(q, k, v, g, eta, group=group, output_final_state=True)

Every rank passes its shard of every sequence (q, k [B, T_r, H, K], v [B, T_r, HV, V], g and a
tensor eta [B, T_r, HV]; rank r holds tokens r*T_r .. (r+1)*T_r - 1 of each of the B sequences in
the group's rank order; shards may differ in length) and gets its own outputs o [B, T_r, HV, V]
and, with output_final_state, the whole sequences' final state [B, HV, K, V] (the same on every
rank). initial_state, if given, is the sequences' initial state and must be the same on every
rank; its gradient, like the final state's value, is the whole one on every rank (replicated
tensors, as data parallelism keeps parameters).

Packed sequences (cu_seqlens, FLA's cp_context convention): the ranks hold consecutive pieces of
one packed stream (q [1, T_r, H, K], in rank order; pieces may cut sequences anywhere) and every
rank passes the same global boundaries cu_seqlens [N + 1]; initial_state and the final state are
[N, HV, K, V]. A rank runs its piece with the boundaries shifted to its first token and clipped to
its piece, so a sequence it does not hold has length zero there: its map is the identity, and the
fold below hands each sequence's state across exactly the ranks it spans, with no other change.

The algebra (SPEC section 1; proofs_check `seg.combine` states it exactly in rationals, and
`seg.grad_combine` the backward's fold below, reference/include/kla/ref/segment_backward.hpp): a
segment maps its incoming state affinely, S_out = A S_in + L, A = prod_t alpha_t (I - beta_t k_t
k_t^T) the segment's [K, K] transition (the same for every value column) and L its final state from
a zero state. Forward: the first rank runs its segment from h0 at once (one call) and its
outgoing state is what the second rank needs; each middle rank computes its maps (A, L) (two
kernel calls: L from a zero state; A as the final state of the segment run on zero values from the
identity, [K, K]); the last rank's map would feed no later rank. One all-gather of [A | L] (the
first rank's is [0 | S_out], the last rank's zeros), the fold S_in(r+1) = A_r S_in(r) + L_r in
float64, then every rank but the first runs its segment from its true incoming state; the final
state is the last rank's outgoing state, broadcast. Backward, the mirror image: the last rank knows
its outgoing state's gradient (the final state's), so it runs its whole backward at once, and its
dS_in is the previous rank's G; each middle rank's backward with no outgoing-state gradient gives
dS_in of its own outputs; one all-gather, the reverse fold G_{r-1} = A_r^T G_r + dS_in_local(r),
then every rank but the last runs its backward with dO and G_r (each segment backward recomputes
its forward through autograd); the initial state's gradient is the first rank's dS_in, broadcast.
Calls per rank on its T_r tokens, forward: first 1, middle 3, last 1 (after the exchange);
backward: last 1, middle 2, first 1 (after the exchange). With two ranks the work is one pass in
sequence (no faster than one GPU, but a sequence too long for one GPU's memory runs); from three
on, the middle ranks' three calls on T / W tokens set the time.

The library itself stays communication-free (docs/python.md, 'Context parallelism'): the pieces
are `segment_maps`, `fold_states`, `segment_forward`, `segment_backward` and `fold_gradients`,
scheduled per rank by `forward_piece` / `forward_finish` and `backward_piece` / `fold_backward`,
which `simulate` composes in one process (the tests: every rank on one device, any impl), and
`chunk_kla_cp` / `chunk_gated_delta_rule_cp` through torch.distributed (all-gathers over the
group: NCCL on GPUs, gloo on CPUs), differentiable with torch.autograd. impl "kernels" runs
kla.chunk_kla (CUDA), "torch" kla.torch_impl (any device). state_v_first=True takes and returns
the states as [N, HV, V, K] (vLLM's layout; a transposed view in and a transposed copy out).

Errors: every rank checks its own inputs first without raising, then the ranks all-gather a
descriptor of their problem before any other collective; a rank with invalid inputs, or ranks that
disagree (shapes, dtype, gates, settings, cu_seqlens, initial state), make every rank raise a
ValueError, so none is left waiting in a collective.
"""
import math

import torch

from . import _params as P


class Segment:
    """One rank's shard and the call's settings: what a segment's forward and backward need."""

    def __init__(self, q, k, v, g, eta, eps, scale, readout, use_qk_l2norm_in_kernel,
                 coefficient, arithmetic="accurate", impl="kernels"):
        if impl not in ("kernels", "torch"):
            raise ValueError(f"kla.cp: impl must be 'kernels' or 'torch', got {impl!r}")
        for name, t in (("q", q), ("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor) or t.dim() != 4:
                raise ValueError(f"kla.cp: {name} must be a [B, T, heads, dim] tensor")
        if q.shape[:2] != v.shape[:2] or k.shape != q.shape:
            raise ValueError(f"kla.cp: q, k [B, T, H, K] and v [B, T, HV, V] must agree on B and "
                             f"T, got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
        if coefficient == P.COEFF_GIVEN and not isinstance(eta, torch.Tensor):
            raise ValueError("kla.cp: chunk_gated_delta_rule_cp needs beta ([B, T, HV])")
        self.q, self.k, self.v, self.g, self.eta = q, k, v, g, eta
        self.eps, self.scale, self.readout = eps, scale, readout
        self.qk_norm, self.coefficient = use_qk_l2norm_in_kernel, coefficient
        self.arithmetic, self.impl = arithmetic, impl
        self.cu = self.cu_device = None

    def set_seqlens(self, cu):
        """This segment's sequence boundaries (B = 1): N + 1 int64 offsets into its tokens, some
        sequences of length zero (held by other segments). None: B sequences of T_r tokens."""
        if cu is not None and (self.q.shape[0] != 1 or int(cu[-1]) != self.q.shape[1]):
            raise ValueError(f"kla.cp: a segment's cu_seqlens must cover its {self.q.shape[1]} "
                             f"tokens with B = 1, got {cu.tolist()} for q {tuple(self.q.shape)}")
        self.cu = None if cu is None else cu.to("cpu", torch.int64)
        self.cu_device = None if cu is None else self.cu.to(self.q.device)
        return self

    @property
    def state_dtype(self):
        """The states' dtype: fp32 (the kernels'), float64 for float64 inputs (impl 'torch')."""
        return torch.float64 if self.q.dtype == torch.float64 else torch.float32

    @property
    def shape(self):
        """(N, HV, K, V) of the states: N = B, or the number of sequences with cu_seqlens."""
        B, _, _, K = self.q.shape
        N = B if self.cu is None else self.cu.numel() - 1
        return N, self.v.shape[2], K, self.v.shape[3]

    def run(self, q, k, v, g, eta, h0):
        """(o, final_state) of this segment's tokens from state h0 (None: zero)."""
        if self.impl == "kernels":
            from . import api as fn
            extra = dict(arithmetic=self.arithmetic)
            if self.cu is not None:
                extra.update(cu_seqlens=self.cu_device, cu_seqlens_cpu=self.cu)
        else:
            from . import torch_impl as fn
            extra = {} if self.cu is None else dict(cu_seqlens=self.cu_device)
        if self.coefficient == P.COEFF_GIVEN:
            return fn.chunk_gated_delta_rule(q, k, v, g, eta, scale=self.scale, initial_state=h0,
                                             output_final_state=True,
                                             use_qk_l2norm_in_kernel=self.qk_norm, **extra)
        return fn.chunk_kla(q, k, v, g, eta, eps=self.eps, scale=self.scale, initial_state=h0,
                            output_final_state=True, use_qk_l2norm_in_kernel=self.qk_norm,
                            readout=self.readout, **extra)


def segment_maps(seg):
    """(A [N, HV, K, K], L [N, HV, K, V]) in the states' dtype (N = B, or the sequences with
    cu_seqlens): the segment's transition and its final state from a zero state, S_out = A S_in
    + L. A is the final state of the segment run on zero values from the identity (the map's
    linear part, the same for every value column)."""
    N, HV, K, V = seg.shape
    with torch.no_grad():
        _, L = seg.run(seg.q, seg.k, seg.v, seg.g, seg.eta, None)
        zeros = seg.v.new_zeros(*seg.v.shape[:3], K)
        eye = torch.eye(K, dtype=seg.state_dtype, device=seg.q.device).expand(N, HV, K, K)
        _, A = seg.run(seg.q, seg.k, zeros, seg.g, seg.eta, eye.contiguous())
    return A.to(seg.state_dtype), L.to(seg.state_dtype)


def fold_states(maps, h0):
    """The incoming state of every segment and the final state, from every segment's (A, L) in
    order: S_in(0) = h0 (None: zero), S_in(r+1) = A_r S_in(r) + L_r, in float64. Returns (list of
    [B, HV, K, V], final), in the maps' dtype."""
    dt = maps[0][1].dtype
    s = torch.zeros_like(maps[0][1], dtype=torch.float64) if h0 is None else h0.to(torch.float64)
    ins = []
    for A, L in maps:
        ins.append(s.to(dt))
        s = torch.matmul(A.to(torch.float64), s) + L.to(torch.float64)
    return ins, s.to(dt)


def segment_forward(seg, s_in):
    """(o, S_out) of the segment from its true incoming state."""
    with torch.no_grad():
        return seg.run(seg.q, seg.k, seg.v, seg.g, seg.eta, s_in)


def _leaves(seg, s_in):
    ts = [seg.q, seg.k, seg.v, seg.g, seg.eta, s_in]
    return [t.detach().requires_grad_(True) if isinstance(t, torch.Tensor) else t for t in ts]


def segment_backward(seg, s_in, d_o, d_out):
    """Gradients (dq, dk, dv, dg, deta, dS_in) of the segment, from its incoming state s_in, given
    dO and the gradient d_out of its outgoing state (None: zero), by autograd through the
    segment's forward (recomputed). Entries are None where the input is None or not a tensor."""
    with torch.enable_grad():
        leaves = _leaves(seg, s_in)
        o, s_out = seg.run(*leaves)
        want = [t for t in leaves if isinstance(t, torch.Tensor)]
        outs, grads_out = [o], [d_o]
        if d_out is not None:
            outs.append(s_out)
            grads_out.append(d_out.to(s_out.dtype))
        got = iter(torch.autograd.grad(outs, want, grads_out, allow_unused=True))
        res = [next(got) if isinstance(t, torch.Tensor) else None for t in leaves]
    # An input the outputs do not depend on (an empty segment's state) has the gradient zero.
    return [torch.zeros_like(t) if r is None and isinstance(t, torch.Tensor) else
            (r if r is None else r.detach()) for r, t in zip(res, leaves)]


def fold_gradients(maps, d_locals, d_final):
    """The gradient of every segment's outgoing state, from every segment's (A, L) and dS_in of
    its own outputs (d_locals), and the final state's gradient (None: zero): G_last = d_final,
    G_{r-1} = A_r^T G_r + d_locals[r], in float64. Returns (list of G_r, the initial state's
    gradient A_0^T G_0 + d_locals[0]), in d_locals' dtype."""
    dt = d_locals[0].dtype
    g = (torch.zeros_like(d_locals[-1], dtype=torch.float64) if d_final is None
         else d_final.to(torch.float64))
    outs = [None] * len(maps)
    for r in range(len(maps) - 1, -1, -1):
        outs[r] = g.to(dt)
        g = torch.matmul(maps[r][0].to(torch.float64).transpose(-1, -2), g) + \
            d_locals[r].to(torch.float64)
    return outs, g.to(dt)


def forward_piece(seg, rank, world, h0):
    """Rank `rank` of `world` before the exchange: (piece [N, HV, K, K + V] = [A | L] for the
    fold, o or None, S_out or None). The first rank knows its incoming state (h0), so it runs its
    segment at once (one call) and hands on [0 | S_out]: the fold passes S_out to rank 1
    unchanged. A middle rank's piece is its segment's maps (two calls). The last rank's map would
    feed no later rank: it contributes zeros and runs its segment after the exchange."""
    N, HV, K, V = seg.shape
    if rank == 0:
        o, s_out = segment_forward(seg, h0)
        s_out = s_out.to(seg.state_dtype)
        return torch.cat([s_out.new_zeros(N, HV, K, K), s_out], dim=-1), o, s_out
    if rank < world - 1:
        A, L = segment_maps(seg)
        return torch.cat([A, L], dim=-1), None, None
    return seg.q.new_zeros(N, HV, K, K + V, dtype=seg.state_dtype), None, None


def split_pieces(pieces, K):
    """The (A, L) maps of every rank from the exchanged [A | L] pieces."""
    return [(x[..., :K], x[..., K:]) for x in pieces]


def forward_finish(seg, rank, s_in, o, s_out):
    """(o, S_out) of rank `rank` once its incoming state is known (the first rank has both)."""
    if rank == 0:
        return o, s_out
    o, s_out = segment_forward(seg, s_in)
    return o, s_out.to(seg.state_dtype)


def backward_piece(seg, rank, world, s_in, d_o, d_final):
    """Rank `rank` of `world` before the backward's exchange: (piece, gradients or None). The last
    rank knows its outgoing state's gradient (the final state's): it runs its whole backward at
    once and hands on dS_in, which is the gradient of the previous rank's outgoing state. A middle
    rank's piece is dS_in of its own outputs (its backward with no outgoing-state gradient); the
    first rank's (zeros) feeds no earlier rank."""
    if rank == world - 1:
        grads = segment_backward(seg, s_in, d_o, d_final)
        return grads[5].to(seg.state_dtype), grads
    if rank > 0:
        return segment_backward(seg, s_in, d_o, None)[5].to(seg.state_dtype), None
    N, HV, K, V = seg.shape
    return seg.q.new_zeros(N, HV, K, V, dtype=seg.state_dtype), None


def fold_backward(maps, pieces):
    """The outgoing-state gradient G_r of every rank but the last, from the backward pieces:
    G_{W-2} = pieces[W-1] (the last rank's dS_in), G_{r-1} = A_r^T G_r + pieces[r] (fold_gradients,
    float64). The first rank's map is never used: its backward from G_0 gives the initial state's
    gradient itself."""
    return fold_gradients(maps[:-1], pieces[:-1], pieces[-1])[0]


def simulate(segments, h0=None, d_os=None, d_final=None):
    """Every rank of a context-parallel call in one process, in rank order, through the same
    pieces and schedule as chunk_kla_cp (the tests). Returns (list of o, final state) and, with
    d_os (one dO a segment), also (list of per-segment gradients [dq, dk, dv, dg, deta], the
    initial state's gradient)."""
    W = len(segments)
    K = segments[0].shape[2]
    first = [forward_piece(s, r, W, h0) for r, s in enumerate(segments)]
    maps = split_pieces([x[0] for x in first], K)
    ins = fold_states(maps, h0)[0]
    done = [forward_finish(s, r, x, f[1], f[2])
            for r, (s, x, f) in enumerate(zip(segments, ins, first))]
    outs, final = [d[0] for d in done], done[-1][1]
    if d_os is None:
        return outs, final
    back = [backward_piece(s, r, W, x, d, d_final)
            for r, (s, x, d) in enumerate(zip(segments, ins, d_os))]
    g_outs = fold_backward(maps, [b[0] for b in back]) if W > 1 else []
    grads = [b[1] if r == W - 1 else segment_backward(s, x, d, g_outs[r])
             for r, (s, x, d, b) in enumerate(zip(segments, ins, d_os, back))]
    return outs, final, [gr[:5] for gr in grads], grads[0][5]


def _all_gather(t, group):
    import torch.distributed as dist
    world = dist.get_world_size(group)
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t.contiguous(), group=group)
    return parts


def _broadcast(t, src, group):
    """t from group rank `src` on every rank (in place)."""
    import torch.distributed as dist
    t = t.contiguous()
    dist.broadcast(t, src=src if group is None else dist.get_global_rank(group, src), group=group)
    return t


class _ContextParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, seg, group, want_final, h0, q, k, v, g, eta):
        import torch.distributed as dist
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        piece, o, s_out = forward_piece(seg, rank, world, h0)
        maps = split_pieces(_all_gather(piece, group), seg.shape[2])
        s_in = fold_states(maps, h0)[0][rank]
        o, s_out = forward_finish(seg, rank, s_in, o, s_out)
        # The final state, replicated: the last rank's outgoing state (broadcast only if asked
        # for; otherwise an empty tensor, and no collective).
        final = s_out.new_empty(0)
        if want_final:
            final = _broadcast(s_out if rank == world - 1 else torch.empty_like(s_out),
                               world - 1, group)
        ctx.seg, ctx.group, ctx.rank, ctx.world, ctx.maps = seg, group, rank, world, maps
        ctx.want_final, ctx.h0_given = want_final, h0 is not None
        ctx.save_for_backward(s_in)
        return o, final

    @staticmethod
    def backward(ctx, d_o, d_final):
        import torch.distributed as dist
        (s_in,) = ctx.saved_tensors
        seg, group, rank, world, maps = ctx.seg, ctx.group, ctx.rank, ctx.world, ctx.maps
        if d_o is None:
            d_o = seg.v.new_zeros(seg.v.shape)
        # The final state is replicated: its gradient is the sum of every copy's.
        df = torch.zeros_like(maps[0][1])
        if ctx.want_final:
            if d_final is not None:
                df = d_final.to(df.dtype).contiguous()
            dist.all_reduce(df, group=group)
        piece, grads = backward_piece(seg, rank, world, s_in, d_o, df)
        if world > 1:
            g_out = fold_backward(maps, _all_gather(piece, group))
            if rank < world - 1:
                grads = segment_backward(seg, s_in, d_o, g_out[rank])
        dq, dk, dv, dg, deta, d_s_in = grads
        d_h0 = None
        if ctx.h0_given:  # the first rank's dS_in, replicated
            d_h0 = _broadcast(d_s_in.to(maps[0][1].dtype) if rank == 0
                              else torch.empty_like(maps[0][1]), 0, group)
        return (None, None, None, d_h0, dq, dk, dv, dg, deta)


_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.float64: 3}


def _global_seqlens(q, cu_seqlens):
    """The global sequence boundaries as a CPU int64 tensor (None without cu_seqlens), checked."""
    if cu_seqlens is None:
        return None
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or \
            cu_seqlens.numel() < 2 or cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError("kla.cp: cu_seqlens must be a 1-d int32 / int64 tensor of N + 1 >= 2 "
                         "global sequence boundaries (the packed stream over every rank)")
    if q.shape[0] != 1:
        raise ValueError(f"kla.cp: the batch size must be 1 with cu_seqlens (the ranks hold "
                         f"consecutive pieces of one packed stream), got B = {q.shape[0]}")
    cu = cu_seqlens.detach().to("cpu", torch.int64)
    if int(cu[0]) != 0 or bool((cu[1:] < cu[:-1]).any()):
        raise ValueError(f"kla.cp: cu_seqlens must start at 0 and never decrease, got "
                         f"{cu.tolist()[:8]}{'...' if cu.numel() > 8 else ''}")
    return cu


def _local_seqlens(cu, lengths, rank):
    """This rank's boundaries: the global ones shifted to its first token and clipped to its
    shard, so a sequence it does not hold has length zero here (an identity map in the fold)."""
    off = sum(lengths[:rank])
    return (cu - off).clamp(0, lengths[rank])


_FIELDS = ["inputs valid", "B", "H", "HV", "K", "V", "dtype", "g given", "eta a tensor",
           "initial_state given", "coefficient", "impl", "eps", "scale", "eta value",
           "sequences (cu_seqlens)", "cu_seqlens sum", "cu_seqlens weighted sum", "state_v_first",
           "initial_state sum", "initial_state sum of squares"]


def _check_ranks_agree(seg, h0, cu, group, error, state_v_first=False):
    """Every rank must hold shards of the same problem (shapes, dtype, gates, settings, the
    same global cu_seqlens) and the same initial state: otherwise the all-gathers would mismatch
    (a crash or a hang) or the fold would mix problems. One small all-gather of a descriptor (one
    host synchronisation) before any other collective; a rank whose own inputs were invalid
    (`error`, a ValueError it raised) takes part too, so that every rank raises a clear
    ValueError and none waits. Returns every rank's shard length, in rank order."""
    import torch.distributed as dist
    desc = [0.0] * len(_FIELDS)
    if error is None:
        N, HV, K, V = seg.shape
        e = seg.eps if isinstance(seg.eps, float) else float(seg.eps)
        desc = [1, seg.q.shape[0], seg.q.shape[2], HV, K, V, _DTYPE_CODES.get(seg.q.dtype, -1),
                seg.g is not None, isinstance(seg.eta, torch.Tensor), h0 is not None,
                seg.coefficient, seg.impl == "kernels", e, float(seg.scale or 0.0),
                0.0 if isinstance(seg.eta, torch.Tensor) or seg.eta is None else float(seg.eta),
                -1 if cu is None else cu.numel() - 1, 0 if cu is None else int(cu.sum()),
                0 if cu is None else int((cu * torch.arange(1, cu.numel() + 1)).sum()),
                bool(state_v_first), 0, 0]
    device = seg.q.device if seg is not None else torch.device("cpu")
    if dist.get_backend(group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    with torch.no_grad():
        t_r = float(seg.q.shape[1]) if error is None else 0.0
        mine = torch.tensor([float(x) for x in desc] + [t_r], dtype=torch.float64,
                            device=device)
        if error is None and h0 is not None:  # on the device: the one host synchronisation is
            x = h0.to(device, torch.float64)   # the .tolist() below
            mine[-3:-1] = torch.stack([x.sum(), x.square().sum()])
        every = torch.stack(_all_gather(mine, group)).tolist()
    rank = dist.get_rank(group)
    if error is not None:
        raise error
    bad = [r for r, other in enumerate(every) if other[0] != 1.0]
    if bad:
        raise ValueError(f"kla.cp: rank {bad[0]}'s inputs are invalid (that rank raised the "
                         "error); every rank stops")
    mine = every[rank]
    for r, other in enumerate(every):
        diff = [n for n, a, b in zip(_FIELDS, mine, other)
                if a != b and not (math.isnan(a) and math.isnan(b))]  # NaN: the same NaN state
        if diff:
            raise ValueError(f"kla.cp: the ranks disagree on {', '.join(diff)} (this rank and "
                             f"rank {r}): every rank passes a shard of the same problem and the "
                             "same initial_state")
    lengths = [int(x[-1]) for x in every]
    if cu is not None and int(cu[-1]) != sum(lengths):
        raise ValueError(f"kla.cp: cu_seqlens ends at {int(cu[-1])}, but the ranks' shards "
                         f"hold {sum(lengths)} tokens ({lengths})")
    return lengths


def _cp(q, k, v, g, eta, eps, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
        group, readout, coefficient, arithmetic, impl, cu_seqlens, state_v_first=False):
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("kla.cp: torch.distributed is not initialised (init_process_group "
                           "first; kla.cp.simulate runs the ranks in one process)")
    # This rank's inputs, checked without raising yet: a rank that raised before the first
    # collective would leave the others waiting in it.
    seg, h0, cu, error = None, None, None, None
    try:
        seg = Segment(q, k, v, g, eta, eps, scale, readout, use_qk_l2norm_in_kernel, coefficient,
                      arithmetic, impl)
        cu = _global_seqlens(q, cu_seqlens)
        N = q.shape[0] if cu is None else cu.numel() - 1
        HV, K, V = v.shape[2], q.shape[3], v.shape[3]
        if initial_state is not None:
            want = (N, HV, V, K) if state_v_first else (N, HV, K, V)
            if tuple(initial_state.shape) != want:
                layout = "[N, HV, V, K]" if state_v_first else "[N, HV, K, V]"
                raise ValueError(f"kla.cp: initial_state must be {layout} = {want}, got "
                                 f"{tuple(initial_state.shape)}")
            h0 = initial_state.transpose(-1, -2) if state_v_first else initial_state
            h0 = h0.to(seg.state_dtype)
    except ValueError as e:
        error = e
    lengths = _check_ranks_agree(seg, h0, cu, group, error, state_v_first)
    if cu is not None:
        seg.set_seqlens(_local_seqlens(cu, lengths, dist.get_rank(group)))
    o, final = _ContextParallel.apply(seg, group, bool(output_final_state), h0, q, k, v, g, eta)
    if not output_final_state:
        return o, None
    return o, (final.transpose(-1, -2).contiguous() if state_v_first else final)


def chunk_kla_cp(q, k, v, g=None, eta=None, eps=1e-6, scale=None, initial_state=None,
                 output_final_state=False, use_qk_l2norm_in_kernel=False, *, group=None,
                 readout="scale", arithmetic="accurate", impl="kernels", cu_seqlens=None,
                 state_v_first=False):
    """kla.chunk_kla over a sequence sharded along time across `group` (module docstring).
    Returns (o of this rank's shard, the whole sequences' final state or None)."""
    return _cp(q, k, v, g, eta, eps, scale, initial_state, output_final_state,
               use_qk_l2norm_in_kernel, group, readout, P.COEFF_KACZMARZ, arithmetic, impl,
               cu_seqlens, state_v_first)


def chunk_gated_delta_rule_cp(q, k, v, g, beta, scale=None, initial_state=None,
                              output_final_state=False, use_qk_l2norm_in_kernel=False, *,
                              group=None, arithmetic="accurate", impl="kernels", cu_seqlens=None,
                              state_v_first=False):
    """kla.chunk_gated_delta_rule (beta given) over a sequence sharded along time across
    `group`. Returns (o of this rank's shard, the whole sequences' final state or None)."""
    if beta is None:
        raise ValueError("kla.cp: chunk_gated_delta_rule_cp needs beta ([B, T, HV])")
    return _cp(q, k, v, g, beta, 0.0, scale, initial_state, output_final_state,
               use_qk_l2norm_in_kernel, group, "scale", P.COEFF_GIVEN, arithmetic, impl,
               cu_seqlens, state_v_first)
