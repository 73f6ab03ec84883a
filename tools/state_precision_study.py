#!/usr/bin/env python3
"""What the rounding of the state products' operands costs the chunkwise outputs.

A design study for the WY kernels (docs/prefill_notes.md, session 13): the chunkwise algorithm
of SPEC §1 in float64, with every operand of a tensor-core product (the state S in K S and Q S,
the chunk's residual R and X, the record's T and P T) rounded as one arithmetic would round it,
and the outputs rounded to the storage dtype last. Each column is one arithmetic; each entry the
relative RMS of the outputs o (and of the final state) against the float64 tokenwise
recurrence on the same rounded inputs. float64 is ~1e-16: nine digits below the smallest effect
measured here, so it serves as the reference (the GPU accuracy test uses MPFR).

The inputs follow tests/cuda/test_accuracy.cpp (T = 2048, K = V = 128, key norms log-uniform in
[1e-3, 1e1], eta in [0.5, 1] with 20% at 1, scale K^-1/2) and the precision report's stress
families (tools/kla_report.cpp §6), each with the accuracy test's decays (alpha in [e^-0.1, 1])
and without decay (alpha = 1), where the state carries the most of o.

Below each dtype's table, the FAST contract of issue 26 in this model: each arithmetic's largest
ratio to FLA's (the last column) over the inputs, <= 1 where it never errs more than FLA's. The
one-part columns round to bf16 for fp16 storage too: harsher than FLA's fp16 (one fp16 part) and
than the fp16 FAST kernel (one fp16 part, each value column scaled into range); the precision
report's arithmetic models (tools/report/arith_models.cpp) round fp16 as those do.

    python3 tools/state_precision_study.py [--T 2048] [--seed 7] [--fp32] [--out table.md]

--fp32 asks the same of fp32 storage (round 2, session 9): which operands the WY path would need
at 24 bits (three bf16 parts) for the fp32 ACCURATE target (1e-5), its K and Q included.

Needs numpy. Prints a progress line per case on stderr and the markdown tables on stdout.
"""
import argparse
import sys

import numpy as np


def bf16(x):
    """Round to bf16 (nearest, ties to even) through fp32."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32).astype(np.float64)


def fp16(x):
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float64)


def fp32(x):
    return np.asarray(x, np.float32).astype(np.float64)


def to_dtype(x, dt):
    return bf16(x) if dt == "bf16" else fp16(x) if dt == "fp16" else fp32(x)


def fp16_scaled(x, axis):
    """fp16 after a power-of-two scale per row / column (axis: the one the scale spans) that
    takes its largest magnitude into [2^14, 2^15) (the kernels' fp16_range_scale)."""
    m = np.max(np.abs(x), axis=axis, keepdims=True)
    s = np.exp2(14 - np.floor(np.log2(np.where(m > 0, m, 1.0))))
    with np.errstate(over="ignore"):
        return fp16(x * s) / s


def operand(x, mode, axis):
    """An fp32 operand as the tensor cores see it under one rounding mode ("exact": unrounded,
    for tests of the chunk algebra)."""
    if mode == "exact":
        return x
    x = fp32(x)
    if mode == "bf16 hi+lo":  # two bf16 parts (the lo·lo product is ~2^-18: left in)
        hi = bf16(x)
        return hi + bf16(x - hi)
    if mode == "bf16":
        return bf16(x)
    if mode == "bf16 x3":  # three bf16 parts: 24 significant bits, an fp32 value's own
        hi = bf16(x)
        mid = bf16(fp32(x - hi))
        return hi + mid + bf16(fp32(x - hi - mid))
    if mode == "fp16 scaled":
        return fp16_scaled(x, axis)
    if mode == "fp16 hi+lo scaled":
        hi = fp16_scaled(x, axis)
        return hi + fp16_scaled(x - hi, axis)
    raise ValueError(mode)


# Arithmetic: (name, S in K S and Q S, X in the update, R and T / P T in the within-chunk products).
ARITHMETICS = [
    ("WY bf16 today", "bf16 hi+lo", "bf16 hi+lo", "bf16 hi+lo"),
    ("fp16 transposed scan", "fp16 hi+lo scaled", "fp16 hi+lo scaled", "bf16 hi+lo"),
    ("S one bf16 part", "bf16", "bf16 hi+lo", "bf16 hi+lo"),
    ("S one fp16 part, scaled", "fp16 scaled", "bf16 hi+lo", "bf16 hi+lo"),
    ("S and X one bf16 part", "bf16", "bf16", "bf16 hi+lo"),
    ("S, R, T / P T one bf16 part", "bf16", "bf16 hi+lo", "bf16"),
    ("all one bf16 part (FLA's)", "bf16", "bf16", "bf16"),  # last: the FAST contract's bar
]
# fp32 storage (--fp32): (name, S, X, R and T / P T, K and Q). The first is the WY path's fp32
# arithmetic (FAST: K and Q as the prep's bf16 hi + lo images); the others ask which operands an
# fp32 ACCURATE on that path (1e-5) would need at 24 bits (three bf16 parts).
FP32_ARITHMETICS = [
    ("WY fp32 today (FAST)", "bf16 hi+lo", "bf16 hi+lo", "bf16 hi+lo", "bf16 hi+lo"),
    ("K, Q 24 bits", "bf16 hi+lo", "bf16 hi+lo", "bf16 hi+lo", "bf16 x3"),
    ("K, Q, R, T 24 bits", "bf16 hi+lo", "bf16 hi+lo", "bf16 x3", "bf16 x3"),
    ("all but X 24 bits", "bf16 x3", "bf16 hi+lo", "bf16 x3", "bf16 x3"),
    ("every operand 24 bits", "bf16 x3", "bf16 x3", "bf16 x3", "bf16 x3"),
]
STRESSES = ["accuracy test", "exact projection", "repeated keys", "colinear keys",
            "nearly colinear keys", "zero keys, eps = 0", "value outliers"]


def draw(T, K, V, dt, seed, stress, decay):
    r = np.random.default_rng(seed)
    knorm = (1e-3, 1e1) if stress == "accuracy test" else (0.5, 2.0)
    k = r.standard_normal((T, K))
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    k *= np.exp(np.log(knorm[0]) + np.log(knorm[1] / knorm[0]) * r.random((T, 1)))
    q = r.standard_normal((T, K))
    v = r.standard_normal((T, V))
    g = -decay * r.random(T)
    eta = np.where(r.random(T) < 0.2, 1.0, 0.5 + 0.5 * r.random(T))
    eps = 1e-6
    if stress == "accuracy test":
        eps = 0.0
    elif stress == "exact projection":
        eta[:], eps = 1.0, 0.0
    elif stress == "repeated keys":
        k = k[(np.arange(T) // 16) * 16]
    elif stress == "colinear keys":
        c = r.uniform(0.5, 2, T) * np.where(r.random(T) < 0.5, -1, 1)
        k = c[:, None] * k[0][None, :]
    elif stress == "nearly colinear keys":
        k[1:] = k[0] * (1 + 1e-3 * r.standard_normal((T - 1, K))) + 1e-3 * r.standard_normal(
            (T - 1, K))
    elif stress == "zero keys, eps = 0":
        k[r.random(T) < 0.1] = 0.0
        eps = 0.0
    elif stress == "value outliers":
        v[r.random(T) < 0.01] *= 1e3
    return dict(q=to_dtype(q, dt) * K**-0.5, k=to_dtype(k, dt), v=to_dtype(v, dt), g=fp32(g),
                eta=fp32(eta), eps=eps)


def beta(d):
    den = np.sum(d["k"] ** 2, axis=1) + d["eps"]
    return np.where(den > 0, d["eta"] / np.where(den > 0, den, 1.0), 0.0)


def tokenwise(d):
    """The recurrence S_t = a_t S + b_t k_t (v_t - a_t S^T k_t)^T, o_t = S_t^T q_t in float64."""
    q, k, v, g, b = d["q"], d["k"], d["v"], d["g"], beta(d)
    S = np.zeros((k.shape[1], v.shape[1]))
    o = np.empty((k.shape[0], v.shape[1]))
    for t in range(k.shape[0]):
        S *= np.exp(g[t])
        S += b[t] * np.outer(k[t], v[t] - S.T @ k[t])
        o[t] = S.T @ q[t]
    return o, S


def chunked(d, mode_s, mode_x, mode_r, mode_k="exact", C=64):
    """SPEC §1's chunk step with each tensor-core operand rounded; sums and the rest in float64
    (the kernels' fp32 accumulators and scalars are ~2^-24: far below every effect here). mode_k
    rounds K and Q in every product (fp32 storage; 16-bit inputs are exact operands)."""
    q, k, v, g, b = d["q"], d["k"], d["v"], d["g"], beta(d)
    q, k = operand(q, mode_k, 0), operand(k, mode_k, 0)
    T = k.shape[0]
    S = np.zeros((k.shape[1], v.shape[1]))
    o = np.empty((T, v.shape[1]))
    for c0 in range(0, T, C):
        sl = slice(c0, c0 + C)
        Kc, Qc, Vc, Bc = k[sl], q[sl], v[sl], b[sl]
        lg = np.cumsum(g[sl])
        gam = np.exp(lg)
        dec = np.exp(lg[:, None] - lg[None, :])  # gamma_t / gamma_j
        L = np.tril(dec * (Kc @ Kc.T) * Bc[None, :], -1)
        Tm = np.linalg.inv(np.eye(len(Bc)) + L)
        P = np.tril(dec * (Qc @ Kc.T) * Bc[None, :])
        if mode_s != "exact":
            S = fp32(S)  # the state lives in fp32 accumulators
        Sop = operand(S, mode_s, 0)  # one scale per value column
        R = operand(Tm, mode_r, 1) @ operand(Vc - gam[:, None] * (Kc @ Sop), mode_r, 0)
        o[sl] = gam[:, None] * (Qc @ Sop) + operand(P, mode_r, 1) @ operand(R, mode_r, 0)
        X = (Bc * np.exp(lg[-1] - lg))[:, None] * R
        S = gam[-1] * S + Kc.T @ operand(X, mode_x, 0)
    return o, S


def rel_rms(x, ref):
    return np.linalg.norm(x - ref) / np.linalg.norm(ref)


def fp32_table(T, seed, target=1e-5):
    """The --fp32 table: o rel-RMS (final state in parentheses) of each FP32_ARITHMETICS column
    on every input set, bold above the target, and each column's worst."""
    lines = [f"### fp32 storage (ACCURATE target {target:g}): o rel-RMS, final state rel-RMS in "
             f"parentheses; T = {T}, K = V = 128", "",
             "| inputs | alpha | " + " | ".join(x[0] for x in FP32_ARITHMETICS) + " |",
             "|---|---" + "|---" * len(FP32_ARITHMETICS) + "|"]
    worst = [0.0] * len(FP32_ARITHMETICS)
    for stress in STRESSES:
        for decay, alpha in ((0.1, "[e^-0.1, 1]"), (0.0, "1")):
            print(f"state_precision_study: fp32 {stress}, alpha {alpha}", file=sys.stderr,
                  flush=True)
            d = draw(T, 128, 128, "fp32", seed, stress, decay)
            o_ref, s_ref = tokenwise(d)
            cells = []
            for i, (_, ms, mx, mr, mk) in enumerate(FP32_ARITHMETICS):
                o, s = chunked(d, ms, mx, mr, mk)
                e = rel_rms(fp32(o), o_ref)
                worst[i] = max(worst[i], e)
                mark = "**" if e > target else ""
                cells.append(f"{mark}{e:.2e}{mark} ({rel_rms(s, s_ref):.0e})")
            lines.append(f"| {stress} | {alpha} | " + " | ".join(cells) + " |")
    lines += ["", "Bold: above the target.", "", "Each column's worst o rel-RMS over the inputs:",
              "", "| " + " | ".join(x[0] for x in FP32_ARITHMETICS) + " |",
              "|---" * len(FP32_ARITHMETICS) + "|",
              "| " + " | ".join(f"{w:.2e}" for w in worst) + " |", ""]
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--T", type=int, default=2048, help="tokens (default 2048)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", help="also write the tables to this file")
    ap.add_argument("--fp32", action="store_true",
                    help="fp32 storage instead: which operands an fp32 ACCURATE (1e-5) on the WY "
                         "path needs at 24 bits")
    a = ap.parse_args()
    if a.T < 1:
        sys.exit("state_precision_study: --T must be positive")
    stresses = STRESSES
    lines = fp32_table(a.T, a.seed) if a.fp32 else []
    for dt, target in () if a.fp32 else (("bf16", 2e-3), ("fp16", 3e-4)):
        lines += [f"### {dt} storage (target {target:g}): o rel-RMS, final state rel-RMS in "
                  f"parentheses; T = {a.T}, K = V = 128", "",
                  "| inputs | alpha | " + " | ".join(x[0] for x in ARITHMETICS) + " |",
                  "|---|---" + "|---" * len(ARITHMETICS) + "|"]
        worst = [0.0] * len(ARITHMETICS)  # the largest ratio to FLA's arithmetic, over inputs
        for stress in stresses:
            for decay, alpha in ((0.1, "[e^-0.1, 1]"), (0.0, "1")):
                print(f"state_precision_study: {dt} {stress}, alpha {alpha}", file=sys.stderr,
                      flush=True)
                d = draw(a.T, 128, 128, dt, a.seed, stress, decay)
                o_ref, s_ref = tokenwise(d)
                cells, errs = [], []
                for _, ms, mx, mr in ARITHMETICS:
                    o, s = chunked(d, ms, mx, mr)
                    e = rel_rms(to_dtype(o, dt), o_ref)
                    errs.append(e)
                    mark = "**" if e > target else ""
                    cells.append(f"{mark}{e:.2e}{mark} ({rel_rms(s, s_ref):.0e})")
                worst = [max(w, e / errs[-1]) for w, e in zip(worst, errs)]
                lines.append(f"| {stress} | {alpha} | " + " | ".join(cells) + " |")
        lines += ["", "Bold: above the target.", "",
                  "The FAST contract in this model (issue 26: no larger than FLA's error on the "
                  "same inputs): each arithmetic's largest ratio to the last column's error over "
                  "the inputs above (<= 1 meets it):", "",
                  "| " + " | ".join(x[0] for x in ARITHMETICS) + " |",
                  "|---" * len(ARITHMETICS) + "|",
                  "| " + " | ".join(f"{w:.2f}" for w in worst) + " |"]
        lines.append("")
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
