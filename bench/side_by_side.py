#!/usr/bin/env python3
"""Ours vs flash-linear-attention (FLA), same inputs, one run (issue 6; docs/performance.md).

Ours: libkla_cuda.so through the Python package's low-level binding (kla.lowlevel) (kla_chunk_forward for
prefill, kla_tokenwise_forward for decode). Theirs: FLA's Triton kernels chunk_gated_delta_rule
and fused_recurrent_gated_delta_rule with the KLA coefficient beta = eta / (|k|^2 + eps) computed
in PyTorch (fp32, from the rounded keys) and passed as FLA's beta, use_qk_l2norm_in_kernel=False
and the same scale K^-1/2. Both see the same tensors.

Timing: CUDA events, warm-up first (FLA's autotuning and compilation happen there), median of
many calls. Prefill: calls enqueued back to back from Python, one event pair per call. Decode:
a captured CUDA graph of many calls (both libraries), median replay time per call; plain calls
from Python are reported too. Inputs rotate among buffer sets totalling more than 2.2x L2.
"FLA" is the FLA kernel alone (beta precomputed); "FLA+beta" adds computing beta in PyTorch,
which a user of FLA must do to get KLA. Ratio = FLA time / our time (> 1: ours is faster).

Floors: the fewest bytes at the copy rate measured in this run (a 1 GiB device copy, bytes read
+ written). Prefill reads q, k, v, writes o in the dtype and reads g, eta in fp32 (1032 B per
head-token in bf16 at K = V = 128); decode adds the fp32 state, read and written.

Checks: for every timed prefill shape, the relative RMS between our output and FLA's; for a small
case per dtype (B=1, T=2048, H=16, K=V=128) our chunk and tokenwise outputs and FLA's chunk and
recurrent outputs against a float64 recurrence in PyTorch on the same rounded inputs.

    python3 bench/side_by_side.py --lib DIR/libkla_cuda.so --out OUTDIR [--budget SECONDS]
    python3 bench/side_by_side.py --plot OUTDIR      # PNGs from OUTDIR/side_by_side.json

Results are (re)written to OUTDIR/side_by_side.json and .csv after every case, so a run cut
short by its time limit keeps what it measured. Needs torch, triton and fla (fla-core).
"""
import argparse
import csv
import json
import math
import os
import re
import statistics
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

EPS = 1e-6
PREFILL = [  # (B, T, H, K, V)
    (1, 32768, 16, 128, 128),
    (4, 8192, 16, 128, 128),
    (1, 131072, 8, 128, 128),
    (8, 4096, 16, 128, 128),
    (1, 32768, 12, 96, 192),  # the paper's model shape
]
SWEEP_T = [2048, 4096, 8192, 16384, 32768, 65536, 131072]  # bf16, B=1, H=16, K=V=128
# The peers' benchmark inputs (FlashQLA's and FlashInfer's tables, issue 26), K = V = 128:
# sequences packed with cu_seqlens ("8x4096" is eight packed sequences), an initial state in and
# the final state out, q and k l2-normalised in the kernel, g = logsigmoid(randn) / 16 with a
# quarter of the value heads undecayed, beta = sigmoid(randn). (label, lengths, H, HV); lengths
# None: RECIPE_VARLEN's random lengths.
RECIPE = [
    ("1x32768", [32768], 16, 16),
    ("4x8192", [8192] * 4, 16, 16),
    ("8x4096", [4096] * 8, 16, 16),
    ("1x32768", [32768], 16, 32),
    ("8x4096", [4096] * 8, 16, 32),
    ("1x131072", [131072], 8, 8),
    ("1x2048", [2048], 16, 16),
    ("1x4096", [4096], 16, 16),
    ("32 short (varlen)", None, 16, 16),
]
RECIPE_VARLEN = (32, 16384)  # sequences, total tokens: random lengths (at least 64 each)
DECODE_B = [1, 8, 64, 256]  # H=16, K=V=128, one token


def log(*a):
    print(*a, flush=True)


def plan_label(plan):
    """'path/slice', and ' FAST' where the kernels run the FAST arithmetic."""
    fast = " FAST" if plan["arithmetic"] == "fast" else ""
    return f"{plan['path']}/{plan['value_slice']}{fast}"


def floor_bytes(head_tokens, H, HV, K, V, es, states=0):
    """The fewest bytes of a call (the module docstring's floors): q, k read and o, v read /
    written once in the dtype (es bytes), g and eta in fp32, per token of H key heads / HV value
    heads; plus `states` fp32 [K, V] states read and written."""
    return head_tokens * (H * 2 * K * es + HV * (2 * V * es + 8)) + states * K * V * 4 * 2


def device_copy_bps(torch, device, median_ms, n=1 << 30):
    """Bytes read + written per second of an n-byte device copy (1 GiB by default): the rate of
    the floors here and in bench_backward.py. median_ms(fn) times calls fn() and returns the
    median ms of one."""
    a = torch.randint(0, 255, (n,), dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    return 2.0 * n / (median_ms(lambda: b.copy_(a)) * 1e-3)


def capture_graph(torch, fn, calls, warm_calls):
    """A CUDA graph of fn(0) .. fn(calls - 1), captured after warm_calls eager calls on a side
    stream (allocations, compilation and autotuning happen there, outside the capture). Replayed,
    it times the calls kernel to kernel (bench/bench_split.py uses it too)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(warm_calls):
            fn(i)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, capture_error_mode="thread_local"):
        for i in range(calls):
            fn(i)
    return g


def rel_rms(a, b):
    a = a.double()
    b = b.double()
    den = b.square().mean().sqrt().item()
    return (a - b).square().mean().sqrt().item() / den if den > 0 else float("nan")


class Runner:
    def __init__(self, args):
        import torch
        import triton
        import kla.lowlevel as kc  # the package's checked binding (docs/python.md)
        os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")  # plain Triton kernels
        import fla
        from fla.ops.gated_delta_rule import (chunk_gated_delta_rule,
                                              fused_recurrent_gated_delta_rule)
        self.torch, self.kc = torch, kc
        self.fla_chunk, self.fla_rec = chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
        self.args = args
        self.t0 = time.time()
        self.budget = args.budget
        self.lib = kc.KlaLibrary(args.lib)
        # The package's own calls (kla.chunk_kla, the recipe rows) load the same library.
        os.environ["KLA_CUDA_LIBRARY"] = os.path.abspath(args.lib)
        self.dev = torch.device("cuda")
        # "... fast": kla_params.arithmetic = FAST (ours only; FLA runs its one arithmetic).
        self.dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
                       "fp32 fast": torch.float32, "bf16 fast": torch.bfloat16,
                       "fp16 fast": torch.float16}
        prop = torch.cuda.get_device_properties(0)
        self.l2 = int(getattr(prop, "L2_cache_size", 50 << 20))
        self.beta_dtype_note = None
        info = build_info_beside(args.lib)
        self.res = {
            "meta": {
                "gpu": torch.cuda.get_device_name(0),
                "sms": prop.multi_processor_count,
                "l2_bytes": self.l2,
                "torch": torch.__version__,
                "triton": triton.__version__,
                "fla": getattr(fla, "__version__", "?"),
                "kla_version": self.lib.version,
                "build": info,
                "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                "budget_s": self.budget,
                "eps": EPS,
            },
            "accuracy": [], "prefill": [], "decode": [], "skipped": [], "errors": [],
        }
        self.fatal = False

    # ---- bookkeeping ------------------------------------------------------------------------
    def left(self):
        return self.budget - (time.time() - self.t0)

    def save(self):
        out = self.args.out
        with open(os.path.join(out, "side_by_side.json"), "w") as f:
            json.dump(self.res, f, indent=1)
        rows = []
        for r in self.res["prefill"]:
            rows.append(["prefill", r["dtype"], f'{r["B"]}x{r["T"]}x{r["H"]} K{r["K"]} V{r["V"]}',
                         "ms", r.get("ours"), r.get("fla"), r.get("fla_beta"), r.get("ratio"),
                         r.get("floor"), r.get("ours_frac"), r.get("fla_frac"),
                         r.get("rel_rms_ours_fla"), r.get("error", "")])
        for r in self.res["decode"]:
            rows.append(["decode", r["dtype"], f'B{r["B"]} H{r["H"]} K{r["K"]} V{r["V"]}', "us",
                         r.get("ours"), r.get("fla"), r.get("fla_beta"), r.get("ratio"),
                         r.get("floor"), r.get("ours_frac"), r.get("fla_frac"),
                         r.get("rel_rms_ours_fla"), r.get("error", "")])
        with open(os.path.join(out, "side_by_side.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["kind", "dtype", "shape", "unit", "ours", "fla", "fla_with_beta",
                        "ratio_fla_over_ours", "floor", "ours_frac_of_floor",
                        "fla_frac_of_floor", "rel_rms_ours_vs_fla", "error"])
            w.writerows(rows)

    def step(self, name, fn, need=10.0):
        """Runs one case unless the budget is spent or CUDA is broken; records errors."""
        if self.args.only and not re.search(self.args.only, name):
            return
        if self.fatal or self.left() < need:
            self.res["skipped"].append(name + (" (CUDA unusable)" if self.fatal else
                                               " (time budget)"))
            log(f"skip {name}")
            return
        t = time.time()
        try:
            fn()
        except Exception as e:  # keep going with the next case
            msg = f"{name}: {type(e).__name__}: {e}"
            log("ERROR " + msg)
            traceback.print_exc()
            self.res["errors"].append(msg[:2000])
            try:
                self.torch.cuda.synchronize()
            except Exception:
                self.fatal = True
        finally:
            try:
                self.torch.cuda.empty_cache()
            except Exception:
                self.fatal = True
        log(f"  [{name}: {time.time() - t:.1f} s, {self.left():.0f} s left]")
        self.save()

    # ---- measurement helpers ----------------------------------------------------------------
    def copy_rate(self):
        self.copy_bps = device_copy_bps(self.torch, self.dev,
                                        lambda fn: self.median_ms(lambda i: fn(), reps=15))
        self.res["meta"]["copy_TBps"] = self.copy_bps / 1e12
        log(f"copy rate (read + written): {self.copy_bps / 1e12:.3f} TB/s")

    def median_ms(self, fn, reps=None, warmup=3, target_s=0.25):
        """Median over reps of one call fn(i) between a pair of events; calls back to back."""
        torch = self.torch
        for i in range(warmup):
            fn(i)
        torch.cuda.synchronize()
        if reps is None:  # about target_s of timed calls, 5..60 of them
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn(warmup)
            e1.record()
            torch.cuda.synchronize()
            est = max(e0.elapsed_time(e1), 1e-3) * 1e-3
            reps = int(min(60, max(5, target_s / est)))
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
        for i, (a, b) in enumerate(ev):
            a.record()
            fn(i)
            b.record()
        torch.cuda.synchronize()
        return statistics.median(a.elapsed_time(b) for a, b in ev)

    def graph_us(self, fn, calls, reps=20):
        """Median replay time per call of a CUDA graph that holds calls fn(0..calls-1)."""
        g = capture_graph(self.torch, fn, calls, warm_calls=min(calls, 3))
        ms = self.median_ms(lambda i: g.replay(), reps=reps)
        return 1e3 * ms / calls

    def n_sets(self, set_bytes, cap=128):
        return max(1, min(cap, math.ceil(2.2 * self.l2 / set_bytes)))

    def stream(self):
        return self.torch.cuda.current_stream().cuda_stream

    # ---- inputs -----------------------------------------------------------------------------
    def arithmetic(self, dname):
        return self.kc.ARITHMETIC_FAST if dname.endswith(" fast") else self.kc.ARITHMETIC_ACCURATE

    def workspace(self, B, T, H, K, V, dname):
        """kla_chunk_forward's device workspace for these sizes and dtype (one for all sets: the
        calls run one after another on one stream; its size depends on the dtype too)."""
        p = self.lib.params()
        p.batch, p.seq_len, p.num_heads, p.num_v_heads = B, T, H, H
        p.head_dim_k, p.head_dim_v = K, V
        p.dtype = self.kc.torch_dtype_code(self.dtypes[dname])
        p.arithmetic = self.arithmetic(dname)
        n = self.lib.workspace_size(p)
        if not n:  # the fast paths need it: without one the timings would be the generic kernel's
            raise RuntimeError(f"kla_workspace_size = 0 for B={B} T={T} H={H} K={K} V={V}")
        return self.torch.empty(n, dtype=self.torch.uint8, device=self.dev)

    def make_set(self, B, T, H, K, V, dtype, decode=False, fla=True, ws=None, arithmetic=0):
        """Random inputs (never zeros): q, k, v ~ N(0,1) in dtype; g uniform in [-0.2, -0.005]
        (natural-log decay), eta uniform in [0.3, 1) fp32; beta = eta/(|k|^2+eps) for FLA."""
        torch = self.torch
        HV = H
        dev = self.dev
        s = {
            "q": torch.randn(B, T, H, K, device=dev).to(dtype),
            "k": torch.randn(B, T, H, K, device=dev).to(dtype),
            "v": torch.randn(B, T, HV, V, device=dev).to(dtype),
            "g": -(0.005 + 0.195 * torch.rand(B, T, HV, device=dev)),
            "eta": 0.3 + 0.7 * torch.rand(B, T, HV, device=dev),
        }
        s["o"] = torch.full_like(s["v"], float("nan"))
        if fla:
            s["beta"] = self.kla_beta(s["k"], s["eta"])
        if decode:
            s["S"] = 0.05 * torch.randn(B, HV, K, V, device=dev)  # ours, updated in place
            s["S_fla"] = s["S"].clone()
        s["p"] = self.kc.make_params(self.lib, s["q"], s["k"], s["v"], s["o"], s["g"], s["eta"],
                                     eps=EPS, scale=K ** -0.5,
                                     initial_state=s.get("S"), final_state=s.get("S"),
                                     workspace=ws, arithmetic=arithmetic)
        return s

    def kla_beta(self, k, eta):
        """The KLA coefficient in fp32 from the rounded keys (what FLA is given as beta)."""
        b = eta / (k.float().square().sum(-1) + EPS)
        return b if self.beta_dtype_note is None else b.to(k.dtype)

    def set_bytes(self, s):
        return sum(t.numel() * t.element_size() for n, t in s.items()
                   if n != "p" and hasattr(t, "numel"))

    # ---- FLA calls --------------------------------------------------------------------------
    def fla_prefill(self, s, with_beta=False):
        beta = self.kla_beta(s["k"], s["eta"]) if with_beta else s["beta"]
        o, _ = self.fla_chunk(s["q"], s["k"], s["v"], s["g"], beta, scale=s["q"].shape[-1] ** -0.5,
                              initial_state=None, output_final_state=False,
                              use_qk_l2norm_in_kernel=False)
        return o

    def fla_decode(self, s, with_beta=False):
        beta = self.kla_beta(s["k"], s["eta"]) if with_beta else s["beta"]
        return self.fla_rec(s["q"], s["k"], s["v"], g=s["g"], beta=beta,
                            scale=s["q"].shape[-1] ** -0.5, initial_state=s["S_fla"],
                            output_final_state=True, use_qk_l2norm_in_kernel=False)

    # ---- cases ------------------------------------------------------------------------------
    def reference(self, s):
        """float64 tokenwise recurrence on the rounded inputs (vectorised over B and H)."""
        torch = self.torch
        q, k, v = (s[n].double() for n in ("q", "k", "v"))
        g, eta = s["g"].double(), s["eta"].double()
        B, T, H, K = q.shape
        V = v.shape[-1]
        S = torch.zeros(B, H, K, V, dtype=torch.float64, device=self.dev)
        o = torch.empty(B, T, H, V, dtype=torch.float64, device=self.dev)
        beta = eta / (k.square().sum(-1) + EPS)
        a = g.exp()
        for t in range(T):
            kt = k[:, t]
            S = S * a[:, t, :, None, None]
            e = v[:, t] - torch.einsum("bhkv,bhk->bhv", S, kt)
            S = S + beta[:, t, :, None, None] * kt[..., :, None] * e[..., None, :]
            o[:, t] = torch.einsum("bhkv,bhk->bhv", S, q[:, t]) * K ** -0.5
        return o

    def accuracy(self, dname):
        torch = self.torch
        B, T, H, K, V = 1, 2048, 16, 128, 128
        ws = self.workspace(B, T, H, K, V, dname)
        s = self.make_set(B, T, H, K, V, self.dtypes[dname], ws=ws, arithmetic=self.arithmetic(dname))
        if dname in ("bf16 fast", "fp16 fast"):  # their FAST arithmetic is the transposed scan's
            s["p"].path = self.kc.PATH_WY_TRANSPOSED
        ref = self.reference(s)
        plan = self.lib.plan_chunk_forward(s["p"])
        r = {"dtype": dname, "shape": f"{B}x{T}x{H} K{K} V{V}", "plan": plan_label(plan)}
        self.lib.chunk_forward(s["p"], self.stream())
        torch.cuda.synchronize()
        r["ours_chunk"] = rel_rms(s["o"], ref)
        o_chunk = s["o"].clone()
        s["o"].fill_(float("nan"))
        s["p"].path = self.kc.PATH_AUTO  # the decode entry runs its one kernel
        self.lib.tokenwise_forward(s["p"], self.stream())
        torch.cuda.synchronize()
        r["ours_tokenwise"] = rel_rms(s["o"], ref)
        try:
            o_fla = self.fla_prefill(s)
        except Exception as e:  # older FLA may want beta in the input dtype
            if self.beta_dtype_note is not None:
                raise
            self.beta_dtype_note = f"beta passed in the input dtype ({type(e).__name__}: {e})"
            self.res["meta"]["beta_note"] = self.beta_dtype_note
            log("note: " + self.beta_dtype_note)
            s["beta"] = self.kla_beta(s["k"], s["eta"])
            o_fla = self.fla_prefill(s)
        r["fla_chunk"] = rel_rms(o_fla, ref)
        o_rec, _ = self.fla_rec(s["q"], s["k"], s["v"], g=s["g"], beta=s["beta"],
                                scale=K ** -0.5, initial_state=None, output_final_state=False,
                                use_qk_l2norm_in_kernel=False)
        r["fla_recurrent"] = rel_rms(o_rec, ref)
        r["ours_vs_fla"] = rel_rms(o_chunk, o_fla)
        self.res["accuracy"].append(r)
        log("accuracy {dtype} {shape}: ours chunk {ours_chunk:.2e} tokenwise {ours_tokenwise:.2e}"
            " | FLA chunk {fla_chunk:.2e} recurrent {fla_recurrent:.2e} | ours vs FLA "
            "{ours_vs_fla:.2e}".format(**r))

    def prefill(self, dname, B, T, H, K, V, sweep=False):
        torch = self.torch
        dtype = self.dtypes[dname]
        ws = self.workspace(B, T, H, K, V, dname)
        m = self.arithmetic(dname)
        first = self.make_set(B, T, H, K, V, dtype, ws=ws, arithmetic=m)
        sets = [first] + [self.make_set(B, T, H, K, V, dtype, ws=ws, arithmetic=m)
                          for _ in range(self.n_sets(self.set_bytes(first), cap=32) - 1)]
        n = len(sets)
        es = torch.finfo(dtype).bits // 8
        floor_ms = 1e3 * floor_bytes(B * T, H, H, K, V, es) / self.copy_bps
        r = {"dtype": dname, "B": B, "T": T, "H": H, "K": K, "V": V, "sets": n, "sweep": sweep,
             "floor": floor_ms, "workspace_MB": 0 if ws is None else ws.numel() / 1e6}
        self.res["prefill"].append(r)
        st = self.stream
        # The plan the timed calls run (kla_plan_chunk_forward: path, slice, why).
        plan = self.lib.plan_chunk_forward(first["p"])
        r["plan"] = plan_label(plan)
        r["plan_reason"] = plan["reason"]
        r["ours"] = self.median_ms(lambda i: self.lib.chunk_forward(sets[i % n]["p"], st()))
        r["ours_frac"] = floor_ms / r["ours"]
        self.save()
        r["fla"] = self.median_ms(lambda i: self.fla_prefill(sets[i % n]))
        r["fla_beta"] = self.median_ms(lambda i: self.fla_prefill(sets[i % n], True))
        r["fla_frac"] = floor_ms / r["fla"]
        r["ratio"] = r["fla"] / r["ours"]
        r["ratio_beta"] = r["fla_beta"] / r["ours"]
        s = sets[0]
        self.lib.chunk_forward(s["p"], st())
        r["rel_rms_ours_fla"] = rel_rms(s["o"], self.fla_prefill(s))
        r["ours_finite"] = bool(torch.isfinite(s["o"]).all().item())
        log(f"prefill {dname} {B}x{T}x{H} K{K} V{V} [{r['plan']}]: ours {r['ours']:.3f} ms, FLA {r['fla']:.3f} "
            f"ms (+beta {r['fla_beta']:.3f}), FLA/ours {r['ratio']:.2f}, floor {floor_ms:.3f} ms "
            f"({100 * r['ours_frac']:.0f}% / {100 * r['fla_frac']:.0f}%), rel RMS "
            f"{r['rel_rms_ours_fla']:.1e}, sets {n}")

    def recipe(self, label, lens, H, HV, dname="bf16"):
        """One row of the peers' recipe (RECIPE): ours (Kaczmarz coefficient, and the given-beta
        function, which is the peers' computation; ACCURATE and FAST) and FLA's given-beta
        chunk_gated_delta_rule on the same tensors, through the Python APIs (kla.chunk_kla,
        kla.chunk_gated_delta_rule; cu_seqlens_cpu given, so no host synchronisation), timed as
        plain calls from Python and as replays of a captured CUDA graph (launch overhead gone:
        kernel to kernel)."""
        torch = self.torch
        import kla
        F = torch.nn.functional
        K = V = 128
        dtype = self.dtypes[dname]
        dev = self.dev
        if lens is None:
            n_seq, total = RECIPE_VARLEN
            import random
            rest = total - 64 * n_seq  # 64 tokens each, the rest cut at random points
            cuts = sorted(random.Random(2026).sample(range(1, rest), n_seq - 1))
            lens = [b - a + 64 for a, b in zip([0] + cuts, cuts + [rest])]
        T, N = sum(lens), len(lens)
        cu_cpu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(N)], dtype=torch.int64)
        cu = cu_cpu.to(dev)

        def make():
            g = F.logsigmoid(torch.randn(1, T, HV, device=dev)) / 16
            g[..., : HV // 4] = 0.0  # a quarter of the value heads undecayed
            beta = torch.sigmoid(torch.randn(1, T, HV, device=dev)).to(dtype)  # FLA's input
            return {"q": torch.randn(1, T, H, K, device=dev).to(dtype),
                    "k": torch.randn(1, T, H, K, device=dev).to(dtype),
                    "v": torch.randn(1, T, HV, V, device=dev).to(dtype), "g": g, "beta": beta,
                    "beta32": beta.float(),  # ours: the same values in fp32 (eta or beta)
                    "h0": 0.1 * torch.randn(N, HV, K, V, device=dev)}
        first = make()
        sets = [first] + [make() for _ in range(self.n_sets(self.set_bytes(first), cap=16) - 1)]
        n = len(sets)
        calls = max(n, 4)
        common = dict(scale=K ** -0.5, output_final_state=True, cu_seqlens=cu,
                      use_qk_l2norm_in_kernel=True)

        def ours(s, coefficient, arithmetic):
            if coefficient == "given":
                return kla.chunk_gated_delta_rule(s["q"], s["k"], s["v"], s["g"], s["beta32"],
                                                  initial_state=s["h0"], cu_seqlens_cpu=cu_cpu,
                                                  arithmetic=arithmetic, **common)
            return kla.chunk_kla(s["q"], s["k"], s["v"], s["g"], s["beta32"], eps=EPS,
                                 initial_state=s["h0"], cu_seqlens_cpu=cu_cpu,
                                 arithmetic=arithmetic, **common)

        def fla(s):
            return self.fla_chunk(s["q"], s["k"], s["v"], s["g"], s["beta"],
                                  initial_state=s["h0"], **common)

        es = torch.finfo(dtype).bits // 8
        # q, k, v read and o written in the dtype, g and beta in fp32, the states read + written
        floor_ms = 1e3 * floor_bytes(T, H, HV, K, V, es, states=N * HV) / self.copy_bps
        r = {"label": label, "dtype": dname, "N": N, "T": T, "H": H, "HV": HV, "K": K, "V": V,
             "lengths": lens, "sets": n, "calls_per_graph": calls, "floor": floor_ms}
        self.res.setdefault("recipe", []).append(r)
        for coefficient in ("kaczmarz", "given"):
            for arithmetic in ("accurate", "fast"):
                key = f"{coefficient} {arithmetic}"
                try:
                    pl = kla.plan(first["q"], first["k"], first["v"], first["g"], first["beta32"],
                                  cu_seqlens=cu, initial_state=first["h0"],
                                  coefficient=coefficient, arithmetic=arithmetic)
                    r[f"plan {key}"] = plan_label(vars(pl))
                    fn = lambda i, c=coefficient, a=arithmetic: ours(sets[i % n], c, a)
                    r[f"ours {key} plain"] = self.median_ms(fn)
                    r[f"ours {key} graph"] = 1e-3 * self.graph_us(fn, calls)
                except Exception as e:
                    r[f"ours {key} error"] = f"{type(e).__name__}: {e}"[:500]
                    log(f"recipe {label} ours {key}: {r[f'ours {key} error']}")
                self.save()
        try:
            r["fla plain"] = self.median_ms(lambda i: fla(sets[i % n]))
            r["fla graph"] = 1e-3 * self.graph_us(lambda i: fla(sets[i % n]), calls)
        except Exception as e:
            r["fla error"] = f"{type(e).__name__}: {e}"[:500]
            log(f"recipe {label} FLA: {r['fla error']}")
        # Same computation: ours given-beta ACCURATE against FLA, output and final state.
        try:
            o, hT = ours(first, "given", "accurate")
            o_f, hT_f = fla(first)
            r["rel_rms_o_given_vs_fla"] = rel_rms(o, o_f)
            r["rel_rms_state_given_vs_fla"] = rel_rms(hT, hT_f)
            r["ours_finite"] = bool(torch.isfinite(o).all().item())
        except Exception as e:
            r["compare error"] = f"{type(e).__name__}: {e}"[:500]
        for k in [k for k in r if k.startswith("ours ")]:
            if k.endswith(" graph") and r.get(k) and r.get("fla graph"):
                r[k.replace(" graph", " ratio_graph")] = r["fla graph"] / r[k]
            if k.endswith(" plain") and r.get(k) and r.get("fla plain"):
                r[k.replace(" plain", " ratio_plain")] = r["fla plain"] / r[k]
        log(f"recipe {label} {H}/{HV} {dname}: " + ", ".join(
            f"{k} {v:.3f}" for k, v in r.items()
            if isinstance(v, float) and (k.endswith("plain") or k.endswith("graph"))))

    def decode(self, dname, B, H=16, K=128, V=128):
        torch = self.torch
        dtype = self.dtypes[dname]
        first = self.make_set(B, 1, H, K, V, dtype, decode=True)
        sets = [first] + [self.make_set(B, 1, H, K, V, dtype, decode=True)
                          for _ in range(self.n_sets(self.set_bytes(first) // 2) - 1)]
        n = len(sets)
        calls = max(n, 16)
        es = torch.finfo(dtype).bits // 8
        floor_us = 1e6 * floor_bytes(B, H, H, K, V, es, states=B * H) / self.copy_bps
        r = {"dtype": dname, "B": B, "H": H, "K": K, "V": V, "sets": n, "calls_per_graph": calls,
             "floor": floor_us}
        self.res["decode"].append(r)
        st = self.stream
        # correctness of one step on set 0 (before timing changes the states)
        s = sets[0]
        S0 = s["S"].clone()
        o_fla, S_fla = self.fla_decode(s)
        self.lib.tokenwise_forward(s["p"], st())
        torch.cuda.synchronize()
        r["rel_rms_ours_fla"] = rel_rms(s["o"], o_fla)
        r["rel_rms_state"] = rel_rms(s["S"], S_fla)
        s["S"].copy_(S0)
        del S0, o_fla, S_fla
        r["ours"] = self.graph_us(lambda i: self.lib.tokenwise_forward(sets[i % n]["p"], st()),
                                  calls)
        r["ours_frac"] = floor_us / r["ours"]
        self.save()
        r["fla"] = self.graph_us(lambda i: self.fla_decode(sets[i % n]), calls)
        r["fla_beta"] = self.graph_us(lambda i: self.fla_decode(sets[i % n], True), calls)
        r["fla_frac"] = floor_us / r["fla"]
        r["ratio"] = r["fla"] / r["ours"]
        r["ratio_beta"] = r["fla_beta"] / r["ours"]
        # plain calls from Python (launch overhead included)
        r["ours_plain"] = 1e3 * self.median_ms(
            lambda i: self.lib.tokenwise_forward(sets[i % n]["p"], st()), reps=50)
        r["fla_plain"] = 1e3 * self.median_ms(lambda i: self.fla_decode(sets[i % n]), reps=50)
        log(f"decode {dname} B={B}: ours {r['ours']:.1f} us, FLA {r['fla']:.1f} us (+beta "
            f"{r['fla_beta']:.1f}), FLA/ours {r['ratio']:.2f}, floor {floor_us:.1f} us "
            f"({100 * r['ours_frac']:.0f}% / {100 * r['fla_frac']:.0f}%); plain calls ours "
            f"{r['ours_plain']:.1f} us, FLA {r['fla_plain']:.1f} us; rel RMS o "
            f"{r['rel_rms_ours_fla']:.1e}, state {r['rel_rms_state']:.1e}; sets {n}")

    def run(self):
        self.copy_rate()
        self.save()
        main16 = [c for c in PREFILL if c[2] == 16]
        others = [c for c in PREFILL if c[2] != 16]
        # Most valuable first: FLA compiles and autotunes once per dtype and (H, K, V).
        self.step("accuracy bf16", lambda: self.accuracy("bf16"), need=20)
        for c in main16:
            self.step(f"prefill bf16 {c}", lambda c=c: self.prefill("bf16", *c))
        for d in ("bf16", "fp16", "fp32"):
            for B in DECODE_B:
                self.step(f"decode {d} B={B}", lambda d=d, B=B: self.decode(d, B))
        for T in SWEEP_T:
            if T != 32768:
                self.step(f"sweep bf16 T={T}", lambda T=T: self.prefill("bf16", 1, T, 16, 128, 128,
                                                                       sweep=True))
        for c in others:
            self.step(f"prefill bf16 {c}", lambda c=c: self.prefill("bf16", *c), need=30)
        for d in ("fp16", "fp32", "fp32 fast", "bf16 fast", "fp16 fast"):
            self.step(f"accuracy {d}", lambda d=d: self.accuracy(d), need=30)
            for c in main16:
                self.step(f"prefill {d} {c}", lambda d=d, c=c: self.prefill(d, *c), need=20)
        for d in ("fp16", "fp32", "fp32 fast"):  # bf16 / fp16 FAST: only the transposed rows differ
            for c in others:
                self.step(f"prefill {d} {c}", lambda d=d, c=c: self.prefill(d, *c), need=30)
        for label, lens, H, HV in RECIPE:
            self.step(f"recipe bf16 {label} {H}/{HV}",
                      lambda a=(label, lens, H, HV): self.recipe(*a), need=30)
        self.res["meta"]["elapsed_s"] = time.time() - self.t0
        self.save()
        print_table(self.res)


def build_info_beside(lib):
    """BUILD_INFO.json beside the library a benchmark times (tools/build_info.sh: commit, CUDA
    sources hash, flags), or {} where there is none. The GPU machine's copy of .git can lag, so a
    figure names the commit its library was built at, not what `git` says there."""
    path = os.path.join(os.path.dirname(os.path.abspath(lib)), "BUILD_INFO.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def print_table(res):
    m = res["meta"]
    print(f"\n{m['gpu']}  copy {m.get('copy_TBps', 0):.2f} TB/s  torch {m['torch']}  triton "
          f"{m['triton']}  fla {m['fla']}  kla {m['kla_version']}  "
          f"commit {m.get('build', {}).get('commit', '?')}")
    print("\naccuracy: relative RMS vs float64 recurrence (same rounded inputs)")
    print("| dtype | shape | ours chunk | ours tokenwise | FLA chunk | FLA recurrent | ours vs FLA |")
    print("|---|---|---|---|---|---|---|")
    for r in res["accuracy"]:
        print(f"| {r['dtype']} | {r['shape']} | {r['ours_chunk']:.2e} | {r['ours_tokenwise']:.2e} |"
              f" {r['fla_chunk']:.2e} | {r['fla_recurrent']:.2e} | {r['ours_vs_fla']:.2e} |")
    print("\nprefill (ms; ratio = FLA / ours; frac = floor / time)")
    print("| shape BxTxH | K,V | dtype | ours | FLA | FLA+beta | ratio | floor | ours frac | "
          "FLA frac | rel RMS |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in res["prefill"]:
        print(f"| {r['B']}x{r['T']}x{r['H']}{' (sweep)' if r['sweep'] else ''} | {r['K']},{r['V']}"
              f" | {r['dtype']} | {fmt(r.get('ours'), '.3f')} | {fmt(r.get('fla'), '.3f')} | "
              f"{fmt(r.get('fla_beta'), '.3f')} | {fmt(r.get('ratio'), '.2f')} | "
              f"{r['floor']:.3f} | {fmt(r.get('ours_frac'), '.1%')} | "
              f"{fmt(r.get('fla_frac'), '.1%')} | {fmt(r.get('rel_rms_ours_fla'), '.1e')} |")
    print("\ndecode, one token, H=16, K=V=128, fp32 state (us per call, CUDA graph replay)")
    print("| B | dtype | ours | FLA | FLA+beta | ratio | floor | ours frac | FLA frac | "
          "ours plain | FLA plain | rel RMS |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in res["decode"]:
        print(f"| {r['B']} | {r['dtype']} | {fmt(r.get('ours'), '.1f')} | {fmt(r.get('fla'), '.1f')}"
              f" | {fmt(r.get('fla_beta'), '.1f')} | {fmt(r.get('ratio'), '.2f')} | "
              f"{r['floor']:.1f} | {fmt(r.get('ours_frac'), '.1%')} | "
              f"{fmt(r.get('fla_frac'), '.1%')} | {fmt(r.get('ours_plain'), '.1f')} | "
              f"{fmt(r.get('fla_plain'), '.1f')} | {fmt(r.get('rel_rms_ours_fla'), '.1e')} |")
    if res.get("recipe"):
        print("\npeers' recipe, bf16 (ms; graph replay | plain)")
        for r in res["recipe"]:
            cells = [f"{k} {r[k]:.3f}" for k in r
                     if k.endswith((" graph", " plain")) and isinstance(r[k], float)]
            print(f"{r['label']} {r['H']}/{r['HV']}: " + ", ".join(cells))
    for s in res["skipped"]:
        print("skipped:", s)
    for e in res["errors"]:
        print("error:", e.splitlines()[0][:300])


def plot(outdir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    with open(os.path.join(outdir, "side_by_side.json")) as f:
        res = json.load(f)
    gpu = res["meta"]["gpu"]
    rows = sorted((r for r in res["prefill"] if r["dtype"] == "bf16" and r["B"] == 1
                   and r["H"] == 16 and r["K"] == 128 and r.get("ours") is not None),
                  key=lambda r: r["T"])
    if rows:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        T = [r["T"] for r in rows]
        ax.loglog(T, [r["ours"] for r in rows], "o-", label="ours (kla_chunk_forward)")
        pts = [(r["T"], r["fla"]) for r in rows if r.get("fla") is not None]
        if pts:
            ax.loglog(*zip(*pts), "s-", label="FLA chunk_gated_delta_rule")
        pts = [(r["T"], r["fla_beta"]) for r in rows if r.get("fla_beta") is not None]
        if pts:
            ax.loglog(*zip(*pts), "s--", alpha=0.6, label="FLA + beta in PyTorch")
        ax.loglog(T, [r["floor"] for r in rows], "k:", label="memory floor (copy rate)")
        ax.set_xlabel("T (tokens), B=1, H=16, K=V=128, bf16")
        ax.set_ylabel("time per call (ms)")
        ax.set_title(f"prefill, {gpu}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(outdir, "prefill_vs_T.png"), dpi=110)
        plt.close(fig)
    rows = sorted((r for r in res["decode"] if r["dtype"] == "bf16" and r.get("ours")),
                  key=lambda r: r["B"])
    if rows:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        B = [r["B"] for r in rows]
        ax.loglog(B, [r["ours"] for r in rows], "o-", label="ours (kla_tokenwise_forward)")
        pts = [(r["B"], r["fla"]) for r in rows if r.get("fla") is not None]
        if pts:
            ax.loglog(*zip(*pts), "s-", label="FLA fused_recurrent_gated_delta_rule")
        ax.loglog(B, [r["floor"] for r in rows], "k:", label="memory floor (fp32 state r+w)")
        ax.set_xlabel("batch B (one token, H=16, K=V=128, bf16, fp32 state)")
        ax.set_ylabel("time per step (us, CUDA graph replay)")
        ax.set_title(f"decode, {gpu}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(outdir, "decode_vs_B.png"), dpi=110)
        plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", help="path to libkla_cuda.so")
    ap.add_argument("--out", help="output folder")
    ap.add_argument("--budget", type=float, default=200.0,
                    help="seconds; cases that would start later are skipped (default 200)")
    ap.add_argument("--only", metavar="REGEX", help="run only the cases whose name matches (e.g. "
                    "'accuracy (bf16|fp16) fast')")
    ap.add_argument("--plot", metavar="OUTDIR", help="only draw the PNGs from OUTDIR's JSON")
    ap.add_argument("--table", metavar="OUTDIR", help="only print the table of OUTDIR's JSON")
    args = ap.parse_args()
    if args.plot:
        plot(args.plot)
        return 0
    if args.table:
        with open(os.path.join(args.table, "side_by_side.json")) as f:
            print_table(json.load(f))
        return 0
    if not args.lib or not args.out:
        ap.error("--lib and --out are required")
    os.makedirs(args.out, exist_ok=True)
    import torch
    if not torch.cuda.is_available():
        print("side_by_side: no CUDA device; nothing to measure")
        return 0
    Runner(args).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
