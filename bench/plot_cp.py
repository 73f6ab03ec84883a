#!/usr/bin/env python3
"""Draws the context-parallel scaling of bench/bench_cp.py runs: speed-up over one GPU against the
number of GPUs, forward and forward + backward, one line a problem (tokens, sequences), FLA's
context parallelism beside where the run has it (like-for-like given-beta rows).

    python3 bench/plot_cp.py CP.json [CP.json ...] --out docs/performance/cp_scaling.png \
        --title "4x H200, kla 6fe2314"

Each file is a cp.json that bench_cp.py (or make_performance_md.py's merge) wrote; the files'
rows are drawn in one figure, solid for the first file, dashed for the others (an earlier run).
Needs matplotlib.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from figure import plot_arguments, pyplot, save, wrap  # noqa: E402


def speedups(rows, key, pick=lambda r: r):
    """{(tokens, sequences): [(gpus, one-GPU time / time)]} for rows whose `key` was timed."""
    one = {(r["tokens"], r.get("sequences", 1)): pick(r).get(key) for r in rows
           if r["gpus"] == 1}
    out = {}
    for r in rows:
        problem = (r["tokens"], r.get("sequences", 1))
        t, base = pick(r).get(key), one.get(problem)
        if t and base:
            out.setdefault(problem, []).append((r["gpus"], base / t))
    return {p: sorted(v) for p, v in out.items() if len(v) > 1}


def label(problem):
    tokens, seqs = problem
    size = f"{tokens // 1024}K" if tokens < 1 << 20 else f"{tokens / (1 << 20):g}M"
    return size + (f", {seqs} packed" if seqs > 1 else "")


def main():
    args = plot_arguments(__doc__, "cp.json files (the first drawn solid)")
    fig, axes = pyplot().subplots(1, 2, figsize=(11, 4.2), sharey=True)
    top = 1
    for i, path in enumerate(args.runs):
        with open(path) as fh:
            rows = json.load(fh).get("rows", [])
        style = "-" if i == 0 else "--"
        for ax, key in zip(axes, ("forward_ms", "forward_backward_ms")):
            for problem, pts in speedups(rows, key).items():
                g, s = zip(*pts)
                ax.plot(g, s, style, marker="o", label=f"kla {label(problem)}"
                        + ("" if i == 0 else " (earlier run)"))
                top = max(top, *g)
            beta = [r for r in rows if r.get("given_beta")]
            for problem, p in speedups(beta, key, lambda r: r["given_beta"]["fla"]).items():
                g, s = zip(*p)
                ax.plot(g, s, ":", marker="x", label=f"FLA {label(problem)}"
                        + ("" if i == 0 else " (earlier run)"))
    for ax, name in zip(axes, ("forward", "forward + backward")):
        ax.plot([1, top], [1, top], color="0.8", lw=1, label="linear")
        ax.axhline(1.0, color="0.5", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks([1, 2, 4, 8][: max(1, top.bit_length())])
        ax.set_xticklabels([str(x) for x in [1, 2, 4, 8][: max(1, top.bit_length())]])
        ax.set_xlabel("GPUs")
        ax.set_title(name)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("speed-up over one GPU (its own library)")
    axes[1].legend(fontsize=7, loc="upper left")
    fig.suptitle(wrap(args.title, 150), fontsize=9)
    save(fig, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
