"""Host overhead of kla's Python calls: decode at B = 1 (H = HV = 16, K = V = 128, bf16, fp32
state updated in place), plain calls from Python and replays of a captured CUDA graph.

    python -m kla._bench_overhead [--calls 3000] [--json FILE]

Plain rows: wall time of back-to-back calls / calls (the GPU work of one call, ~4 us, is shorter
than the host's, so this is the host's cost per call). Graph rows: CUDA-event time of a replayed
graph of 100 captured calls / 100 (the GPU's time per call, no host work). "raw C call" is the
floor: kla_tokenwise_forward through ctypes with prebuilt params; "torch op" is the registered
op called through the dispatcher (what torch.compile'd code and autograd-enabled calls use);
FLA rows appear when fla is importable.
"""
import argparse
import ctypes
import json
import time

import torch

import kla
import kla.lowlevel as kc
from kla import ops

B, H, K, V = 1, 16, 128, 128


def per_call_us(fn, calls, warmup=200):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / calls * 1e6


def graph_us(fn, inner=100, reps=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(inner):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / inner)
    return sorted(times)[len(times) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    q = torch.randn(B, 1, H, K, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, 1, H, K, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, 1, H, V, device=dev, dtype=torch.bfloat16)
    g = -torch.rand(B, 1, H, device=dev) * 0.1
    eta = torch.rand(B, 1, H, device=dev)
    state = torch.zeros(B, H, K, V, device=dev)
    rows = []

    def row(name, us):
        rows.append({"case": name, "us_per_call": round(us, 2)})
        print(f"{name:<62} {us:8.2f} us/call", flush=True)

    def kla_inplace():
        return kla.fused_recurrent_kla(q, k, v, g, eta, initial_state=state,
                                       inplace_final_state=True)

    def kla_out_of_place():
        return kla.fused_recurrent_kla(q, k, v, g, eta, initial_state=state,
                                       output_final_state=True)

    def gdn_inplace():
        return kla.fused_recurrent_gated_delta_rule(q, k, v, g, beta=eta, initial_state=state,
                                                    inplace_final_state=True)

    op_args = (q, k, v, g, eta, state, None, None, None, None, K ** -0.5, 1e-6, 1.0, 0, 0)

    def torch_op():
        return torch.ops.kla.recurrent_fwd_inplace(*op_args)

    lib = kc.KlaLibrary()
    o = torch.empty_like(v)
    p = kc.make_params(lib, q, k, v, o, g, eta, eps=1e-6, initial_state=state,
                       final_state=state)
    ref = ctypes.byref(p)
    raw = lib._lib.tokenwise_forward

    def raw_call():
        raw(ref, ops._stream(0))

    print(f"kla {kla.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}; "
          f"decode B={B} H=HV={H} K={K} V={V} bf16, fp32 state")
    row("plain: kla.fused_recurrent_kla, in place", per_call_us(kla_inplace, args.calls))
    row("plain: kla.fused_recurrent_kla, output_final_state",
        per_call_us(kla_out_of_place, args.calls))
    row("plain: kla.fused_recurrent_gated_delta_rule, in place",
        per_call_us(gdn_inplace, args.calls))
    row("plain: torch.ops.kla.recurrent_fwd_inplace (dispatcher)",
        per_call_us(torch_op, args.calls))
    row("plain: raw C call (ctypes, prebuilt params)", per_call_us(raw_call, args.calls))
    row("graph replay: kla.fused_recurrent_kla, in place", graph_us(kla_inplace))
    try:
        import os
        os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fla_rec
    except Exception as e:  # fla is optional
        print(f"(FLA rows skipped: {type(e).__name__}: {e})")
    else:
        def fla_call():
            return fla_rec(q, k, v, g, beta=eta, initial_state=state, output_final_state=True)
        row("plain: FLA fused_recurrent_gated_delta_rule", per_call_us(fla_call, args.calls))
        row("graph replay: FLA fused_recurrent_gated_delta_rule", graph_us(fla_call))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(),
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
