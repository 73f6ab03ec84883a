#!/usr/bin/env python3
"""Draws bench/ab_backward.py runs: where each variant's backward time goes, kernel stage by kernel
stage, beside issue 25's goal and FlashQLA's published H200 time.

    python3 bench/plot_ab_backward.py docs/performance/backward_chain_s45/run1_h200_ab.json \
        --out docs/performance/backward_chain_s45/breakdown.png --title "one H200, ..."

One panel a row of ab_backward.py (1x32768, 8 sequences, 1x8192), one bar a variant (in the
order of the runs; variants of later files after the first's, their names suffixed with the file's
name where they repeat). A bar stacks the kernels' times of the variant's profiled backward
(torch.profiler, ab_backward.py's `kernels_ms`), grouped by stage; a black tick marks the same
variant's graph-replayed backward (`bwd_ms`), the figure the goals are about. Each value is the
median over the file's rounds. Kernels that run side by side (the prep beside the scan) overlap,
so their stack can pass the tick. Needs matplotlib.
"""
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from backward_targets import ISSUE25  # noqa: E402
from figure import plot_arguments, pyplot, save, wrap  # noqa: E402

# ab_backward.py's rows -> backward_targets.ISSUE25's case names
ROWS = {"1x32768": "1x32768", "8 seqs": "8 seqs, 32768 total", "1x8192": "1x8192"}

# (stage, pattern on the kernel's name, colour), first match wins; kernels matching none are
# "other" (memsets, copies).
STAGES = [
    ("prep beside the scan", r"bwd_prep_\w*beside_scan", "tab:olive"),
    ("prep", r"bwd_prep", "tab:green"),
    ("chain windows", r"bwd_chain_windows", "tab:purple"),
    ("chain segments", r"bwd_state_grad_segments", "tab:blue"),
    ("state-gradient scan", r"bwd_state_backward", "tab:cyan"),
    ("state scan", r"bwd_state_forward", "tab:gray"),
    ("input gradients", r"bwd_input_grads|bwd_chunk_grads", "tab:orange"),
]
OTHER = ("other", "lightgray")


def stage_of(kernel):
    """The stage a kernel's (torch.profiler) name belongs to."""
    for name, pattern, _ in STAGES:
        if re.search(pattern, kernel):
            return name
    return OTHER[0]


def load(paths):
    """{variant: {row: {"bwd_ms": median, "stages": {stage: median ms}}}} and the devices named by
    the runs, from ab_backward.py files; variants in the order they first run."""
    out, devices = {}, []
    for path in paths:
        try:
            with open(path) as fh:
                runs = json.load(fh)["runs"]
        except (OSError, ValueError, KeyError) as e:
            raise SystemExit(f"plot_ab_backward: cannot read {path}: {e}")
        per = {}  # variant -> row -> [(bwd_ms, {stage: ms})] over rounds
        for run in runs:
            if "error" in run:
                continue
            if run.get("device") and run["device"] not in devices:
                devices.append(run["device"])
            for row in ROWS:
                if row not in run:
                    continue
                stages = {}
                for kernel, ms in run[row].get("kernels_ms", {}).items():
                    s = stage_of(kernel)
                    stages[s] = stages.get(s, 0.0) + ms
                per.setdefault(run["variant"], {}).setdefault(row, []).append(
                    (run[row]["bwd_ms"], stages))
        if not per:
            raise SystemExit(f"plot_ab_backward: {path} has no finished runs")
        stem = os.path.splitext(os.path.basename(path))[0]
        for variant, rows in per.items():
            name = variant if variant not in out else f"{variant} ({stem})"
            out[name] = {}
            for row, samples in rows.items():
                names = {s for _, st in samples for s in st}
                out[name][row] = {
                    "bwd_ms": statistics.median(b for b, _ in samples),
                    "stages": {s: statistics.median(st.get(s, 0.0) for _, st in samples)
                               for s in names}}
    return out, devices


def main():
    args = plot_arguments(__doc__, "ab_backward.py JSON files")
    data, devices = load(args.runs)
    variants = list(data)
    rows = [r for r in ROWS if any(r in data[v] for v in variants)]
    plt = pyplot()
    height = 1.6 + 0.55 * len(variants) * len(rows)
    fig, axes = plt.subplots(len(rows), 1, figsize=(10, height), squeeze=False)
    colours = {name: c for name, _, c in STAGES}
    colours[OTHER[0]] = OTHER[1]
    order = [name for name, _, _ in STAGES] + [OTHER[0]]
    drawn = set()
    for ax, row in zip(axes[:, 0], rows):
        ys = list(range(len(variants)))[::-1]
        for y, v in zip(ys, variants):
            r = data[v].get(row)
            if not r:
                continue
            left = 0.0
            for s in order:
                ms = r["stages"].get(s, 0.0)
                if ms <= 0:
                    continue
                ax.barh(y, ms, left=left, color=colours[s], edgecolor="black", linewidth=0.3,
                        label=s if s not in drawn else None)
                drawn.add(s)
                if ms > 0.04 * max(1e-9, r["bwd_ms"]):
                    ax.text(left + ms / 2, y, f"{ms:.2f}", ha="center", va="center", fontsize=6)
                left += ms
            ax.plot([r["bwd_ms"]] * 2, [y - 0.42, y + 0.42], color="black", lw=2,
                    label="backward, graph-replayed" if "tick" not in drawn else None)
            drawn.add("tick")
            ax.text(max(left, r["bwd_ms"]) * 1.01, y, f"{r['bwd_ms']:.3f} ms", va="center",
                    fontsize=7)
        pub, goal = ISSUE25.get(ROWS[row], (None, None))
        if goal:
            ax.axvline(goal, color="red", ls="--", lw=1,
                       label="issue 25's goal" if "goal" not in drawn else None)
            drawn.add("goal")
        if pub:
            ax.axvline(pub, color="black", ls=":", lw=1,
                       label="FlashQLA (published, H200)" if "pub" not in drawn else None)
            drawn.add("pub")
        ax.set_yticks(ys)
        ax.set_yticklabels(variants, fontsize=8)
        ax.set_ylabel(row, fontsize=9)
        ax.set_xlim(left=0)
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("ms (kernels: one profiled backward; tick: the replayed backward)")
    handles, labels = [], []
    for ax in axes[:, 0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, fontsize=7, ncol=5, loc="lower center")
    title = args.title or ", ".join(devices)
    axes[0, 0].set_title(wrap(title, 140), fontsize=8)
    save(fig, args.out, rect=(0, 0.55 / height, 1, 1))  # the legend's two rows below
    return 0


if __name__ == "__main__":
    sys.exit(main())
