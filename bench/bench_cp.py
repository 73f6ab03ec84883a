"""Context-parallel prefill and backward across the GPUs of one host (kla.cp over NCCL, issue 27):
correctness against one GPU on the same inputs, and the scaling of one long sequence.

    python3 bench/bench_cp.py --out OUT [--tokens 131072 524288 1048576] [--gpus 1 2]

For each sequence length (B = 1, H = HV = 16, K = V = 128, bf16, q and k l2-normalised,
g = logsigmoid(randn) / 16 with a quarter of the heads undecayed, eta = sigmoid(randn), an
initial state) and each GPU count: the
forward (kla.chunk_kla on one GPU, kla.cp.chunk_kla_cp over the group otherwise) and the forward
plus backward (dO and d(final state) given), timed with CUDA events around the whole call on every
rank after two warm-ups, the median of --iters calls, the slowest rank's time. Every rank builds
the whole sequence from the same seed and keeps its shard (contiguous, equal lengths). With more
than one GPU the outputs, final state and gradients are also compared with the one-GPU call's on
the same inputs (relative RMS; rank 0 computes the one-GPU result where it fits in memory).
Writes cp.json (every measurement, device, torch version) to --out and prints a progress line a
case; each GPU count's rows are also kept in rows_<n>gpu.json as they are measured, so a run cut
short by a time limit loses nothing measured (`--merge` rewrites cp.json from them). NVLink
multicast is left off (NCCL_NVLS_ENABLE=0, the device notes).

Packed cases (--packed-tokens T..., --packed N): N sequences of random lengths summing to T
(global cu_seqlens, the same on every rank; FLA's cp_context convention), each rank holding T /
world consecutive tokens of the packed stream, so that shards cut sequences anywhere; the same
timings and the same comparison with one GPU (kla.chunk_kla with the global cu_seqlens).

Beside FLA's context parallelism (--fla, with FLA installed): FLA's chunk_gated_delta_rule with
its cp_context (fla.ops.cp.build_cp_context over the same group and the global cu_seqlens [0, T];
one GPU: the plain call) and, like for like, kla's given-beta function (kla.cp.
chunk_gated_delta_rule_cp; one GPU: kla.chunk_gated_delta_rule) on the same shards, beta = eta,
q and k l2-normalised, without the initial and final state (FLA's context parallelism takes
neither), forward and forward plus backward (dO only). FLA's backward refuses to run on Hopper
with Triton 3.4 to 3.7.0 (its issue 640): its guard is bypassed here, as in bench_backward.py, and
cp.json says so.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch


def seqlens(T, packed, seed):
    """Global cu_seqlens (CPU int64) of `packed` sequences of random lengths summing to T, or None
    (one sequence)."""
    if not packed:
        return None
    gen = torch.Generator().manual_seed(seed)
    cuts = torch.randperm(T - 1, generator=gen)[:packed - 1].sort().values + 1
    return torch.cat([torch.tensor([0]), cuts, torch.tensor([T])]).to(torch.int64)


def make_inputs(T, seed, device, n=1):
    gen = torch.Generator(device=device).manual_seed(seed)
    H = HV = 16
    K = V = 128
    q = torch.nn.functional.normalize(torch.randn(1, T, H, K, device=device, generator=gen), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(1, T, H, K, device=device, generator=gen), dim=-1)
    v = torch.randn(1, T, HV, V, device=device, generator=gen)
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, HV, device=device, generator=gen)) / 16
    g[..., : HV // 4] = 0.0  # a quarter of the heads undecayed (the peers' inputs): their state
    # carries across the whole sequence, so the ranks' hand-off is what those heads measure
    eta = torch.sigmoid(torch.randn(1, T, HV, device=device, generator=gen))
    h0 = 0.1 * torch.randn(n, HV, K, V, device=device, generator=gen)
    do = torch.randn(1, T, HV, V, device=device, generator=gen).bfloat16()
    dht = torch.randn(n, HV, K, V, device=device, generator=gen)
    return q.bfloat16(), k.bfloat16(), v.bfloat16(), g, eta, h0, do, dht


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def timed(fn, iters, sync):
    for _ in range(2):
        fn()
    times = []
    for _ in range(iters):
        sync()
        t0 = torch.cuda.Event(enable_timing=True)
        t1 = torch.cuda.Event(enable_timing=True)
        t0.record()
        fn()
        t1.record()
        t1.synchronize()
        times.append(t0.elapsed_time(t1))
    return statistics.median(times)


def run_case(rank, world, T, iters, group, fla, packed=0):
    import kla
    import kla.cp as cp
    dev = torch.device("cuda", torch.cuda.current_device())
    cu = seqlens(T, packed, 4321)
    q, k, v, g, eta, h0, do, dht = make_inputs(T, 1234, dev, 1 if cu is None else packed)
    seq = {} if cu is None else {"cu_seqlens": cu.to(dev)}
    n = T // world
    sl = slice(rank * n, (rank + 1) * n)
    mine = [x[:, sl].contiguous() for x in (q, k, v, g, eta)]
    my_do = do[:, sl].contiguous()
    del q, k, v, g, eta, do  # only the shard stays (compare() rebuilds the whole on rank 0)
    torch.cuda.empty_cache()
    if world == 1:
        sync = torch.cuda.synchronize
        fwd = lambda: kla.chunk_kla(*mine, initial_state=h0, output_final_state=True, **seq)  # noqa

        def fwd_bwd(keep=None):
            leaves = [x.detach().requires_grad_() for x in mine] + [h0.detach().requires_grad_()]
            o, f = kla.chunk_kla(*leaves[:5], initial_state=leaves[5], output_final_state=True,
                                 **seq)
            torch.autograd.backward((o, f), (my_do, dht))
            if keep is not None:
                keep.extend([o.detach(), f.detach()] + [x.grad for x in leaves])
    else:
        import torch.distributed as dist

        def sync():
            torch.cuda.synchronize()
            dist.barrier(group=group)
        fwd = lambda: cp.chunk_kla_cp(*mine, initial_state=h0, output_final_state=True,  # noqa
                                      group=group, **seq)

        def fwd_bwd(keep=None):
            leaves = [x.detach().requires_grad_() for x in mine] + [h0.detach().requires_grad_()]
            o, f = cp.chunk_kla_cp(*leaves[:5], initial_state=leaves[5], output_final_state=True,
                                   group=group, **seq)
            # The final state is replicated on every rank: each copy carries 1/world of dht.
            torch.autograd.backward((o, f), (my_do, dht / world))
            if keep is not None:
                keep.extend([o.detach(), f.detach()] + [x.grad for x in leaves])
    res = {"tokens": T, "gpus": world, "sequences": 1 if cu is None else packed}
    if fla is not None and cu is None:
        res["given_beta"] = given_beta_rows(mine, my_do, world, group, iters, sync, fla)
    try:
        res["forward_ms"] = timed(fwd, iters, sync)
    except torch.cuda.OutOfMemoryError:
        res["forward_ms"] = None
        res["forward_note"] = "out of memory"
    torch.cuda.empty_cache()
    try:
        res["forward_backward_ms"] = timed(fwd_bwd, iters, sync)
        keep = []
        fwd_bwd(keep)
        res["_keep"] = keep
    except torch.cuda.OutOfMemoryError:
        res["forward_backward_ms"] = None
        res["forward_backward_note"] = "out of memory (the backward's workspace)"
    torch.cuda.empty_cache()
    return res


def worker(rank, world, args, init_file, out_file):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(rank)
    group = None
    if world > 1:
        import torch.distributed as dist
        dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank,
                                world_size=world, device_id=torch.device("cuda", rank))
    fla = load_fla() if args.fla else None
    rows = []
    cases = [(T, 0) for T in args.tokens] + [(T, args.packed) for T in args.packed_tokens]
    for T, packed in cases:
        r = run_case(rank, world, T, args.iters, group, fla, packed)
        keep = r.pop("_keep", None)
        if world > 1:
            import torch.distributed as dist
            # The slowest rank's times.
            for d in [r] + list(r.get("given_beta", {}).values()):
                for key in ("forward_ms", "forward_backward_ms"):
                    if isinstance(d, dict) and d.get(key) is not None:
                        t = torch.tensor([d[key]], device="cuda")
                        dist.all_reduce(t, op=dist.ReduceOp.MAX)
                        d[key] = t.item()
            if keep is not None and T <= args.compare_max:
                # Rank 0 compares with the one-GPU call on the same inputs: gather the shards.
                parts = {}
                for i, name in enumerate(("o", "final", "dq", "dk", "dv", "dg", "deta", "dh0")):
                    x = keep[i].contiguous()
                    if name in ("final", "dh0"):
                        parts[name] = x  # whole on every rank
                        continue
                    got = [torch.empty_like(x) for _ in range(world)]
                    dist.all_gather(got, x)
                    parts[name] = torch.cat(got, 1)
                if rank == 0:
                    r["compare_with_one_gpu"] = compare(parts, T, packed)
        if rank == 0:
            rows.append(r)
            with open(out_file, "w") as f:  # after every case: a run cut short keeps its rows
                json.dump(rows, f)
            print(f"bench_cp: {T} tokens in {r['sequences']} sequence(s), {world} GPU(s): "
                  f"forward {r.get('forward_ms')} ms, forward+backward "
                  f"{r.get('forward_backward_ms')} ms {r.get('compare_with_one_gpu', '')} "
                  f"{r.get('given_beta', '')}", flush=True)
    if world > 1:
        import torch.distributed as dist
        dist.destroy_process_group()


def load_fla():
    """FLA's chunk_gated_delta_rule and build_cp_context with the Hopper backward guard bypassed
    (module docstring), or None where FLA is not installed."""
    try:
        import fla
        import fla.ops.common.chunk_o as chunk_o
        from fla.ops.cp import build_cp_context
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception as e:  # noqa: BLE001 - any import failure means "not available"
        print(f"bench_cp: FLA not available ({type(e).__name__}: {e})", flush=True)
        return None
    bypassed = False
    if getattr(chunk_o, "TRITON_ABOVE_3_4_0", False) and \
            not getattr(chunk_o, "TRITON_ABOVE_3_7_1", True):
        chunk_o.TRITON_ABOVE_3_7_1 = True
        bypassed = True
    return {"gdr": chunk_gated_delta_rule, "ctx": build_cp_context,
            "version": getattr(fla, "__version__", "?"), "guard_bypassed": bypassed}


def given_beta_rows(mine, my_do, world, group, iters, sync, fla):
    """kla's given-beta function and FLA's on this rank's shard (module docstring): forward and
    forward + backward times, or the error a library raised."""
    import kla
    import kla.cp as cp
    q, k, v, g, beta = mine
    if world == 1:
        kla_fn = lambda *x: kla.chunk_gated_delta_rule(*x)[0]  # noqa: E731
        fla_fn = lambda *x: fla["gdr"](*x)[0]  # noqa: E731
    else:
        import torch.distributed as dist
        T = q.shape[1] * world
        ctx = fla["ctx"](cu_seqlens=torch.tensor([0, T], dtype=torch.long, device=q.device),
                         group=group if group is not None else dist.group.WORLD)
        kla_fn = lambda *x: cp.chunk_gated_delta_rule_cp(*x, group=group)[0]  # noqa: E731
        fla_fn = lambda *x: fla["gdr"](*x, cp_context=ctx)[0]  # noqa: E731
    out = {"fla_version": fla["version"], "fla_guard_bypassed": fla["guard_bypassed"]}
    for name, fn in (("kla", kla_fn), ("fla", fla_fn)):
        row = {}
        try:
            row["forward_ms"] = timed(lambda: fn(q, k, v, g, beta), iters, sync)

            def both():
                leaves = [x.detach().requires_grad_() for x in (q, k, v, g, beta)]
                torch.autograd.backward(fn(*leaves), my_do)
            row["forward_backward_ms"] = timed(both, iters, sync)
        except Exception as e:  # noqa: BLE001 - a peer's failure is a result, not a crash
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        torch.cuda.empty_cache()
        out[name] = row
    return out


def compare(parts, T, packed):
    """Relative RMS of the context-parallel results against one GPU's on the same inputs."""
    import kla
    dev = torch.device("cuda", 0)
    cu = seqlens(T, packed, 4321)
    q, k, v, g, eta, h0, do, dht = make_inputs(T, 1234, dev, 1 if cu is None else packed)
    seq = {} if cu is None else {"cu_seqlens": cu.to(dev)}
    leaves = [x.detach().requires_grad_() for x in (q, k, v, g, eta, h0)]
    o, f = kla.chunk_kla(*leaves[:5], initial_state=leaves[5], output_final_state=True, **seq)
    torch.autograd.backward((o, f), (do, dht))
    ref = {"o": o.detach(), "final": f.detach()}
    for name, x in zip(("dq", "dk", "dv", "dg", "deta", "dh0"), leaves):
        ref[name] = x.grad
    out = {name: rel(parts[name], ref[name]) for name in ref}
    del ref, leaves, o, f
    torch.cuda.empty_cache()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "out/cp"))
    ap.add_argument("--tokens", type=int, nargs="+", default=[131072, 524288, 1048576])
    ap.add_argument("--gpus", type=int, nargs="+", default=None)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--fla", action="store_true", help="time FLA's context parallelism beside")
    ap.add_argument("--packed", type=int, default=8,
                    help="sequences in the packed cases (random lengths, global cu_seqlens)")
    ap.add_argument("--packed-tokens", type=int, nargs="*", default=[],
                    help="total tokens of each packed case (none by default)")
    ap.add_argument("--compare-max", type=int, default=131072,
                    help="compare with one GPU up to this many tokens")
    ap.add_argument("--merge", action="store_true",
                    help="only rewrite OUT/cp.json from the rows files of a run cut short")
    args = ap.parse_args()
    import tempfile

    import torch.multiprocessing as mp
    os.makedirs(args.out, exist_ok=True)
    if args.merge:
        write_result(args.out)
        return 0
    n = torch.cuda.device_count()
    gpus = args.gpus or [w for w in (1, 2, 4, 8) if w <= n]
    with open(os.path.join(args.out, "header.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "gpus_on_host": n,
                   "torch": torch.__version__, "args": vars(args), "gpus": gpus}, f)
    for world in gpus:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.time()
            mp.spawn(worker, args=(world, args, os.path.join(tmp, "init"),
                                   os.path.join(args.out, f"rows_{world}gpu.json")),
                     nprocs=world, join=True)
            print(f"bench_cp: {world} GPU(s) done in {time.time() - t0:.0f} s", flush=True)
        write_result(args.out)
    return 0


def write_result(out):
    """OUT/cp.json: the run's header and every GPU count's rows written so far (rank 0 rewrites
    its rows file after each case, so a run stopped by a time limit keeps what it measured)."""
    with open(os.path.join(out, "header.json")) as f:
        result = json.load(f)
    result["rows"] = []
    for world in result.pop("gpus"):
        path = os.path.join(out, f"rows_{world}gpu.json")
        if os.path.exists(path):
            with open(path) as f:
                result["rows"].extend(json.load(f))
    with open(os.path.join(out, "cp.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
