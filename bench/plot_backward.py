#!/usr/bin/env python3
"""Draws bench/bench_backward.py runs: backward ms per case, kla ACCURATE, FAST and FAST with saved
states (where the run timed it) beside FLA (the same run), FlashQLA's published H200 time and issue
25's goal, log scale.

    python3 bench/plot_backward.py "af7e735=docs/performance/backward.json" \
        "fbd928e=docs/performance/backward_earlier.json" \
        --out docs/performance/backward.png --title "one H100, ..."

Each argument is LABEL=backward.json (the label names the run, e.g. its commit), or
LABEL=backward.json#graph for the same run's CUDA-graph replays (kernel to kernel); the first is
drawn solid, the others lighter (earlier runs, or the plain calls beside the replays), FLA from
every run that has it. Needs matplotlib.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from backward_targets import ISSUE25  # noqa: E402
from figure import plot_arguments, pyplot, save, wrap  # noqa: E402


# The plain calls' keys of a speed row and their CUDA-graph replays' (bench_backward.py).
GRAPH_KEYS = {"kla_bwd_ms": "kla_graph_bwd_ms", "kla_fast_bwd_ms": "kla_fast_graph_bwd_ms",
              "kla_fast_saved_bwd_ms": "kla_fast_saved_graph_bwd_ms",
              "fla_bwd_ms": "fla_graph_bwd_ms"}
# kla's variants in drawing order: (key, series name)
KLA_SERIES = (("kla_bwd_ms", "kla ACCURATE"), ("kla_fast_bwd_ms", "kla FAST"),
              ("kla_fast_saved_bwd_ms", "kla FAST saved"))


def load(spec):
    label, sep, path = spec.partition("=")
    if not sep:
        raise SystemExit(f"plot_backward: '{spec}' is not LABEL=backward.json[#graph]")
    path, hashed, part = path.partition("#")
    if hashed and part != "graph":
        raise SystemExit(f"plot_backward: '{spec}': the only part after # is 'graph'")
    try:
        with open(path) as fh:
            rows = json.load(fh).get("speed", [])
    except (OSError, ValueError) as e:
        raise SystemExit(f"plot_backward: cannot read {path}: {e}")
    if hashed:  # the replays under the plain keys, which bars() reads
        rows = [{**r, **{k: r.get(g) for k, g in GRAPH_KEYS.items()}} for r in rows]
        if not any(r.get("kla_bwd_ms") or r.get("kla_fast_bwd_ms") for r in rows):
            raise SystemExit(f"plot_backward: {path} has no CUDA-graph replays")
    if not rows:
        raise SystemExit(f"plot_backward: {path} has no speed rows")
    return label, {r["case"]: r for r in rows}


def bars(runs):
    """[(series label, {case: ms}, run index)] in drawing order: kla ACCURATE, FAST and FAST saved
    of every run (each variant the run timed), then FLA of every run that timed it."""
    out = []
    for i, (label, rows) in enumerate(runs):
        for key, name in KLA_SERIES:
            vals = {c: r[key] for c, r in rows.items() if r.get(key)}
            if vals:
                out.append((f"{name} ({label})", vals, i))
    for i, (label, rows) in enumerate(runs):
        vals = {c: r["fla_bwd_ms"] for c, r in rows.items() if r.get("fla_bwd_ms")}
        if vals:
            out.append((f"FLA ({label})", vals, i))
    return out


def main():
    args = plot_arguments(__doc__, "LABEL=backward.json (the first drawn solid)")
    runs = [load(s) for s in args.runs]
    cases = list(runs[0][1])
    series = bars(runs)
    fig, ax = pyplot().subplots(figsize=(10, 5.0))
    width = 0.8 / len(series)
    colors = {"kla ACCURATE": "tab:blue", "kla FAST": "tab:green", "kla FAST saved": "tab:olive",
              "FLA": "tab:orange"}
    for s, (label, vals, run) in enumerate(series):
        xs = [c + (s - (len(series) - 1) / 2) * width for c in range(len(cases))]
        ys = [vals.get(case, 0.0) for case in cases]
        ax.bar(xs, ys, width, label=label, color=colors[label.split(" (")[0]],
               alpha=1.0 if run == 0 else 0.4, edgecolor="black", linewidth=0.4)
        for x, y in zip(xs, ys):
            if y:
                ax.text(x, y * 1.04, f"{y:.2f}", ha="center", va="bottom", fontsize=6)
    for c, case in enumerate(cases):
        pub, goal = ISSUE25.get(case, (None, None))
        if goal:
            ax.hlines(goal, c - 0.45, c + 0.45, colors="red", linestyles="--", lw=1,
                      label="issue 25's goal" if c == 0 else None)
        if pub:
            ax.plot([c + 0.42], [pub], marker="*", color="black", ms=8, ls="none",
                    label="FlashQLA (published, H200)" if c == 0 else None)
    ax.set_yscale("log")
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels(cases)
    ax.set_ylabel("backward ms (log)")
    ax.grid(axis="y", alpha=0.3, which="both")
    # below the axes: with three runs a case the bars fill the plot's height
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.08))
    ax.set_title(wrap(args.title, 140), fontsize=8)
    save(fig, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
