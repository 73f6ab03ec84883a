#!/usr/bin/env python3
"""Plots of the KLA precision report. Reads the CSV files kla_report wrote into DIR and writes
the PNGs report.md links to. Needs matplotlib (Debian: python3-matplotlib); kla_report calls it
with /usr/bin/python3 and notes any failure in the report. Usage: plot_report.py DIR"""
import csv
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.colors as mcolors  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

d = sys.argv[1]
VARIANT_COLORS = {"fp32": "tab:blue", "bf16-emul": "tab:red", "bf16-store": "tab:orange",
                  "fp16-emul": "tab:purple", "fp16-store": "tab:green",
                  # the CUDA kernels' columns (GPU report)
                  "cuda-fp32": "tab:cyan", "cuda-bf16": "tab:brown", "cuda-fp16": "tab:olive",
                  # the models of the kernels' tensor-core arithmetics (arith_models.cpp)
                  "bf16-fast-model": "gold", "bf16-onepart-model": "tab:pink",
                  "fp16-fast-model": "yellowgreen", "fp16-onepart-model": "tab:gray"}


def marker(v):
    """Squares for the CUDA kernels' columns, triangles for the arithmetic models, dots for the
    CPU reference columns."""
    return "s" if v.startswith("cuda-") else "^" if v.endswith("-model") else "o"


def rows(name):
    with open(os.path.join(d, name), newline="") as f:
        return list(csv.DictReader(f))


def ordered(values, key=None):
    seen = []
    for v in values:
        if v not in seen:
            seen.append(v)
    return sorted(seen, key=key) if key else seen


def save(fig, name):
    fig.savefig(os.path.join(d, name), dpi=110, bbox_inches="tight")
    plt.close(fig)
    print("wrote", name)


def fmt_num(x):
    return "0" if x == 0 else f"{x:g}"


# ---- §2 heat maps: rows = algorithm, columns = variant -----------------------------------------
r2 = rows("sec2_eps_knorm.csv")
variants = ordered(r["variant"] for r in r2)
algos = ordered(r["algo"] for r in r2)
epss = ordered((float(r["eps"]) for r in r2), key=float)
kns = ordered((float(r["knorm"]) for r in r2), key=float)
cell = {(r["variant"], r["algo"], float(r["eps"]), float(r["knorm"])): r for r in r2}
vals = [float(r["rel_err"]) for r in r2 if math.isfinite(float(r["rel_err"])) and float(r["rel_err"]) > 0]
vmin = max(min(vals), 1e-12) if vals else 1e-8
vmax = max(max(vals), vmin * 10) if vals else 1
norm = mcolors.LogNorm(vmin=vmin, vmax=vmax)
fig, axes = plt.subplots(len(algos), len(variants), figsize=(3.1 * len(variants), 2.9 * len(algos)),
                         squeeze=False, constrained_layout=True)
cmap = plt.get_cmap("viridis").copy()
for ai, a in enumerate(algos):
    for vi, v in enumerate(variants):
        ax = axes[ai][vi]
        if (v, a, epss[0], kns[0]) not in cell:  # a column that does not run this algorithm
            ax.axis("off")
            ax.text(0.5, 0.5, f"{v}\n{a}\nn/a", ha="center", va="center", fontsize=8.5,
                    color="0.5", transform=ax.transAxes)
            continue
        grid = []
        for e in epss:
            line = []
            for k in kns:
                x = float(cell[(v, a, e, k)]["rel_err"])
                line.append(x if math.isfinite(x) and x > 0 else float("nan"))
            grid.append(line)
        im = ax.imshow(grid, origin="lower", cmap=cmap, norm=norm, aspect="auto")
        for ei, e in enumerate(epss):
            for ki, k in enumerate(kns):
                r = cell[(v, a, e, k)]
                if int(r["nonfinite"]) > 0:
                    ax.add_patch(plt.Rectangle((ki - 0.5, ei - 0.5), 1, 1, color="black"))
                    ax.text(ki, ei, "NaN", ha="center", va="center", color="white", fontsize=6.5)
                else:
                    x = float(r["rel_err"])
                    ax.text(ki, ei, f"{x:.0e}".replace("e-0", "e-").replace("e+0", "e"), ha="center",
                            va="center", fontsize=5.5,
                            color="white" if norm(max(x, vmin)) < 0.5 else "black")
        ax.set_xticks(range(len(kns)), [fmt_num(k) for k in kns], fontsize=7, rotation=45)
        ax.set_yticks(range(len(epss)), [fmt_num(e) for e in epss], fontsize=7)
        ax.set_title(f"{v}\n{a}", fontsize=8.5)
        if vi == 0:
            ax.set_ylabel("eps")
        if ai == len(algos) - 1:
            ax.set_xlabel("|k|")
fig.colorbar(im, ax=axes, shrink=0.6, label="relative RMS output error (black: NaN/Inf)")
fig.suptitle("Section 2: error over eps x key norm, per column (dtype) and algorithm")
save(fig, "sec2_heatmap.png")

# ---- §3 interpolation defect against key norm, one panel per eps -------------------------------
r3 = [r for r in rows("sec3_defect.csv") if r["variant"] != "exact"]
epss3 = ordered((float(r["eps"]) for r in r3), key=float)
ncol = min(4, len(epss3))
nrow = math.ceil(len(epss3) / ncol)
fig, axes = plt.subplots(nrow, ncol, figsize=(3.6 * ncol, 3.0 * nrow), squeeze=False,
                         sharex=True, sharey=True, constrained_layout=True)
floor = 1e-10
for i, e in enumerate(epss3):
    ax = axes[i // ncol][i % ncol]
    for v in ordered(r["variant"] for r in r3):
        pts = sorted((float(r["knorm"]), float(r["max_defect"])) for r in r3
                     if r["variant"] == v and float(r["eps"]) == e)
        xs = [p[0] for p in pts]
        ys = [p[1] if math.isfinite(p[1]) else float("nan") for p in pts]
        ys = [max(y, floor) if not math.isnan(y) else y for y in ys]
        ax.plot(xs, ys, marker(v) + "-", color=VARIANT_COLORS.get(v), label=v, ms=3, lw=1.2)
        bad = [p[0] for p in pts if not math.isfinite(p[1])]
        if bad:
            ax.plot(bad, [1e2] * len(bad), "x", color=VARIANT_COLORS.get(v), ms=7, mew=2)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(floor / 3, 1e3)
    ax.set_title(f"eps = {fmt_num(e)}", fontsize=9)
    ax.grid(True, which="major", alpha=0.3)
for i in range(len(epss3), nrow * ncol):
    axes[i // ncol][i % ncol].axis("off")
for ax in axes[-1]:
    ax.set_xlabel("|k|")
for row in axes:
    row[0].set_ylabel("max |S_t^T k - formula| / |formula|")
axes[0][0].legend(fontsize=7)
fig.suptitle(f"Section 3: read-back defect (x at 1e2 = NaN/Inf; values below {floor:g} drawn at {floor:g})")
save(fig, "sec3_defect.png")

# ---- §4 error vs length, one panel per decay ---------------------------------------------------
r4 = rows("sec4_length.csv")
decays = ordered(r["decay"] for r in r4)
fig, axes = plt.subplots(1, len(decays), figsize=(4.6 * len(decays), 4.8), sharey=True,
                         squeeze=False, constrained_layout=True)
Ts_all = sorted({int(r["T"]) for r in r4})
us = sorted({float(r["unit_roundoff"]) for r in r4})
for di, dec in enumerate(decays):
    ax = axes[0][di]
    for v in ordered(r["variant"] for r in r4):
        for a, style in (("tokenwise/raw", "-"), ("chunk64/raw", "--")):
            pts = sorted((int(r["T"]), float(r["rel_err"])) for r in r4
                         if r["variant"] == v and r["algo"] == a and r["decay"] == dec)
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [p[1] if math.isfinite(p[1]) else float("nan") for p in pts],
                    style, marker=marker(v), ms=3, color=VARIANT_COLORS.get(v),
                    label=f"{v} {a.split('/')[0]}")
    for u, c in zip(us, ("0.55", "0.75")):
        ax.plot(Ts_all, [math.sqrt(T) * u for T in Ts_all], ":", color="black", lw=1)
        ax.plot(Ts_all, [T * u for T in Ts_all], "-.", color="black", lw=1)
        ax.annotate(f"sqrt(T) u, u={u:.0e}", (Ts_all[-1], math.sqrt(Ts_all[-1]) * u), fontsize=6.5,
                    ha="right", va="bottom")
        ax.annotate(f"T u, u={u:.0e}", (Ts_all[-1], Ts_all[-1] * u), fontsize=6.5, ha="right",
                    va="bottom")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_title(f"decay: {dec}", fontsize=10)
    ax.set_xlabel("sequence length T")
    ax.grid(True, which="major", alpha=0.3)
axes[0][0].set_ylabel("relative RMS output error")
handles, labels = axes[0][0].get_legend_handles_labels()
fig.legend(handles, labels, fontsize=7.5, ncol=5, loc="upper center", bbox_to_anchor=(0.5, 0.0))
fig.suptitle("Section 4: error against length (solid: tokenwise, dashed: chunkwise C=64; "
             "dotted: sqrt(T)u, dash-dot: Tu)")
save(fig, "sec4_length.png")

# ---- §5 forms: grouped bars per family ----------------------------------------------------------
r5 = rows("sec5_forms.csv")
fams = ordered(r["family"] for r in r5)
orders = ordered((r["order"], int(r["chunk"])) for r in r5)
fig, axes = plt.subplots(len(fams), 1, figsize=(11, 3.2 * len(fams)), squeeze=False,
                         constrained_layout=True)
vs5 = ordered(r["variant"] for r in r5)
for fi, fam in enumerate(fams):
    ax = axes[fi][0]
    width = 0.8 / (2 * len(orders))
    for vi, v in enumerate(vs5):
        for oi, (o, c) in enumerate(orders):
            for form_i, form in enumerate(("raw", "normalized")):
                rr = [r for r in r5 if r["family"] == fam and r["variant"] == v and r["order"] == o
                      and int(r["chunk"]) == c and r["form"] == form]
                if not rr:
                    continue
                x = vi + (oi * 2 + form_i) * width - 0.4 + width / 2
                y = float(rr[0]["rel_err"])
                hatch = "//" if form == "normalized" else None
                alpha = 0.45 + 0.55 * (oi + 1) / len(orders)
                if math.isfinite(y):
                    ax.bar(x, y, width, color=VARIANT_COLORS.get(v), alpha=alpha, hatch=hatch,
                           edgecolor="black", lw=0.3)
                else:
                    ax.text(x, 1, "NaN", rotation=90, fontsize=6, ha="center")
    ax.set_yscale("log")
    ax.set_xticks(range(len(vs5)), vs5)
    ax.set_ylabel("relative RMS error")
    ax.set_title(f"keys: {fam}   (bars per column, left to right: "
                 + ", ".join(("tokenwise" if o == "tokenwise" else f"C={c}") for o, c in orders)
                 + "; plain = raw, hatched = normalised)", fontsize=8.5)
    ax.grid(True, axis="y", alpha=0.3)
fig.suptitle("Section 5: raw vs normalised-key form, tokenwise vs chunkwise")
save(fig, "sec5_forms.png")

# ---- §6 stress: heat map of cases x (variant, algo) --------------------------------------------
r6 = rows("sec6_stress.csv")
cases = ordered(r["case"] for r in r6)
cols = ordered((r["variant"], r["algo"]) for r in r6)
g6 = {(r["case"], r["variant"], r["algo"]): r for r in r6}
fig, ax = plt.subplots(figsize=(1.0 + 0.62 * len(cols), 0.9 + 0.42 * len(cases)),
                       constrained_layout=True)
vals6 = [float(r["rel_err"]) for r in r6 if math.isfinite(float(r["rel_err"])) and float(r["rel_err"]) > 0]
n6 = mcolors.LogNorm(vmin=max(min(vals6), 1e-12), vmax=max(max(vals6), 1e-6)) if vals6 else None
grid = [[(lambda x: x if math.isfinite(x) and x > 0 else float("nan"))(float(g6[(c, v, a)]["rel_err"]))
         for v, a in cols] for c in cases]
im = ax.imshow(grid, cmap=cmap, norm=n6, aspect="auto")
for ci, c in enumerate(cases):
    for j, (v, a) in enumerate(cols):
        r = g6[(c, v, a)]
        if int(r["nonfinite"]) > 0:
            ax.add_patch(plt.Rectangle((j - 0.5, ci - 0.5), 1, 1, color="black"))
            ax.text(j, ci, "NaN", ha="center", va="center", color="white", fontsize=6)
        else:
            x = float(r["rel_err"])
            ax.text(j, ci, f"{x:.0e}".replace("e-0", "e-").replace("e+0", "e"), ha="center",
                    va="center", fontsize=5.5,
                    color="white" if n6 and n6(max(x, n6.vmin)) < 0.5 else "black")
ax.set_yticks(range(len(cases)), cases, fontsize=7.5)
ax.set_xticks(range(len(cols)), [f"{v}\n{a.replace('/', ' ')}" for v, a in cols], fontsize=6,
              rotation=90)
fig.colorbar(im, ax=ax, label="relative RMS output error (black: NaN/Inf)")
ax.set_title("Section 6: stress inputs")
save(fig, "sec6_stress.png")

# ---- §7 contraction failures: bars per eta ------------------------------------------------------
r7 = rows("sec7_contraction.csv")
etas = ordered((float(r["eta"]) for r in r7), key=float)
vs7 = ordered(r["variant"] for r in r7)
fig, ax = plt.subplots(figsize=(9, 3.8), constrained_layout=True)
width = 0.8 / len(vs7)
for vi, v in enumerate(vs7):
    ys = []
    for e in etas:
        rr = [r for r in r7 if r["variant"] == v and float(r["eta"]) == e]
        tok = sum(int(r["tokens"]) for r in rr)
        ys.append(100.0 * sum(int(r["not_decreased"]) for r in rr) / max(tok, 1))
    ax.bar([i + vi * width - 0.4 + width / 2 for i in range(len(etas))], ys, width,
           color=VARIANT_COLORS.get(v), label=v)
ax.set_xticks(range(len(etas)), [f"eta={fmt_num(e)}" for e in etas])
ax.set_ylabel("% of tokens with L(S_t) >= L(S~) > 0")
ax.legend(fontsize=8)
ax.grid(True, axis="y", alpha=0.3)
ax.set_title("Section 7: tokens whose loss failed to decrease (Prop. 2: never, in exact arithmetic)")
save(fig, "sec7_contraction.png")
