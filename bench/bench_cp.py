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
case. NVLink multicast is left off (NCCL_NVLS_ENABLE=0, the device notes).
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch


def make_inputs(T, seed, device):
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
    h0 = 0.1 * torch.randn(1, HV, K, V, device=device, generator=gen)
    do = torch.randn(1, T, HV, V, device=device, generator=gen).bfloat16()
    dht = torch.randn(1, HV, K, V, device=device, generator=gen)
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


def run_case(rank, world, T, iters, group):
    import kla
    import kla.cp as cp
    dev = torch.device("cuda", torch.cuda.current_device())
    q, k, v, g, eta, h0, do, dht = make_inputs(T, 1234, dev)
    n = T // world
    sl = slice(rank * n, (rank + 1) * n)
    mine = [x[:, sl].contiguous() for x in (q, k, v, g, eta)]
    my_do = do[:, sl].contiguous()
    del q, k, v, g, eta, do  # only the shard stays (compare() rebuilds the whole on rank 0)
    torch.cuda.empty_cache()
    if world == 1:
        sync = torch.cuda.synchronize
        fwd = lambda: kla.chunk_kla(*mine, initial_state=h0, output_final_state=True)  # noqa

        def fwd_bwd(keep=None):
            leaves = [x.detach().requires_grad_() for x in mine] + [h0.detach().requires_grad_()]
            o, f = kla.chunk_kla(*leaves[:5], initial_state=leaves[5], output_final_state=True)
            torch.autograd.backward((o, f), (my_do, dht))
            if keep is not None:
                keep.extend([o.detach(), f.detach()] + [x.grad for x in leaves])
    else:
        import torch.distributed as dist

        def sync():
            torch.cuda.synchronize()
            dist.barrier(group=group)
        fwd = lambda: cp.chunk_kla_cp(*mine, initial_state=h0, output_final_state=True,  # noqa
                                      group=group)

        def fwd_bwd(keep=None):
            leaves = [x.detach().requires_grad_() for x in mine] + [h0.detach().requires_grad_()]
            o, f = cp.chunk_kla_cp(*leaves[:5], initial_state=leaves[5], output_final_state=True,
                                   group=group)
            # The final state is replicated on every rank: each copy carries 1/world of dht.
            torch.autograd.backward((o, f), (my_do, dht / world))
            if keep is not None:
                keep.extend([o.detach(), f.detach()] + [x.grad for x in leaves])
    res = {"tokens": T, "gpus": world}
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
    rows = []
    for T in args.tokens:
        r = run_case(rank, world, T, args.iters, group)
        keep = r.pop("_keep", None)
        if world > 1:
            import torch.distributed as dist
            # The slowest rank's times.
            for key in ("forward_ms", "forward_backward_ms"):
                if r.get(key) is not None:
                    t = torch.tensor([r[key]], device="cuda")
                    dist.all_reduce(t, op=dist.ReduceOp.MAX)
                    r[key] = t.item()
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
                    r["compare_with_one_gpu"] = compare(parts, T, args)
        if rank == 0:
            rows.append(r)
            print(f"bench_cp: {T} tokens, {world} GPU(s): forward {r.get('forward_ms')} ms, "
                  f"forward+backward {r.get('forward_backward_ms')} ms "
                  f"{r.get('compare_with_one_gpu', '')}", flush=True)
    if rank == 0:
        with open(out_file, "w") as f:
            json.dump(rows, f)
    if world > 1:
        import torch.distributed as dist
        dist.destroy_process_group()


def compare(parts, T, args):
    """Relative RMS of the context-parallel results against one GPU's on the same inputs."""
    import kla
    dev = torch.device("cuda", 0)
    q, k, v, g, eta, h0, do, dht = make_inputs(T, 1234, dev)
    leaves = [x.detach().requires_grad_() for x in (q, k, v, g, eta, h0)]
    o, f = kla.chunk_kla(*leaves[:5], initial_state=leaves[5], output_final_state=True)
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
    ap.add_argument("--compare-max", type=int, default=131072,
                    help="compare with one GPU up to this many tokens")
    args = ap.parse_args()
    import tempfile

    import torch.multiprocessing as mp
    n = torch.cuda.device_count()
    gpus = args.gpus or [w for w in (1, 2, 4, 8) if w <= n]
    os.makedirs(args.out, exist_ok=True)
    result = {"device": torch.cuda.get_device_name(0), "gpus_on_host": n,
              "torch": torch.__version__, "args": vars(args), "rows": []}
    for world in gpus:
        with tempfile.TemporaryDirectory() as tmp:
            out_file = os.path.join(tmp, "rows.json")
            t0 = time.time()
            mp.spawn(worker, args=(world, args, os.path.join(tmp, "init"), out_file),
                     nprocs=world, join=True)
            with open(out_file) as f:
                result["rows"].extend(json.load(f))
            print(f"bench_cp: {world} GPU(s) done in {time.time() - t0:.0f} s", flush=True)
        with open(os.path.join(args.out, "cp.json"), "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
