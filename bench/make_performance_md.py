#!/usr/bin/env python3
"""Writes docs/performance.md (and docs/performance/*.png) from the output folder of
bench/run_side_by_side.sh (side_by_side.json, kla_bench_cuda.json, the PNGs). Standard library
only: runs anywhere.

    python3 bench/make_performance_md.py OUTDIR [--docs DOCS_DIR] [--status STATUS.md]
        [--device-time TEXT] [--reference REF.json] [--overhead OVERHEAD.json]

REF.json: `kla_bench_reference --benchmark_out=REF.json --benchmark_out_format=json` (CPU).
OVERHEAD.json: `python3 -m kla._bench_overhead --json OVERHEAD.json` on the GPU machine (the Python
package's host cost per call; copied to docs/performance/python_overhead.json).
"""
import argparse
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from backward_targets import ISSUE25, backward_floor_bytes, saved_schedule_text  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMAND = "bash bench/run_side_by_side.sh"
PEER = {  # SPEC §4: FLA chunk_gated_delta_rule on one H200, bf16 (kernel, with beta in PyTorch)
    (1, 32768, 16, 128, 128): (1.274, 1.731, 0.127),
    (4, 8192, 16, 128, 128): (0.942, 1.401, 0.128),
    (1, 131072, 8, 128, 128): (3.688, 4.550, 0.253),
    (8, 4096, 16, 128, 128): (0.943, 1.397, 0.129),
}


def f(x, spec, dash="–"):
    """x formatted by spec; dash where None; a text (a reason, say) as it is."""
    return dash if x is None else x if isinstance(x, str) else format(x, spec)


def copy_in(src, dst):
    """Copies a run's file into docs/performance, unless it is already that file (a section
    regenerated from the committed copy, as for runs of earlier sessions)."""
    if not (os.path.exists(dst) and os.path.samefile(src, dst)):
        shutil.copyfile(src, dst)


def load_json(path):
    """Loads JSON; repairs a Google Benchmark file cut short by a timeout (closes the list)."""
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        text = fh.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        cut = text.rfind("    }")
        if cut < 0:
            return None
        try:
            return json.loads(text[:cut + 5] + "\n  ]\n}")
        except json.JSONDecodeError:
            return None


def gbench_rows(gb):
    """Median rows of kla_bench_cuda's JSON: name -> counters."""
    rows = {}
    for b in gb.get("benchmarks", []):
        name = b.get("run_name", b["name"]).replace("/manual_time", "")
        name = name.replace("/iterations:30", "")
        if b.get("aggregate_name") == "median" or ("aggregate_name" not in b and name not in rows):
            rows[name] = b
        if b.get("error_occurred"):
            rows[name] = b
    return rows


def render_cp(w, cp, note):
    """The context-parallel tables of one bench_cp.py run (merge_cp's output)."""
    w(f"{cp.get('gpus_on_host', '?')}× {cp.get('device', '?')} of one host, NCCL (NVLink "
      f"multicast off), torch {cp.get('torch', '?')}"
      f"{'; ' + note if note else ''}. One sequence (B = 1), H = HV = 16, "
      "K = V = 128, bf16, l2-normalised q and k, g = logsigmoid(randn)/16 with a quarter of "
      "the heads undecayed, η = sigmoid(randn), an initial state; one GPU runs "
      "`kla.chunk_kla`, several run `kla.cp.chunk_kla_cp` on equal contiguous shards; "
      "rows with several sequences pack them (random lengths) with global `cu_seqlens`, "
      "shards cutting them anywhere. "
      "Forward, and forward + backward (dO and d(final state) given), medians of CUDA-event "
      "timings of the whole call after two warm-ups, the slowest rank's."
      + (" \"OOM\": the backward's workspace does not fit one GPU."
         if any(r.get("forward_backward_ms") is None for r in cp.get("rows", [])) else ""))
    w("")
    w("| tokens | sequences | GPUs | forward ms | forward+backward ms | vs one GPU (forward "
      "/ fwd+bwd) |")
    w("|---|---|---|---|---|---|")
    one = {(r["tokens"], r.get("sequences", 1)): r for r in cp.get("rows", [])
           if r["gpus"] == 1}
    for r in cp.get("rows", []):
        base = one.get((r["tokens"], r.get("sequences", 1)), {})

        def ratio(key):
            a, b = base.get(key), r.get(key)
            return f"{a / b:.2f}×" if a and b else "–"
        fb = r.get("forward_backward_ms")
        w(f"| {r['tokens']} | {r.get('sequences', 1)} | {r['gpus']} | "
          f"{f(r.get('forward_ms'), '.2f')} | {f(fb, '.1f') if fb is not None else 'OOM'} | "
          f"{ratio('forward_ms')} / {ratio('forward_backward_ms')} |")
    peer = [r for r in cp.get("rows", []) if r.get("given_beta")]
    if peer:
        info = peer[0]["given_beta"]
        w("")
        w(f"Beside FLA's context parallelism (fla-core {info.get('fla_version', '?')}, "
          "`chunk_gated_delta_rule` with `cp_context` from `build_cp_context` over the same "
          "group; one GPU: the plain call), like for like: kla's given-β function "
          "(`kla.cp.chunk_gated_delta_rule_cp`; one GPU `kla.chunk_gated_delta_rule`), "
          "β = η, on the same shards, without initial or final state (FLA's context "
          "parallelism takes neither); forward + backward with dO only."
          + (" FLA's Hopper guard for Triton 3.4-3.7.0 (its issue 640) was bypassed so that "
             "its backward runs." if info.get("fla_guard_bypassed") else ""))
        w("")
        w("| tokens | GPUs | kla forward ms | FLA forward ms | kla fwd+bwd ms | "
          "FLA fwd+bwd ms | FLA / kla (forward / fwd+bwd) |")
        w("|---|---|---|---|---|---|---|")
        for r in peer:
            a, b = r["given_beta"].get("kla", {}), r["given_beta"].get("fla", {})

            def cell(d, key):
                if d.get(key) is not None:
                    return f(d[key], ".2f")
                return "OOM" if "OutOfMemory" in d.get("error", "") else "failed"

            def rr(key):
                x, y = a.get(key), b.get(key)
                return f"{y / x:.2f}×" if x and y else "–"
            w(f"| {r['tokens']} | {r['gpus']} | {cell(a, 'forward_ms')} | "
              f"{cell(b, 'forward_ms')} | {cell(a, 'forward_backward_ms')} | "
              f"{cell(b, 'forward_backward_ms')} | {rr('forward_ms')} / "
              f"{rr('forward_backward_ms')} |")
    cmp_rows = [r for r in cp.get("rows", []) if r.get("compare_with_one_gpu")]
    if cmp_rows:
        w("")
        w("Against one GPU on the same inputs (relative RMS of the context-parallel result "
          "against `kla.chunk_kla`'s):")
        w("")
        names = list(cmp_rows[0]["compare_with_one_gpu"])
        w("| tokens | sequences | GPUs | " + " | ".join(names) + " |")
        w("|---|---|---|" + "---|" * len(names))
        for r in cmp_rows:
            c = r["compare_with_one_gpu"]
            w(f"| {r['tokens']} | {r.get('sequences', 1)} | {r['gpus']} | " +
              " | ".join(f"{c[n]:.1e}" for n in names) + " |")
    w("")


# Issue 26's table: published peer times (FlashQLA's H200 table, CUDA graphs) and our goals (ms),
# keyed by (label, H, HV).
RECIPE_GOALS = {
    ("1x32768", 16, 16): ("FlashQLA 0.498", 0.40, 0.50),
    ("4x8192", 16, 16): ("FlashQLA 0.392", 0.31, 0.40),
    ("8x4096", 16, 16): ("FlashInfer 0.225", 0.19, 0.30),
    ("1x32768", 16, 32): ("FlashQLA 0.877", 0.70, 0.90),
    ("8x4096", 16, 32): ("FlashInfer 0.431", 0.35, 0.55),
    ("1x131072", 8, 8): ("–", 0.75, 1.2),
}


# Dense bf16 tensor-core peak (FLOP/s) of the GPUs the runs use (NVIDIA's data sheets, SXM).
TC_PEAK_BF16 = {"H100": 989.4e12, "H200": 989.4e12}


def render_prefill_rows(w, res):
    """The prefill table (every non-sweep row of a side_by_side.py result)."""
    w("| B×T×H | K, V | dtype | plan | ours | FLA | FLA+β | ratio | floor | ours % floor | "
      "FLA % floor | rel RMS |")
    w("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in [r for r in res["prefill"] if not r.get("sweep")]:
        w(f"| {r['B']}×{r['T']}×{r['H']} | {r['K']}, {r['V']} | {r['dtype']} | "
          f"{r.get('plan', '–')} | "
          f"{f(r.get('ours'), '.3f')} | {f(r.get('fla'), '.3f')} | "
          f"{f(r.get('fla_beta'), '.3f')} | {f(r.get('ratio'), '.2f')} | {r['floor']:.3f} | "
          f"{f(r.get('ours_frac'), '.1%')} | {f(r.get('fla_frac'), '.1%')} | "
          f"{f(r.get('rel_rms_ours_fla'), '.1e')} |")


def nominal_flops(lengths, HV, K, V, C=64):
    """The chunkwise algorithm's tensor products once each, one part (FLA's count), for packed
    sequences of these lengths: per chunk and value head K Kᵀ, Q Kᵀ, W = T K (C·C·K each),
    U = T V, the intra-chunk (P T) U (C·C·V each), W S, Q S, Kᵀ U (C·K·V each) and the
    triangular solve (C³/3 multiply-adds)."""
    chunks = sum((n + C - 1) // C for n in lengths) * HV
    return chunks * (2 * C * C * K * 3 + 2 * C * C * V * 2 + 2 * C * K * V * 3 + 2 * C ** 3 / 3)


def render_recipe(w, res, note):
    """The peers' recipe rows of side_by_side.py (RECIPE): CUDA-graph replays and plain calls."""
    m = res.get("meta", {})
    rows = res["recipe"]
    w("")
    w("### The peers' recipe: packed sequences, CUDA graphs (issue 26's table)")
    w("")
    w(f"{m.get('gpu', '?')}, at `{m.get('build', {}).get('commit', '?')}`"
      + (f" ({note})" if note else "") + ": `side_by_side.py`'s recipe rows, bf16, K = V = 128, "
      "the peers' benchmark inputs: sequences packed with `cu_seqlens` (N×T is N packed "
      "sequences; 'varlen' is 32 sequences of random lengths, 106 to 1771 tokens, totalling "
      "16384), an initial state in and the final state out, q and k l2-normalised in the kernel "
      "(`use_qk_l2norm_in_kernel`), g = logsigmoid(randn)/16 with a quarter of the value heads "
      "undecayed, β = sigmoid(randn) (our η in the Kaczmarz rows, β in the given-β rows, which "
      "are exactly the peers' computation). Both libraries through their Python functions "
      "(`kla.chunk_kla` / `kla.chunk_gated_delta_rule` with `cu_seqlens_cpu`; FLA's "
      "`chunk_gated_delta_rule`); **graph** = median replay time per call of a captured CUDA "
      "graph of several calls (launch overhead gone: kernel to kernel), plain = calls from "
      "Python one after another (host cost included). ms; ratio = FLA / ours, graph times. "
      "Published peers and goals: issue 26 (FlashQLA's H200 table, CUDA graphs). Floor = q, k, v "
      "read and o written in bf16, g and β in fp32, the states read and written in fp32, at "
      "this run's copy rate. TC peak = the nominal tensor work (`nominal_flops`: the chunkwise "
      "algorithm's products once each in one part, FLA's count) over the GPU's dense bf16 peak "
      "(989 TFLOPS), at the best time; ACCURATE runs up to three times that work on the tensor "
      "cores (split operands), FAST about two.")
    w("")
    w("| rows | H/HV | plan ACCURATE / FAST | ours Kaczmarz ACCURATE | ours Kaczmarz FAST | "
      "ours given-β ACCURATE | ours given-β FAST | FLA | ratio (given-β ACCURATE / FAST) | "
      "published peer | goal FAST / ACCURATE | floor | ours % floor (best) | plain: ours "
      "given-β ACCURATE, FLA | TC peak: ours best, FLA | rel RMS o / state vs FLA |")
    w("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    peak = next((v for k, v in TC_PEAK_BF16.items() if k in m.get("gpu", "")), None)
    for r in rows:
        g = lambda k: r.get(k)
        peer, gf, ga = RECIPE_GOALS.get((r["label"], r["H"], r["HV"]), ("–", None, None))
        best = min([x for x in (g("ours given accurate graph"), g("ours given fast graph"),
                                g("ours kaczmarz accurate graph"), g("ours kaczmarz fast graph"))
                    if x], default=None)
        work = nominal_flops(r["lengths"], r["HV"], r["K"], r["V"])

        def tc(ms):
            return f(work / (ms * 1e-3) / peak if ms and peak else None, ".1%")
        w(f"| {r['label']} | {r['H']}/{r['HV']} | {g('plan kaczmarz accurate') or '–'} / "
          f"{g('plan kaczmarz fast') or '–'} | {f(g('ours kaczmarz accurate graph'), '.3f')} | "
          f"{f(g('ours kaczmarz fast graph'), '.3f')} | "
          f"{f(g('ours given accurate graph'), '.3f')} | {f(g('ours given fast graph'), '.3f')} | "
          f"{f(g('fla graph'), '.3f')} | {f(g('ours given accurate ratio_graph'), '.2f')} / "
          f"{f(g('ours given fast ratio_graph'), '.2f')} | {peer} | "
          f"{f(gf, '.2f')} / {f(ga, '.2f')} | {r['floor']:.3f} | "
          f"{f(r['floor'] / best if best else None, '.1%')} | "
          f"{f(g('ours given accurate plain'), '.3f')}, {f(g('fla plain'), '.3f')} | "
          f"{tc(best)}, {tc(g('fla graph'))} | "
          f"{f(g('rel_rms_o_given_vs_fla'), '.1e')} / {f(g('rel_rms_state_given_vs_fla'), '.1e')} |")
    errs = [(r["label"], k, v) for r in rows for k, v in r.items() if k.endswith("error")]
    if errs:
        w("")
        for label, k, v in errs:
            w(f"- {label}, {k}: {str(v).splitlines()[0][:300]}")


def render_split(w, src, plots_dir, why):
    """The sequence split's section: bench_split.py's table and plot, copied with its JSON."""
    for name in ("split.json", "split.png"):
        if os.path.exists(os.path.join(src, name)):
            copy_in(os.path.join(src, name), os.path.join(plots_dir, name))
    w("### Sequence split (issue 26; `bench/bench_split.py`)")
    w("")
    w("Where few sequences and value heads leave the GPU idle (one pass runs 16 blocks a (sequence, "
      "value head) on its narrowest slices), `kla_chunk_forward` cuts every sequence into segments "
      "that run side by side (docs/api.md, *Sequence split*): a maps pass over K + V columns, an "
      "fp32 fold, a second pass. On the peers' recipe inputs (bf16, K = V = 128, q and k "
      "l2-normalised in the kernel, an initial state in and the final state out), both libraries "
      "replayed from CUDA graphs in one run; 'auto' is the plan's own call (×n: split into n "
      "segments), 'one pass' the same call with `segments = 1`. FLA runs its given-β function on "
      "the same tensors (with unit keys the Kaczmarz coefficient is η / (1 + ε)).")
    w("")
    with open(os.path.join(src, "split.md")) as fh:
        w(fh.read().rstrip())
    w("")
    if os.path.exists(os.path.join(plots_dir, "split.png")):
        w("![the sequence split beside one pass and FLA](performance/split.png)")
        w("")
    if why:
        with open(why) as fh:
            w(fh.read().rstrip())
        w("")


def render_backward(w, bwd, docs, note):
    """The backward section from bench_backward.py's backward.json (bwd); docs: the docs folder
    (its performance/backward.png is linked where it exists)."""
    w("## Backward (`python3 bench/bench_backward.py`)")
    w("")
    w(f"{bwd.get('device', '?')}, torch {bwd.get('torch', '?')}, FLA "
      f"{(bwd.get('fla') or {}).get('version', 'not run')}"
      f"{'; ' + note if note else ''}. FlashQLA's backward case: "
      "bf16, K = V = 128, H 16 / HV 32, packed sequences, initial state, l2-normalised q and "
      "k in the kernel, g = logsigmoid(randn)/16, β = sigmoid(randn), upstream gradients of o "
      "and of the final state; each library's `chunk_gated_delta_rule` through "
      "torch.autograd. bwd = the backward alone (a retained graph replayed), fwd+bwd = both; "
      "medians of CUDA-event timings after warm-up. Peak = memory torch allocated over one "
      "fwd+bwd beyond what was allocated before. kla's forward saves only its inputs; its "
      "backward recomputes each chunk's state into its workspace."
      + (" The run stopped before its end (a time limit): these are the rows it finished."
         if bwd.get("complete") is False else ""))
    if (bwd.get("fla") or {}).get("guard_bypassed"):
        w("")
        w("FLA refuses its backward on Hopper with Triton 3.4 up to 3.7.0 (its issue 640: "
          "wrong dq / dk / dg there); the script bypassed that guard, so FLA's rows are what "
          "a user who forces it gets.")
    w("")
    if os.path.exists(os.path.join(docs, "performance", "backward.png")):
        w("![backward beside FLA](performance/backward.png)")
        w("")
        w("Drawn by `bench/plot_backward.py` from the runs in docs/performance/ (its title "
          "names them and what each shade is).")
        w("")
    speed = bwd.get("speed", [])
    fast = any("kla_fast_bwd_ms" in r for r in speed)
    saved = any("kla_fast_saved_bwd_ms" in r for r in speed)
    if fast:
        w("kla FAST: the same call with `arithmetic=\"fast\"` (here bf16 at K = V = 128: the "
          "prep and both state scans on bf16 tensor cores with the raw inputs exact and the "
          "scaled operands split in two parts, the input gradients on one-part bf16 operands; "
          "docs/accuracy.md, 'Backward', has its errors beside FLA's).")
        w("")
    if saved:
        plans = [(r["case"], r["kla_fast_saved_plan"]) for r in speed
                 if "kla_fast_saved_plan" in r]
        w("kla FAST saved: kla FAST with `save_states=True`, the case FlashQLA's figures are "
          "(the backward given what the forward saved): the forward also writes each chunk's "
          "incoming state and U in bf16 (saved GiB, `kla_saved_states_size`) and the backward "
          "reads them instead of running its state scan (`kla_chunk_backward_saved`)."
          + (" Its state-gradient schedule on this GPU, as the run recorded it "
             "(`kla.backward_plan`; docs/api.md, 'State-gradient schedule'): " + "; ".join(
                 f"{case}: {saved_schedule_text(p)}" for case, p in plans) + "."
             if plans else ""))
        w("")
    # (heading, key) of the libraries' columns, kla's variants where the run has them
    libs = [("kla", "kla_")] + ([("kla FAST", "kla_fast_")] if fast else []) + (
        [("kla FAST saved", "kla_fast_saved_")] if saved else []) + [("FLA", "fla_")]

    def targets(r):
        pub, goal = ISSUE25.get(r["case"], (None, None))
        return (f"{pub:.3f}", f"≤ {goal:g}") if pub else ("–", "–")

    def row_line(cells):
        return "| " + " | ".join(cells) + " |"

    memory = [("kla workspace GiB", "kla_workspace_GiB"), ("kla peak GiB", "kla_peak_GiB")] + (
        [("saved GiB", "kla_saved_GiB"), ("kla FAST saved peak GiB", "kla_fast_saved_peak_GiB")]
        if saved else []) + [("FLA peak GiB", "fla_peak_GiB")]
    heads = ([f"{n} bwd ms" for n, _ in libs] + [f"{n} fwd+bwd ms" for n, _ in libs]
             + ["FlashQLA bwd (published, H200)", "goal"] + [h for h, _ in memory])
    w(row_line(["case"] + heads))
    w("|" + "---|" * (len(heads) + 1))
    for r in speed:
        cells = ([f(r.get(f"{k}bwd_ms"), ".3f") for _, k in libs]
                 + [f(r.get(f"{k}fwd_bwd_ms"), ".3f") for _, k in libs] + list(targets(r))
                 + [f(r.get(k), ".2f") for _, k in memory])
        w(row_line([r["case"]] + cells))
    w("")
    graphed = [r for r in speed if "kla_graph_bwd_ms" in r]
    if graphed:
        copy = bwd.get("copy_TBps")
        w("The same calls replayed from CUDA graphs (kernel to kernel: the host's launch work "
          "out of the time, as FlashQLA's published figures were taken)"
          + (f". Floor = the backward's fewest bytes (q, k, v, dO read and dq, dk, dv written "
             f"once in bf16, g, β read and dg, dβ written in fp32, the initial state and the "
             f"final state's gradient read and the initial state's gradient written in fp32: "
             f"`backward_floor_bytes`) at this run's copy rate, {copy:.2f} TB/s (1 GiB device "
             f"copy, bytes read + written); % floor = floor / time:" if copy else ":"))
        w("")
        shared = [x for x in libs if x[0] != "kla"]  # the floor's shares: the fast variants, FLA
        heads = ([f"{n} bwd ms" for n, _ in libs] + [f"{n} fwd+bwd ms" for n, _ in libs]
                 + ["FlashQLA bwd (published, H200)", "goal"]
                 + (["floor ms"] + [f"{n} % floor" for n, _ in shared] if copy else []))
        w(row_line(["case"] + heads))
        w("|" + "---|" * (len(heads) + 1))
        for r in graphed:
            failed = "capture failed" if "fla_graph_error" in r else None

            def graph(k, what):
                return r.get(f"{k}graph_{what}_ms", failed if k == "fla_" else None)
            cells = ([f(graph(k, "bwd"), ".3f") for _, k in libs]
                     + [f(graph(k, "fwd_bwd"), ".3f") for _, k in libs] + list(targets(r)))
            if copy:
                floor = backward_floor_ms(r, copy)
                cells += [f(floor, ".3f")] + [
                    f"{100 * floor / t:.1f}%" if floor and isinstance(t, float) else "–"
                    for t in (graph(k, "bwd") for _, k in shared)]
            w(row_line([r["case"]] + cells))
        w("")


def backward_floor_ms(row, copy_TBps):
    """The memory floor (ms) of a bench_backward.py speed row at copy_TBps, or None where the row
    does not say its shape (runs before the floor was added)."""
    if not all(k in row for k in ("lengths", "H", "HV", "K", "V", "dtype")):
        return None
    es = {"bf16": 2, "fp16": 2, "fp32": 4}[row["dtype"]]
    nbytes = backward_floor_bytes(sum(row["lengths"]), row["H"], row["HV"], row["K"], row["V"],
                                  es, len(row["lengths"]))
    return 1e3 * nbytes / (copy_TBps * 1e12)


def merge_cp(runs):
    """One cp.json from several bench_cp.py runs on one machine: the first run's header, every
    run's rows ordered by tokens then GPUs, and each run's arguments."""
    runs = [r for r in runs if r]
    if not runs:
        return None
    out = {k: v for k, v in runs[0].items() if k not in ("rows", "args")}
    # an already merged cp.json (docs/performance's) keeps the runs it lists
    out["runs"] = [a for r in runs for a in (r.get("runs") or [r.get("args", {})])]
    # One row a case: where two runs measured the same (sequences, tokens, GPUs), the first
    # run's values stand and the other's add what it alone has (FLA beside, say).
    rows = {}
    for r in runs:
        for row in r.get("rows", []):
            key = (row.get("sequences", 1), row["tokens"], row["gpus"])
            rows[key] = {**row, **rows[key]} if key in rows else dict(row)
    out["rows"] = [rows[k] for k in sorted(rows)]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--docs", default=os.path.join(ROOT, "docs"))
    ap.add_argument("--status", help="a Markdown file quoted under the title: where things stand, "
                    "which section comes from which run (bench/notes/status.md)")
    ap.add_argument("--device-time", default="", help="device time the run used (text)")
    ap.add_argument("--command", default="", help="how OUTDIR was produced, where not by "
                    "run_side_by_side.sh (Markdown)")
    ap.add_argument("--reference", help="kla_bench_reference's JSON output (CPU costs)")
    ap.add_argument("--overhead", help="kla._bench_overhead's JSON output (Python host cost)")
    ap.add_argument("--overhead-note", default="", help="where and at which commit it ran")
    ap.add_argument("--recipe", help="a side_by_side.py output folder whose recipe rows "
                    "(--only recipe) to show, when they come from another run than OUTDIR's")
    ap.add_argument("--recipe-note", default="", help="where and at which commit it ran")
    ap.add_argument("--recipe-why", help="a Markdown file shown under the recipe table (why the "
                    "rows miss their goals; bench/notes/recipe_why.md)")
    ap.add_argument("--rerun", help="a side_by_side.py output folder re-measuring prefill rows "
                    "whose kernels changed after OUTDIR's run (shown under the prefill table)")
    ap.add_argument("--rerun-note", default="", help="where and why it ran")
    ap.add_argument("--split", help="bench/bench_split.py's output folder (split.json, split.md, "
                    "split.png)")
    ap.add_argument("--split-why", help="a Markdown file shown under the split's table (what the "
                    "rows show; bench/notes/split_why.md)")
    ap.add_argument("--backward", help="bench/bench_backward.py's output folder (backward.json)")
    ap.add_argument("--backward-note", default="", help="where and at which commit it ran")
    ap.add_argument("--cp", nargs="+", help="bench/bench_cp.py's output folders (cp.json; "
                    "several runs on one machine are merged, rows in order)")
    ap.add_argument("--cp-note", default="", help="where and at which commit it ran")
    ap.add_argument("--cp-earlier", nargs="+", help="an earlier bench_cp.py run shown apart")
    ap.add_argument("--cp-earlier-note", default="", help="where and at which commit it ran")
    args = ap.parse_args()

    sbs = load_json(os.path.join(args.outdir, "side_by_side.json"))
    gb = load_json(os.path.join(args.outdir, "kla_bench_cuda.json"))
    if sbs is None and gb is None:
        sys.exit(f"no results in {args.outdir}")
    plots_dir = os.path.join(args.docs, "performance")
    os.makedirs(plots_dir, exist_ok=True)
    plots = []
    for raw in ("side_by_side.json", "side_by_side.csv", "kla_bench_cuda.json"):
        if os.path.exists(os.path.join(args.outdir, raw)):
            copy_in(os.path.join(args.outdir, raw), os.path.join(plots_dir, raw))
    for png in ("prefill_vs_T.png", "decode_vs_B.png"):
        src = os.path.join(args.outdir, png)
        if os.path.exists(src):
            copy_in(src, os.path.join(plots_dir, png))
            plots.append(png)

    m = (sbs or {}).get("meta", {})
    build = m.get("build", {})
    ctx = (gb or {}).get("context", {})
    gpu = m.get("gpu") or ctx.get("gpu", "?")
    L = []
    w = L.append
    w("# Performance: where we stand against flash-linear-attention and the hardware floor")
    w("")
    w("Generated by `bench/make_performance_md.py` from "
      + ("the run the table below names (its command row)" if args.command else
         "one run of `" + COMMAND + "`") + " on the GPU machine (see [How to reproduce]"
      "(#how-to-reproduce)). Numbers are from that run only, except where a section names "
      "another.")
    w("")
    if args.status:  # a Markdown block quoted under the title (bench/notes/status.md)
        with open(args.status) as fh:
            w("\n".join(("> " + line).rstrip() for line in fh.read().rstrip().splitlines()))
        w("")
    w("| | |")
    w("|---|---|")
    w(f"| GPU | {gpu} ({m.get('sms', ctx.get('sms', '?'))} SMs, L2 "
      f"{int(m.get('l2_bytes', ctx.get('l2_bytes', 0))) / 1e6:.0f} MB) |")
    w(f"| commit | `{build.get('commit', '?')}` (+{build.get('uncommitted_files_in_cuda_bench', '?')}"
      f" uncommitted files in cuda/ and bench/; cuda sources sha256 "
      f"`{build.get('cuda_sources_sha256', '?')}`) |")
    w(f"| built | {build.get('built', '?')}, {build.get('flags', '')}, {build.get('nvcc', '')} |")
    w(f"| run | {m.get('started', ctx.get('date', '?'))} |")
    w(f"| command | {args.command or f'`{COMMAND}` (carry `build-bench-gpu/dist`, `.whl`)'} |")
    w(f"| software | torch {m.get('torch', '?')}, triton {m.get('triton', '?')}, "
      f"flash-linear-attention (fla-core) {m.get('fla', '?')}, kla {m.get('kla_version', '?')} |")
    copy = m.get("copy_TBps") or (float(ctx["copy_TBps"]) if "copy_TBps" in ctx else None)
    w(f"| copy rate | {f(copy, '.2f')} TB/s (1 GiB device copy, bytes read + written, same run)"
      + (f"; kla_bench_cuda measured {float(ctx['copy_TBps']):.2f}" if "copy_TBps" in ctx and
         m.get("copy_TBps") else "") + " |")
    if args.device_time:
        w(f"| device time | {args.device_time} |")
    w("")

    if sbs:
        w("## Side by side: ours vs flash-linear-attention (same inputs, same run)")
        w("")
        w("FLA = `chunk_gated_delta_rule` / `fused_recurrent_gated_delta_rule` (Triton) given the "
          "KLA coefficient β = η/(‖k‖²+ε) precomputed in fp32; FLA+β also computes β in PyTorch "
          "in each call, which FLA users must do to run KLA. Ratio = FLA / ours (> 1: ours "
          "faster). Floor = fewest bytes at the copy rate; frac = floor / time. rel RMS = "
          "‖o_ours − o_FLA‖/‖o_FLA‖ on the timed inputs.")
        w("")
        w("### Prefill (ms per call)")
        w("")
        w("Calls are enqueued back to back from Python, one event pair each: where the host "
          "cannot keep up, host time is part of the measurement, as it is for a user: FLA launches "
          "several Triton kernels per call through Python, and its nearly flat times at "
          "T <= 8192 suggest a host cost of about 0.4-0.6 ms per call. Our call is one ctypes "
          "call into the C ABI. Plan = the path and value slice the library's plan chose for "
          "the call (kla_plan_chunk_forward; docs/architecture.md).")
        w("")
        render_prefill_rows(w, sbs)
        rerun = load_json(os.path.join(args.rerun, "side_by_side.json")) if args.rerun else None
        if rerun and rerun.get("prefill"):
            copy_in(os.path.join(args.rerun, "side_by_side.json"),
                    os.path.join(plots_dir, "rerun.json"))
            rm = rerun.get("meta", {})
            w("")
            w(f"#### Re-measured after the run above: {rm.get('gpu', '?')}, commit "
              f"`{rm.get('build', {}).get('commit', '?')}`"
              + (f" ({args.rerun_note})" if args.rerun_note else ""))
            w("")
            w("The rows whose kernels changed since the run above, with the bf16 rows beside them "
              "for scale, FLA in the same run (`side_by_side.py --only 'prefill (bf16|fp16)|"
              "accuracy (bf16|fp16)'`; copy rate "
              f"{f(rm.get('copy_TBps'), '.2f')} TB/s). Compare ratios, not times, with the table "
              "above where the GPUs differ.")
            w("")
            render_prefill_rows(w, rerun)
        sweep = sorted([r for r in sbs["prefill"] if r["dtype"] == "bf16" and r["B"] == 1 and
                        r["H"] == 16 and r["K"] == 128], key=lambda r: r["T"])
        if sweep:
            w("")
            w("Sweep over T (bf16, B = 1, H = 16, K = V = 128):")
            w("")
            w("| T | ours ms | FLA ms | ratio | floor ms | ours ns/head-token | FLA ns/head-token |")
            w("|---|---|---|---|---|---|---|")
            for r in sweep:
                ht = r["B"] * r["T"] * r["H"]
                w(f"| {r['T']} | {f(r.get('ours'), '.3f')} | {f(r.get('fla'), '.3f')} | "
                  f"{f(r.get('ratio'), '.2f')} | {r['floor']:.3f} | "
                  f"{f(r['ours'] * 1e6 / ht if r.get('ours') else None, '.2f')} | "
                  f"{f(r['fla'] * 1e6 / ht if r.get('fla') else None, '.2f')} |")
        w("")
        w("### Decode (µs per step, one token, H = 16, K = V = 128, fp32 state)")
        w("")
        w("CUDA-graph replay of many steps (both libraries); 'plain' = one call from Python, "
          "launch overhead included.")
        w("")
        w("| B | dtype | ours | FLA | FLA+β | ratio | floor | ours % floor | FLA % floor | "
          "ours plain | FLA plain | rel RMS o | rel RMS state |")
        w("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in sbs["decode"]:
            w(f"| {r['B']} | {r['dtype']} | {f(r.get('ours'), '.1f')} | {f(r.get('fla'), '.1f')} | "
              f"{f(r.get('fla_beta'), '.1f')} | {f(r.get('ratio'), '.2f')} | {r['floor']:.1f} | "
              f"{f(r.get('ours_frac'), '.1%')} | {f(r.get('fla_frac'), '.1%')} | "
              f"{f(r.get('ours_plain'), '.1f')} | {f(r.get('fla_plain'), '.1f')} | "
              f"{f(r.get('rel_rms_ours_fla'), '.1e')} | {f(r.get('rel_rms_state'), '.1e')} |")
        if sbs["accuracy"]:
            w("")
            w("### Agreement with a float64 recurrence (relative RMS of o, same rounded inputs)")
            w("")
            w("| dtype | B×T×H, K, V | ours chunk | ours tokenwise | FLA chunk | FLA recurrent | "
              "ours vs FLA |")
            w("|---|---|---|---|---|---|---|")
            for r in sbs["accuracy"]:
                w(f"| {r['dtype']} | {r['shape']} | {r['ours_chunk']:.2e} | "
                  f"{r['ours_tokenwise']:.2e} | {r['fla_chunk']:.2e} | {r['fla_recurrent']:.2e} |"
                  f" {r['ours_vs_fla']:.2e} |")
        if m.get("beta_note"):
            w("")
            w("Note: " + m["beta_note"])
    rec_src = load_json(os.path.join(args.recipe, "side_by_side.json")) if args.recipe else sbs
    if rec_src and rec_src.get("recipe"):
        if args.recipe:
            copy_in(os.path.join(args.recipe, "side_by_side.json"),
                    os.path.join(plots_dir, "recipe.json"))
        render_recipe(w, rec_src, args.recipe_note)
        if args.recipe_why:
            w("")
            with open(args.recipe_why) as fh:
                w(fh.read().rstrip())
        if sbs.get("skipped") or sbs.get("errors"):
            w("")
            w("Not measured in this run:")
            w("")
            for s in sbs.get("skipped", []):
                w(f"- skipped: {s}")
            for e in sbs.get("errors", []):
                w(f"- error: {e.splitlines()[0][:400]}")
        w("")

    if args.split and os.path.exists(os.path.join(args.split, "split.md")):
        render_split(w, args.split, plots_dir, args.split_why)

    if plots:
        w("## Plots")
        w("")
        for p in plots:
            w(f"![{p[:-4]}](performance/{p})")
            w("")
        w("Raw numbers of this run: [side_by_side.csv](performance/side_by_side.csv), "
          "[side_by_side.json](performance/side_by_side.json)"
          + (", [kla_bench_cuda.json](performance/kla_bench_cuda.json)." if gb else "."))
        w("")

    if gb:
        w("## kla_bench_cuda (Google Benchmark, CUDA events, median of repetitions)")
        w("")
        w("Per call; floor bytes at the copy rate kla_bench_cuda measured at start-up; decode "
          "'launch' = back-to-back calls from C++, 'graph' = CUDA-graph replay.")
        w("")
        w("| benchmark | median µs | ns/head-token | TB/s | floor µs | % of floor | sets |")
        w("|---|---|---|---|---|---|---|")
        for name, b in gbench_rows(gb).items():
            if b.get("error_occurred"):
                w(f"| {name} | error: {b.get('error_message', '')[:120]} | | | | | |")
                continue
            w(f"| {name} | {f(b.get('median_us'), '.2f')} | {f(b.get('ns/head-token'), '.3f')} | "
              f"{f(b.get('TB/s'), '.3f')} | {f(b.get('floor_us'), '.2f')} | "
              f"{f(b.get('floor_frac'), '.1%')} | {f(b.get('sets'), '.0f')} |")
        w("")

    ref = load_json(args.reference) if args.reference else None
    if ref:
        c = ref.get("context", {})
        w("## CPU reference cost (kla_bench_reference)")
        w("")
        w(f"One head, K = V = D, scalar decay, Kaczmarz coefficient; {c.get('num_cpus', '?')} "
          f"CPUs at {c.get('mhz_per_cpu', '?')} MHz ({c.get('date', '')}), single-threaded. "
          "What a reference check of a given size costs: the tokenwise form does O(D²) work per "
          "token, the chunkwise form adds the chunk system (O(C·D) per token) and, being a "
          "plain transcription of the formulas, is slower on the CPU.")
        w("")
        w("| benchmark | tokens/s | time per token |")
        w("|---|---|---|")
        for b in ref.get("benchmarks", []):
            if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
                continue
            tps = b.get("tokens/s")
            w(f"| {b['name']} | {f(tps, ',.0f')} | "
              f"{f(1e6 / tps if tps else None, '.1f')} µs |")
        w("")
    ovh = load_json(args.overhead) if args.overhead else None
    if ovh:
        copy_in(args.overhead, os.path.join(args.docs, "performance", "python_overhead.json"))
        w("## Python host overhead (`python3 -m kla._bench_overhead`)")
        w("")
        w(f"Decode at B = 1 (H = HV = 16, K = V = 128, bf16, fp32 state in place) through the "
          f"Python package, {ovh.get('device', '?')}, torch {ovh.get('torch', '?')}"
          f"{'; ' + args.overhead_note if args.overhead_note else ''}. Plain rows: host time "
          "per back-to-back call from a Python loop (the GPU work of one call is shorter); graph "
          "rows: GPU time per call of a replayed CUDA graph of 100 calls. The issue's bar: ≤ 20 µs "
          "a plain call (FLA: about 200 µs). docs/python.md says which calls take the short path.")
        w("")
        w("| call | µs per call |")
        w("|---|---|")
        for r in ovh.get("rows", []):
            w(f"| {r['case']} | {r['us_per_call']:.2f} |")
        w("")
    bwd = load_json(os.path.join(args.backward, "backward.json")) if args.backward else None
    if bwd:
        copy_in(os.path.join(args.backward, "backward.json"),
                os.path.join(args.docs, "performance", "backward.json"))
        render_backward(w, bwd, args.docs, args.backward_note)
    cp = merge_cp([load_json(os.path.join(d, "cp.json")) for d in args.cp]) if args.cp else None
    if cp:
        with open(os.path.join(args.docs, "performance", "cp.json"), "w") as fh:
            json.dump(cp, fh, indent=1)
        w("## Context parallelism (`python3 bench/bench_cp.py`)")
        w("")
        if os.path.exists(os.path.join(args.docs, "performance", "cp_scaling.png")):
            w("![context-parallel scaling](performance/cp_scaling.png)")
            w("")
            w("Drawn by `bench/plot_cp.py` from the cp.json files beside it (this run solid, the "
              "earlier run dashed, FLA dotted).")
            w("")
        render_cp(w, cp, args.cp_note)
        earlier = (merge_cp([load_json(os.path.join(d, "cp.json")) for d in args.cp_earlier])
                   if args.cp_earlier else None)
        if earlier:
            with open(os.path.join(args.docs, "performance", "cp_earlier.json"), "w") as fh:
                json.dump(earlier, fh, indent=1)
            w("### An earlier run (not this commit)")
            w("")
            render_cp(w, earlier, args.cp_earlier_note)
    w("## Reference figures (SPEC §4, not this run)")
    w("")
    w("Measured earlier on one **H200** (copy 4.27 TB/s), FLA `chunk_gated_delta_rule` in bf16 "
      "with the KLA coefficient: compare ratios, not absolute times, when the GPU above differs.")
    w("")
    w("| B×T×H, D = 128 | FLA kernel ms | with β in PyTorch ms | floor ms |")
    w("|---|---|---|---|")
    for (B, T, H, _, _), (a, b, c) in PEER.items():
        w(f"| {B}×{T}×{H} | {a} | {b} | {c} |")
    w("")
    w("FLA decode (CUDA graph, H200): B=1 7.2 µs, B=8 11.7 µs, B=64 53.0 µs (floor 31.4), "
      "B=256 188.6 µs (floor 125.6).")
    w("")
    w("## How to reproduce")
    w("")
    w("```")
    w("bash bench/run_side_by_side.sh stage        # here: build for sm_90a, fetch the FLA wheel")
    w("# on the GPU machine (device tool, carry build-bench-gpu/dist and .whl):")
    w(COMMAND + "              # writes $OUT: run.log, kla_bench_cuda.json,")
    w("                                             #   side_by_side.{json,csv}, *.png")
    w("# the peers' recipe rows alone (they are also the last steps of the full run):")
    w("PYTHONPATH=/tmp/kla-site LD_LIBRARY_PATH=build-bench-gpu/dist python3 bench/side_by_side.py \\")
    w("    --lib build-bench-gpu/dist/libkla_cuda.so --out $OUT/sbs --budget 380 --only recipe")
    w("# or every benchmark of this page with the GPU suite's library (tools/gpu_suite.sh stage;")
    w("# carry build-gpu/dist and .whl/fla), one job a GPU: four GPUs in one call, two in two")
    w("bash bench/run_page_benchmarks.sh   # KLA_PAGE_JOBS='sbs recipe', then 'backward split'")
    w("# rows re-measured after a kernel change (shown under the prefill table with --rerun):")
    w("    ... --out $OUT/sbs --budget 290 --only 'prefill (bf16|fp16)|accuracy (bf16|fp16)'")
    w("build/bench/kla_bench_reference --benchmark_out=ref.json --benchmark_out_format=json")
    w("# the backward, on the GPU machine (carry build-gpu/dist and .whl/fla):")
    w("PYTHONPATH=python KLA_CUDA_LIBRARY=build-gpu/dist/libkla_cuda.so.5 \\")
    w("    python3 bench/bench_backward.py --out $OUT/backward [--quick]")
    w("python3 bench/make_performance_md.py OUTDIR --reference ref.json --status bench/notes/status.md \\")
    w("    [--command '...'] [--device-time '...'] \\")
    w("    [--recipe RECIPE_OUTDIR --recipe-why bench/notes/recipe_why.md] \\")
    w("    [--rerun RERUN_OUTDIR] [--backward BACKWARD_OUTDIR] [--cp CP_OUTDIR] \\")
    w("    [--split SPLIT_OUTDIR --split-why bench/notes/split_why.md]")
    w("# the sequence split, on the GPU machine (carry build-gpu/dist and .whl/fla; FLA installed):")
    w("PYTHONPATH=python:/tmp/site KLA_CUDA_LIBRARY=$PWD/build-gpu/dist/libkla_cuda.so.5 \\")
    w("    python3 bench/bench_split.py --out $OUT/split")
    w("python3 bench/bench_split.py --out docs/performance --plot docs/performance/split.json  # here")
    w("# context parallelism, on a machine with several GPUs (carry build-gpu/dist):")
    w("PYTHONPATH=python KLA_CUDA_LIBRARY=$PWD/build-gpu/dist/libkla_cuda.so.5 \\")
    w("    python3 bench/bench_cp.py --out $OUT/cp --gpus 1 2 4 --fla   # (also PYTHONPATH+=FLA)")
    w("python3 bench/plot_backward.py 'replayed=docs/performance/backward.json#graph' \\")
    w("    'plain=docs/performance/backward.json' [EARLIER=...json] "
      "--out docs/performance/backward.png")
    w("python3 bench/plot_cp.py docs/performance/cp.json [docs/performance/cp_earlier.json] \\")
    w("    --out docs/performance/cp_scaling.png --title '...'   # here, needs matplotlib")
    w("                                             # here: this page and docs/performance/*.png")
    w("```")
    w("")
    w("Method: CUDA events around each timed region, warm-up first (FLA's Triton autotuning and "
      "compilation happen there), median of many calls; inputs random (never zeros) and rotated "
      "among buffer sets totalling more than 2.2× L2; outputs poisoned with NaN before the "
      "checked call. Floors: prefill reads q, k, v and writes o once in the dtype plus fp32 g "
      "and η (1032 B per head-token in bf16 at K = V = 128); decode adds the fp32 state read "
      "and written. The CPU reference costs are `kla_bench_reference` (built with "
      "`-DKLA_BUILD_BENCH=ON`; a smoke runs in ctest).")
    w("")
    path = os.path.join(args.docs, "performance.md")
    with open(path, "w") as fh:
        fh.write("\n".join(L))
    print(f"wrote {path} ({len(plots)} plots)")


if __name__ == "__main__":
    main()
