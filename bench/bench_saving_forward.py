"""The saving forward (save_states=True, kla_chunk_forward_saving) on each scan that saves, beside
the plain FAST forward: bench_backward.py's three rows and inputs (bf16, H 16 / HV 32,
K = V = 128, qk l2-norm, the given-beta function), CUDA-graph replays in ms, two rounds.

  python3 bench/bench_saving_forward.py          (writes $OUT/save_fwd.json, or out/save_fwd.json)

Variants: FAST (save_states=False, the plan's path), saved auto (the saving forward's own choice:
the plan's scan where it is wy_transposed or wy at 32 columns, else wy at 32), saved wy/32, saved
wy_transposed. For the saving ones also the backward replayed alone and forward + backward
(bench_backward.graph_times). "plan" is the plain call's plan in one pass (kla.plan, segments=1).
docs/performance/saving_forward.json is one run (docs/prefill_notes.md, round 2 session 30)."""
import json, os, sys
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_backward as bb
import kla

def mk(save, path="auto", vs=0):
    def fn(q, k, v, g, beta, h0, cu):
        return kla.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                          output_final_state=True, cu_seqlens=cu,
                                          cu_seqlens_cpu=bb._host_cu(cu),
                                          use_qk_l2norm_in_kernel=True, arithmetic="fast",
                                          save_states=save, path=path, value_slice=vs)
    return fn

def fwd_graph(fn, leaves, cu, reps):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(*leaves, cu)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn(*leaves, cu)
    t = bb.timed(g.replay, reps)
    del g, out
    return t

variants = [("FAST", mk(False)), ("saved auto", mk(True)), ("saved wy/32", mk(True, "wy", 32)),
            ("saved wy_transposed", mk(True, "wy_transposed", 64))]
rows = [("1x32768", [32768]), ("8 seqs", bb.random_lengths(32768, 8, 1)), ("1x8192", [8192])]
res = []
for name, lengths in rows:
    leaves, cu, do, dht = bb.inputs(lengths, 16, 32, 128, torch.bfloat16, seed=0)
    q, k, v, g, beta, h0 = leaves
    pl = kla.plan(q, k, v, g, beta, cu_seqlens=cu, initial_state=h0, arithmetic="fast",
                  coefficient="given", segments=1)
    row = {"case": name, "plan": f"{pl.path}/{pl.value_slice}"}
    for rnd in range(2):
        for vname, fn in variants:
            row.setdefault(vname, {}).setdefault("fwd_ms", []).append(fwd_graph(fn, leaves, cu, 20))
            if vname != "FAST":
                r = bb.graph_times(fn, leaves, cu, do, dht, 10)
                row[vname].setdefault("bwd_ms", []).append(r["graph_bwd_ms"])
                row[vname].setdefault("fwd_bwd_ms", []).append(r["graph_fwd_bwd_ms"])
            for x in leaves:
                x.grad = None
            torch.cuda.empty_cache()
    print(json.dumps(row), flush=True)
    res.append(row)
os.makedirs(os.environ.get("OUT", "out"), exist_ok=True)
json.dump({"device": torch.cuda.get_device_name(), "rows": res,
           "build": bb.build_info_beside(kla.library_info()["path"])},
          open(os.path.join(os.environ.get("OUT", "out"), "save_fwd.json"), "w"), indent=1)
