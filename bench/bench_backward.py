"""The backward of kla's chunkwise prefill beside flash-linear-attention's, in one run (issue 25).

    PYTHONPATH=python KLA_CUDA_LIBRARY=build-gpu/dist/libkla_cuda.so.5 \
        python3 bench/bench_backward.py --out out/backward     [--no-fla] [--quick] [--no-graph]

Speed: the three rows of FlashQLA's backward table (bf16, K = V = 128, H = 16 query/key heads,
HV = 32 value heads): one packed sequence of 32768 tokens, 8 packed sequences of random lengths
summing to 32768, one of 8192. Their script's inputs: sequences packed with cu_seqlens, an
initial state in and the final state out, l2-normalised q and k in the kernel
(use_qk_l2norm_in_kernel), g = logsigmoid(randn) / 16, beta = sigmoid(randn), upstream gradients
of o and of the final state. Each library runs its chunk_gated_delta_rule (beta given: exactly the
peers' computation) through torch.autograd; "bwd" is the backward alone (torch.autograd.backward
on a retained graph, replayed), "fwd+bwd" both. Medians of CUDA-event timings after warm-up.
Each is timed twice: as plain calls (what a PyTorch user's eager step pays, host work included:
the GPU is idle when a call starts) and as replays of a CUDA graph holding the same calls
(kernel to kernel, the host out of it: how FlashQLA's published figures were taken, SPEC §4), for
every library; --no-graph skips the replays.
"kla FAST" is the same call with arithmetic='fast' (the backward's products on one TF32 part
an operand, and at this case's shapes, bf16 with K = V = 128, its prep and both state scans on
bf16 tensor cores with split operands and its input gradients on bf16 operands: kla.h). kla's
forward saves nothing but its inputs; its backward recomputes each chunk's state into the
workspace (kla_backward_workspace_size, reported). "kla FAST saved" is kla FAST with
save_states=True: the forward also writes each chunk's incoming state and U in bf16
(kla_chunk_forward_saving, kla_saved_states_size bytes, reported as saved GiB), and the backward
reads them instead of running its state scan (kla_chunk_backward_saved); each row records which
state-gradient schedule that backward ran on this GPU (kla.backward_plan: the chain and its
segment, or the scan and where its prep runs), which the tables name.

Accuracy (--accuracy, on by default): on a smaller problem, each gradient of kla's and FLA's
bf16 backward against float64 gradients of the same rounded inputs (kla.torch_impl, autograd in
float64), as relative RMS, in the report's stress families. FLA's backward refuses to run on
Hopper with Triton 3.4 to 3.7.0 (its issue 640: wrong dq/dk/dg there); this script bypasses the
guard (fla.ops.common.chunk_o.TRITON_ABOVE_3_7_1 = True) and says so in its output, because the
point is to show what that miscompile costs.

Writes OUT/backward.json and OUT/backward.md (the tables docs/performance.md and docs/accuracy.md
carry) and prints progress lines.
"""
import argparse
import ctypes
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import kla
import kla.torch_impl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from backward_targets import saved_schedule_text  # noqa: E402
from side_by_side import build_info_beside, device_copy_bps  # noqa: E402 (one definition each)

FLA_NOTE = ("FLA's Hopper guard for Triton 3.4-3.7.0 (issue 640) was bypassed: its backward ran "
            "with the Triton it refuses")


def log(msg):
    print(f"[bench_backward {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def save_json(path, result):
    """Writes result to path whole or not at all (a temporary file, then a rename): the script
    saves after every row, so a run stopped by a time limit leaves the rows it finished, marked
    "complete": false."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
    os.replace(tmp, path)


def load_fla(bypass_guard):
    try:
        import fla.ops.common.chunk_o as chunk_o
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception as e:  # noqa: BLE001 - any import failure means "not available"
        log(f"FLA not available: {type(e).__name__}: {e}")
        return None, None
    bypassed = False
    if bypass_guard and getattr(chunk_o, "TRITON_ABOVE_3_4_0", False) and \
            not getattr(chunk_o, "TRITON_ABOVE_3_7_1", True):
        chunk_o.TRITON_ABOVE_3_7_1 = True
        bypassed = True
    import fla
    return chunk_gated_delta_rule, {"version": getattr(fla, "__version__", "?"),
                                    "guard_bypassed": bypassed}


def inputs(lengths, H, HV, D, dtype, seed, *, g_scale=1 / 16, key_family="random"):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    T = sum(lengths)
    dev = "cuda"

    def randn(*shape):
        return torch.randn(*shape, device=dev, generator=gen)

    q = randn(1, T, H, D)
    k = randn(1, T, H, D)
    if key_family == "colinear":  # every key close to one direction
        k = randn(1, 1, H, D) + 1e-2 * k
    elif key_family == "tiny":
        k = 1e-4 * k
    elif key_family == "huge":
        k = 1e3 * k
    v = randn(1, T, HV, D)
    g = F.logsigmoid(randn(1, T, HV)) * g_scale
    beta = torch.sigmoid(randn(1, T, HV))
    h0 = randn(len(lengths), HV, D, D) * 0.1
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), device=dev,
                      dtype=torch.int32)
    do = randn(1, T, HV, D)
    dht = randn(len(lengths), HV, D, D)
    leaves = [q.to(dtype), k.to(dtype), v.to(dtype), g, beta, h0]
    return [x.detach().requires_grad_() for x in leaves], cu, do.to(dtype), dht


def random_lengths(total, n, seed):
    gen = torch.Generator().manual_seed(seed)
    cuts = sorted(torch.randperm(total - 1, generator=gen)[:n - 1].add(1).tolist())
    edges = [0] + cuts + [total]
    return [edges[i + 1] - edges[i] for i in range(n)]


def timed(fn, reps, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def graph_times(fn, leaves, cu, do, dht, reps):
    """{'graph_bwd_ms', 'graph_fwd_bwd_ms'}: median ms of one replay of a CUDA graph holding the
    backward alone (of a forward run outside the graph) and one holding forward + backward. As
    torch.cuda.graphs asks for a captured backward: the forward whose backward is captured and
    three warm-up steps of each (autotuning, lazy set-up, the autograd nodes' streams) run on a
    side stream, never the default one; the leaves' gradients are set to None before each step, so
    the captured backward writes them (a replay rewrites them) instead of accumulating."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        o, s = fn(*leaves, cu)

        def fresh_bwd():
            for x in leaves:
                x.grad = None
            torch.autograd.backward((o, s), (do, dht), retain_graph=True)

        def fresh_both():
            for x in leaves:
                x.grad = None
            o2, s2 = fn(*leaves, cu)
            torch.autograd.backward((o2, s2), (do, dht))

        for _ in range(3):
            fresh_bwd()
            fresh_both()
    torch.cuda.current_stream().wait_stream(side)
    out = {}
    for key, step in (("graph_bwd_ms", fresh_bwd), ("graph_fwd_bwd_ms", fresh_both)):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        out[key] = timed(graph.replay, reps)
        del graph
    torch.cuda.synchronize()
    return out


def run_speed(fn, leaves, cu, do, dht, reps, graphs=True):
    """{'fwd_bwd_ms', 'bwd_ms', 'peak_GiB'} of fn(q, k, v, g, beta, h0, cu) in plain calls, and
    with graphs graph_times' replays (or 'graph_error', why a capture failed)."""
    def fwd():
        return fn(*leaves, cu)

    def both():
        o, s = fwd()
        torch.autograd.backward((o, s), (do, dht))

    out = {"fwd_bwd_ms": timed(both, reps)}
    o, s = fwd()

    def bwd():
        torch.autograd.backward((o, s), (do, dht), retain_graph=True)

    out["bwd_ms"] = timed(bwd, reps)
    del o, s
    if graphs:
        try:
            out.update(graph_times(fn, leaves, cu, do, dht, reps))
        except Exception as e:  # noqa: BLE001 (a library whose calls cannot be captured)
            out["graph_error"] = f"{type(e).__name__}: {e}"[:300]
    for x in leaves:
        x.grad = None
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    both()
    torch.cuda.synchronize()
    out["peak_GiB"] = (torch.cuda.max_memory_allocated() - base) / 2**30
    for x in leaves:
        x.grad = None
    return out


def speed_log(name, lib, r):
    """The progress line of one library's timings (run_speed's dict)."""
    graph = (f"; graph-replayed bwd {r['graph_bwd_ms']:.3f} ms, fwd+bwd "
             f"{r['graph_fwd_bwd_ms']:.3f} ms" if "graph_bwd_ms" in r else
             f"; graph capture failed: {r['graph_error']}" if "graph_error" in r else "")
    log(f"{name}: {lib} bwd {r['bwd_ms']:.3f} ms, fwd+bwd {r['fwd_bwd_ms']:.3f} ms, "
        f"peak {r['peak_GiB']:.2f} GiB{graph}")


def per_tensor(make):
    """make(t) for tensor t, made again only when called with another tensor than the last: the
    derived copies of cu_seqlens each library is given. A CUDA-graph capture needs the same one
    every call: kla validates cu_seqlens' host copy (cu_seqlens_cpu), and FLA keys its host-side
    chunk indices on the cu_seqlens tensor itself (a new one would make either copy it to the
    host, a synchronisation a capture forbids)."""
    last = {}

    def get(t):
        if last.get("src") is not t:
            last.update(src=t, made=make(t))
        return last["made"]
    return get


_host_cu = per_tensor(lambda cu: cu.cpu())


def kla_fn(q, k, v, g, beta, h0, cu, arithmetic="accurate"):
    return kla.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                      cu_seqlens=cu, cu_seqlens_cpu=_host_cu(cu),
                                      use_qk_l2norm_in_kernel=True, arithmetic=arithmetic)


def kla_fast_fn(q, k, v, g, beta, h0, cu):
    """kla with arithmetic 'fast' (forward and backward: kla.h)."""
    return kla_fn(q, k, v, g, beta, h0, cu, arithmetic="fast")


def kla_fast_saved_fn(q, k, v, g, beta, h0, cu, **schedule):
    """kla FAST with save_states=True (kla.h "Saved states"); `schedule`: the saved backward's
    state_grad / chain_segment, if pinned (bench/ab_backward.py)."""
    return kla.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                      cu_seqlens=cu, cu_seqlens_cpu=_host_cu(cu),
                                      use_qk_l2norm_in_kernel=True, arithmetic="fast",
                                      save_states=True, **schedule)


def saved_schedule(leaves, cu, **schedule):
    """What kla FAST saved's backward runs on this GPU for these inputs (kla.backward_plan: the
    state-gradient schedule, the chain's segment, whether the scan's prep runs beside it, and the
    library's reason), so that a figure names the kernels it timed; `schedule`: state_grad /
    chain_segment, as kla_fast_saved_fn takes them. A library without the plan's entry point (one
    built before it) or one that refuses gives {"error": why} instead: the timing still runs."""
    q, k, v, g, beta, h0 = leaves
    try:
        p = kla.backward_plan(q, k, v, g, beta, cu_seqlens=cu, initial_state=h0,
                              coefficient="given", **schedule)
    except Exception as e:  # noqa: BLE001 (recorded, not fatal: the plan only labels the row)
        return {"error": f"{type(e).__name__}: {e}"[:300]}
    return {"state_grad": p.state_grad, "chain_segment": p.chain_segment,
            "prep_beside": p.prep_beside, "reason": p.reason}


def ref_fn(q, k, v, g, beta, h0, cu):
    return kla.torch_impl.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                                 output_final_state=True, cu_seqlens=cu,
                                                 use_qk_l2norm_in_kernel=True)


def make_fla_fn(fla_gdr):
    long_cu = per_tensor(lambda cu: cu.long())  # FLA takes int64 cu_seqlens

    def fn(q, k, v, g, beta, h0, cu):
        return fla_gdr(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                       cu_seqlens=long_cu(cu), use_qk_l2norm_in_kernel=True)
    return fn


def grads_of(fn, leaves, cu, do, dht):
    leaves = [x.detach().clone().requires_grad_() for x in leaves]
    o, s = fn(*leaves, cu)
    torch.autograd.backward((o, s), (do, dht))
    return [x.grad.detach().double() for x in leaves]


def rel_rms(got, ref):
    den = ref.norm().item()
    if not math.isfinite(got.norm().item()):
        return float("nan")
    return (got - ref).norm().item() / den if den > 0 else (got - ref).norm().item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out/backward")
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--no-accuracy", action="store_true")
    ap.add_argument("--no-speed", action="store_true", help="only the accuracy tables")
    ap.add_argument("--quick", action="store_true", help="only the 8192-token row, fewer reps")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--no-graph", action="store_true", help="plain calls only, no graph replays")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    dev_name = torch.cuda.get_device_name()
    fla_gdr, fla_info = (None, None) if a.no_fla else load_fla(bypass_guard=True)
    result = {"device": dev_name, "torch": torch.__version__, "fla": fla_info, "speed": [],
              "accuracy": [], "complete": False,
              "build": build_info_beside(kla.library_info()["path"])}
    json_path = os.path.join(a.out, "backward.json")
    if not a.no_speed:
        result["copy_TBps"] = device_copy_bps(torch, "cuda", lambda fn: timed(fn, 15)) / 1e12
        torch.cuda.empty_cache()  # its two 1 GiB buffers
        log(f"copy rate (read + written): {result['copy_TBps']:.3f} TB/s")
    log(f"{dev_name}, torch {torch.__version__}, FLA {fla_info}")
    H, HV, D = 16, 32, 128
    rows = [("1x32768", [32768]), ("8 seqs, 32768 total", random_lengths(32768, 8, 1)),
            ("1x8192", [8192])]
    if a.quick:
        rows = rows[2:]
    if a.no_speed:
        rows = []
    for name, lengths in rows:
        leaves, cu, do, dht = inputs(lengths, H, HV, D, torch.bfloat16, seed=0)
        row = {"case": name, "lengths": lengths, "H": H, "HV": HV, "K": D, "V": D, "dtype": "bf16"}
        bp = kla._lib.load().backward_params()
        kla._params.fill(bp.forward, leaves[0], leaves[1], leaves[2], leaves[2], g=leaves[3],
                         eta=leaves[4], coefficient=kla._params.COEFF_GIVEN,
                         cu_seqlens=cu, cu_seqlens_host=_host_cu(cu))
        row["kla_workspace_GiB"] = kla._lib.load().backward_workspace_size(
            ctypes.byref(bp)) / 2**30
        bp.forward.arithmetic = kla._params.ARITHMETIC_FAST
        row["kla_saved_GiB"] = kla._lib.load().saved_states_size(ctypes.byref(bp.forward)) / 2**30
        row["kla_fast_saved_plan"] = saved_schedule(leaves, cu)
        log(f"{name}: kla FAST saved's schedule: "
            f"{saved_schedule_text(row['kla_fast_saved_plan'])}")
        graphs = not a.no_graph
        r = run_speed(kla_fn, leaves, cu, do, dht, a.reps, graphs)
        row.update({f"kla_{k}": x for k, x in r.items()})
        speed_log(name, "kla", r)
        r = run_speed(kla_fast_fn, leaves, cu, do, dht, a.reps, graphs)
        row.update({f"kla_fast_{k}": x for k, x in r.items() if k != "peak_GiB"})
        speed_log(name, "kla FAST", r)
        r = run_speed(kla_fast_saved_fn, leaves, cu, do, dht, a.reps, graphs)
        row.update({f"kla_fast_saved_{k}": x for k, x in r.items()})
        speed_log(name, "kla FAST saved", r)
        if fla_gdr is not None:
            try:
                r = run_speed(make_fla_fn(fla_gdr), leaves, cu, do, dht, a.reps, graphs)
                row.update({f"fla_{k}": x for k, x in r.items()})
                speed_log(name, "FLA", r)
            except Exception as e:  # noqa: BLE001
                row["fla_error"] = f"{type(e).__name__}: {e}"[:300]
                log(f"{name}: FLA failed: {row['fla_error']}")
        result["speed"].append(row)
        save_json(json_path, result)
        del leaves, do, dht
        torch.cuda.empty_cache()

    if not a.no_accuracy:
        families = [("random", {}), ("colinear keys", {"key_family": "colinear"}),
                    ("tiny keys", {"key_family": "tiny"}), ("huge keys", {"key_family": "huge"}),
                    ("strong decay (g/1)", {"g_scale": 1.0})]
        names = ["dq", "dk", "dv", "dg", "dbeta", "dh0"]
        for fam, kw in families:
            leaves, cu, do, dht = inputs([700, 324], 4, 8, D, torch.bfloat16, seed=1, **kw)
            ref_leaves = [x.detach().double().requires_grad_() for x in leaves]
            ref = grads_of(ref_fn, ref_leaves, cu, do.double(), dht.double())
            row = {"family": fam}
            ours = grads_of(kla_fn, leaves, cu, do, dht)
            row["kla"] = {n: rel_rms(x, r) for n, x, r in zip(names, ours, ref)}
            ours = grads_of(kla_fast_fn, leaves, cu, do, dht)
            row["kla FAST"] = {n: rel_rms(x, r) for n, x, r in zip(names, ours, ref)}
            ours = grads_of(kla_fast_saved_fn, leaves, cu, do, dht)
            row["kla FAST saved"] = {n: rel_rms(x, r) for n, x, r in zip(names, ours, ref)}
            if fla_gdr is not None:
                try:
                    theirs = grads_of(make_fla_fn(fla_gdr), leaves, cu, do, dht)
                    row["fla"] = {n: rel_rms(x, r) for n, x, r in zip(names, theirs, ref)}
                except Exception as e:  # noqa: BLE001
                    row["fla_error"] = f"{type(e).__name__}: {e}"[:300]
            log(f"accuracy {fam}: kla {row['kla']} fla {row.get('fla', row.get('fla_error'))}")
            result["accuracy"].append(row)
            save_json(json_path, result)

    result["complete"] = True
    save_json(json_path, result)
    lines = [f"Device: {dev_name}; torch {torch.__version__}; FLA {fla_info}.", ""]
    if fla_info and fla_info.get("guard_bypassed"):
        lines += [FLA_NOTE + ".", ""]
    lines += ["| case | kla bwd ms | kla FAST bwd ms | FLA bwd ms | kla fwd+bwd ms | "
              "kla FAST fwd+bwd ms | FLA fwd+bwd ms | graph: kla bwd | graph: kla FAST bwd | "
              "graph: FLA bwd | graph: kla FAST fwd+bwd | graph: FLA fwd+bwd | "
              "kla workspace GiB | kla peak GiB | FLA peak GiB |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def f3(x):
        return f"{x:.3f}" if isinstance(x, float) else "-"
    for r in result["speed"]:
        lines.append(f"| {r['case']} | {f3(r['kla_bwd_ms'])} | {f3(r['kla_fast_bwd_ms'])} | "
                     f"{f3(r.get('fla_bwd_ms'))} | {f3(r['kla_fwd_bwd_ms'])} | "
                     f"{f3(r['kla_fast_fwd_bwd_ms'])} | {f3(r.get('fla_fwd_bwd_ms'))} | "
                     f"{f3(r.get('kla_graph_bwd_ms'))} | {f3(r.get('kla_fast_graph_bwd_ms'))} | "
                     f"{f3(r.get('fla_graph_bwd_ms'))} | "
                     f"{f3(r.get('kla_fast_graph_fwd_bwd_ms'))} | "
                     f"{f3(r.get('fla_graph_fwd_bwd_ms'))} | "
                     f"{f3(r['kla_workspace_GiB'])} | {f3(r['kla_peak_GiB'])} | "
                     f"{f3(r.get('fla_peak_GiB'))} |")
    lines += ["", "kla FAST with saved states (save_states=True) beside kla FAST:", "",
              "| case | kla FAST bwd ms | kla FAST saved bwd ms | graph: kla FAST bwd | "
              "graph: kla FAST saved bwd | graph: kla FAST fwd+bwd | graph: kla FAST saved "
              "fwd+bwd | saved GiB | kla FAST saved peak GiB | saved backward's schedule |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["speed"]:
        lines.append(f"| {r['case']} | {f3(r['kla_fast_bwd_ms'])} | "
                     f"{f3(r.get('kla_fast_saved_bwd_ms'))} | "
                     f"{f3(r.get('kla_fast_graph_bwd_ms'))} | "
                     f"{f3(r.get('kla_fast_saved_graph_bwd_ms'))} | "
                     f"{f3(r.get('kla_fast_graph_fwd_bwd_ms'))} | "
                     f"{f3(r.get('kla_fast_saved_graph_fwd_bwd_ms'))} | "
                     f"{f3(r.get('kla_saved_GiB'))} | {f3(r.get('kla_fast_saved_peak_GiB'))} | "
                     f"{saved_schedule_text(r.get('kla_fast_saved_plan'))} |")
    if result["accuracy"]:
        lines += ["", "Relative RMS against float64 gradients (bf16 inputs, 2 packed sequences "
                  "of 700 + 324 tokens, H 4 / HV 8, K = V = 128, qk l2-norm in the kernel):", "",
                  "| family | library | dq | dk | dv | dg | dbeta | dh0 |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in result["accuracy"]:
            for lib in ("kla", "kla FAST", "kla FAST saved", "fla"):
                if lib in r:
                    cells = " | ".join(f"{r[lib][n]:.2e}" for n in names)
                    lines.append(f"| {r['family']} | {lib} | {cells} |")
            if "fla_error" in r:
                lines.append(f"| {r['family']} | fla | failed: {r['fla_error'][:80]} |||||| ")
    with open(os.path.join(a.out, "backward.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
