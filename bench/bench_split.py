"""The sequence split (kla_params.segments; docs/architecture.md, 'Sequence split') beside one pass
and FLA, on the peers' recipe inputs, replayed from CUDA graphs (kernel to kernel).

    PYTHONPATH=python KLA_CUDA_LIBRARY=... python3 bench/bench_split.py --out DIR [--no-fla]
    (KLA_SPLIT_ROWS=n: only the first n rows, a smoke run)

Rows: few sequences x value heads (where the plan splits: N x HV <= 4, e.g. a Qwen3-Next-style
layer's 16 / 32 heads under 8-way tensor parallelism is 2 / 4 a GPU) and two of issue 26's rows
(where it does not: a forced split there shows why). Per row: the plan's own call ('auto', its
plan and segments), one pass (segments = 1), forced splits, and FLA's chunk_gated_delta_rule on the
same tensors (its beta = our eta: with l2-normalised keys the Kaczmarz coefficient is eta / (1 +
eps)); bf16, K = V = 128, l2-normalised q and k in the kernel, g = logsigmoid(randn) / 16 with a
quarter of the value heads undecayed, an initial state in and the final state out. Writes
split.json (every number), split.md (the table) and split.png (the plot).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

try:  # --plot needs matplotlib alone (the GPU machine has torch, this one matplotlib)
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import kla  # noqa: E402
except ImportError:
    torch = F = kla = None
from side_by_side import build_info_beside, capture_graph  # noqa: E402 (one definition each)

K = V = 128
EPS = 1e-6
ROWS = [  # label, sequence lengths, H, HV, forced segment counts (ACCURATE)
    ("1x32768, 1/1", [32768], 1, 1, (4, 8)),
    ("1x131072, 1/2", [131072], 1, 2, (8,)),
    ("1x32768, 2/4", [32768], 2, 4, (8,)),
    ("1x131072, 2/4", [131072], 2, 4, (16,)),
    ("2x32768, 2/4", [32768] * 2, 2, 4, (4,)),
    ("1x131072, 8/8", [131072], 8, 8, (8,)),
]


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def median_ms(fn, reps=15):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(reps)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev)


def graph_ms(fn, calls=3):
    """Median replay time per call of a CUDA graph holding `calls` calls fn(i)."""
    return median_ms(capture_graph(torch, fn, calls, warm_calls=2).replay) / calls


def make(lens, H, HV, dev):
    T, N = sum(lens), len(lens)
    g = F.logsigmoid(torch.randn(1, T, HV, device=dev)) / 16
    g[..., : max(1, HV // 4)] = 0.0
    return {"q": torch.randn(1, T, H, K, device=dev).bfloat16(),
            "k": torch.randn(1, T, H, K, device=dev).bfloat16(),
            "v": torch.randn(1, T, HV, V, device=dev).bfloat16(), "g": g,
            "eta": torch.sigmoid(torch.randn(1, T, HV, device=dev)),
            "h0": 0.1 * torch.randn(N, HV, K, V, device=dev)}


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def run(args):
    dev = torch.device("cuda")
    fla = None
    if not args.no_fla:
        try:
            os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla
        except Exception as e:  # noqa: BLE001
            log(f"FLA not importable ({type(e).__name__}: {e}); its column stays empty")
    rows = []
    first = int(os.environ.get("KLA_SPLIT_ROWS", "0")) or len(ROWS)  # a smoke run: the first rows
    for label, lens, H, HV, forced in ROWS[:first]:
        t0 = time.time()
        sets = [make(lens, H, HV, dev) for _ in range(2)]
        cu_cpu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))])
        cu = cu_cpu.to(dev)
        common = dict(scale=K ** -0.5, output_final_state=True, cu_seqlens=cu,
                      use_qk_l2norm_in_kernel=True)

        def ours(i, segments, arithmetic="accurate"):
            s = sets[i % 2]
            return kla.chunk_kla(s["q"], s["k"], s["v"], s["g"], s["eta"], eps=EPS,
                                 initial_state=s["h0"], cu_seqlens_cpu=cu_cpu,
                                 arithmetic=arithmetic, segments=segments, **common)
        s0 = sets[0]
        r = {"label": label, "lens": lens, "H": H, "HV": HV}
        for arithmetic in ("accurate", "fast"):
            pl = kla.plan(s0["q"], s0["k"], s0["v"], s0["g"], s0["eta"], cu_seqlens=cu,
                          initial_state=s0["h0"], arithmetic=arithmetic)
            one = kla.plan(s0["q"], s0["k"], s0["v"], s0["g"], s0["eta"], cu_seqlens=cu,
                           initial_state=s0["h0"], arithmetic=arithmetic, segments=1)
            a = r.setdefault(arithmetic, {})
            a["auto_plan"] = f"{pl.path}/{pl.value_slice}" + (
                f" x{pl.segments}" if pl.segments > 1 else "")
            a["auto_segments"] = pl.segments
            a["one_plan"] = f"{one.path}/{one.value_slice}"
            a["auto_ms"] = graph_ms(lambda i: ours(i, 0, arithmetic))
            a["one_ms"] = graph_ms(lambda i: ours(i, 1, arithmetic))
            o1, h1 = ours(0, 1, arithmetic)
            oa, ha = ours(0, 0, arithmetic)
            a["auto_vs_one_o"] = rel(oa, o1)
            a["auto_vs_one_state"] = rel(ha, h1)
            for n in forced if arithmetic == "accurate" else ():
                a[f"split{n}_ms"] = graph_ms(lambda i, n=n: ours(i, n, arithmetic))
            a["workspace_auto"] = pl.workspace_bytes
            a["workspace_one"] = one.workspace_bytes
        if fla is not None:
            betas = [s["eta"].bfloat16() for s in sets]
            try:
                r["fla_ms"] = graph_ms(lambda i: fla(sets[i % 2]["q"], sets[i % 2]["k"],
                                                     sets[i % 2]["v"], sets[i % 2]["g"],
                                                     betas[i % 2], initial_state=sets[i % 2]["h0"],
                                                     **common))
            except Exception as e:  # noqa: BLE001
                r["fla_error"] = f"{type(e).__name__}: {e}"[:300]
        rows.append(r)
        acc = r["accurate"]
        log(f"{label}: auto {acc['auto_plan']} {acc['auto_ms']:.3f} ms, one pass "
            f"{acc['one_ms']:.3f}, FLA {r.get('fla_ms', float('nan')):.3f} "
            f"({time.time() - t0:.0f} s)")
        save(args, rows)
    return rows


def meta():
    m = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
         "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "library": kla.library_info()}
    try:
        import fla
        m["fla"] = getattr(fla, "__version__", "?")
    except Exception:  # noqa: BLE001
        m["fla"] = None
    try:
        m["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                                     text=True).stdout.strip()
    except Exception:  # noqa: BLE001
        m["commit"] = None
    # The library's own record of its commit, where it has one (the device's .git can lag).
    m["build"] = build_info_beside(m["library"]["path"])
    m["commit"] = m["build"].get("commit") or m["commit"]
    return m


def table(rows, m):
    out = [f"GPU {m['gpu']}, commit `{m['commit']}`, FLA {m['fla']}, {m['started']}; "
           "`bench/bench_split.py`, CUDA-graph replays, ms per call; ratio = FLA / ours.", "",
           "| B×T, H/HV | arithmetic | plan (auto) | auto | one pass | forced splits | FLA | "
           "auto vs one pass | auto vs FLA | o: auto vs one pass |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for ar in ("accurate", "fast"):
            a = r[ar]
            forced = ", ".join(f"{k[5:-3]}: {v:.3f}" for k, v in a.items()
                               if k.startswith("split") and k.endswith("_ms"))
            fla = r.get("fla_ms")
            fla_cell = "" if fla is None else f"{fla:.3f}"
            ratio_cell = "" if fla is None else f"{fla / a['auto_ms']:.2f}×"
            out.append(
                f"| {r['label']} | {ar} | {a['auto_plan']} | {a['auto_ms']:.3f} | "
                f"{a['one_ms']:.3f} | {forced} | {fla_cell} | "
                f"{a['one_ms'] / a['auto_ms']:.2f}× | "
                f"{ratio_cell} | "
                f"{a['auto_vs_one_o']:.1e} |")
    return "\n".join(out) + "\n"


def save(args, rows):
    m = meta()
    with open(os.path.join(args.out, "split.json"), "w") as f:
        json.dump({"meta": m, "rows": rows}, f, indent=1)
    with open(os.path.join(args.out, "split.md"), "w") as f:
        f.write(table(rows, m))


def plot(path_json, path_png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    with open(path_json) as f:
        d = json.load(f)
    rows, m = d["rows"], d["meta"]
    labels = [r["label"] for r in rows]
    x = range(len(rows))
    w = 0.27
    fig, ax = plt.subplots(figsize=(11, 4.2))
    one = [r["accurate"]["one_ms"] for r in rows]
    auto = [r["accurate"]["auto_ms"] for r in rows]
    fla = [r.get("fla_ms") or 0 for r in rows]
    ax.bar([i - w for i in x], one, w, label="kla, one pass (segments = 1)")
    ax.bar(list(x), auto, w, label="kla, the plan's choice (split where it pays)")
    ax.bar([i + w for i in x], fla, w, label="FLA chunk_gated_delta_rule")
    for i, r in enumerate(rows):
        n = r["accurate"]["auto_segments"]
        if n > 1:
            ax.text(i, auto[i], f"×{n}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, rotation=20, fontsize=8)
    ax.set_ylabel("ms per call (CUDA-graph replay)")
    ax.set_title(f"Sequence split, bf16 ACCURATE, K = V = 128 ({m['gpu']}, "
                 f"{(m['commit'] or '?')[:7]})", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path_png, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--plot", metavar="SPLIT_JSON", help="only draw split.png from a split.json")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.plot:
        plot(args.plot, os.path.join(args.out, "split.png"))
        return
    rows = run(args)
    save(args, rows)
    try:
        plot(os.path.join(args.out, "split.json"), os.path.join(args.out, "split.png"))
    except Exception as e:  # noqa: BLE001  (no matplotlib on the GPU machine: plot here later)
        log(f"no plot: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
