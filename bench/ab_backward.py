"""A/B of kla's FAST backward between libraries (or settings) in one call, on issue 25's rows.

    PYTHONPATH=python python3 bench/ab_backward.py --out out/ab.json --rounds 2 \\
        base=/path/a/libkla_cuda.so.5 new=/path/b/libkla_cuda.so.5 \\
        'new-scan=/path/b/libkla_cuda.so.5?KLA_AB_STATE_GRAD=scan'

Each variant NAME=LIBRARY[?VAR=VALUE[&...]] runs in a process of its own (the library is loaded
once a process: KLA_CUDA_LIBRARY), with the extra environment given after '?'. Two variables are
this script's: KLA_AB_STATE_GRAD (auto, scan or chain) and KLA_AB_CHAIN_SEGMENT (0, or chunks a
chain segment) pin the saved backward's state-gradient schedule (chunk_gated_delta_rule's
state_grad / chain_segment; a library without kla_chunk_backward_saved_as then fails that
variant, saying so); the variants run
in turn, `--rounds` times, so that drift on the GPU shows as a difference between rounds rather
than between variants. Per row (bench_backward.py's three: 1x32768, 8 packed sequences of random
lengths summing to 32768, 1x8192; H 16, HV 32, K = V = 128, bf16, qk l2-norm, an initial state,
dO and d(final state)):
  - the backward alone, replayed from a CUDA graph (bench_backward.graph_times, median of --reps),
    with saved states (save_states=True, the default) or without (--no-saved);
  - each kernel's time in one more backward under torch.profiler (name -> ms, summed by name);
  - a SHA-1 of the six gradients' bytes, so that a change meant to keep the results shows it did;
  - with saved states, the library's plan for the schedule asked (bench_backward.saved_schedule:
    the kernels it timed; a library without kla_plan_chunk_backward_saved records why not).
Writes --out (JSON, after every variant) and prints one progress line a measurement and a table
at the end.
"""
import argparse
import functools
import hashlib
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from backward_targets import saved_schedule_text  # noqa: E402


def log(msg):
    print(f"[ab_backward {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def child(args):
    """One variant's measurements (this process's library), as JSON on stdout's last line."""
    import torch
    import bench_backward as bb

    fn = bb.kla_fast_saved_fn if args.saved else bb.kla_fast_fn
    schedule = {"state_grad": os.environ.get("KLA_AB_STATE_GRAD", "auto"),
                "chain_segment": int(os.environ.get("KLA_AB_CHAIN_SEGMENT", "0"))}
    if schedule != {"state_grad": "auto", "chain_segment": 0}:
        if not args.saved:
            raise SystemExit("KLA_AB_STATE_GRAD / KLA_AB_CHAIN_SEGMENT: the saved backward's "
                             "schedule, not with --no-saved")
        fn = functools.partial(bb.kla_fast_saved_fn, **schedule)
    rows = [("1x32768", [32768]), ("8 seqs", bb.random_lengths(32768, 8, 1)), ("1x8192", [8192])]
    out = {}
    for name, lengths in rows:
        leaves, cu, do, dht = bb.inputs(lengths, 16, 32, 128, torch.bfloat16, seed=0)
        t = bb.graph_times(fn, leaves, cu, do, dht, args.reps)
        for x in leaves:
            x.grad = None
        o, s = fn(*leaves, cu)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            torch.autograd.backward((o, s), (do, dht))
            torch.cuda.synchronize()
        kernels = {}
        for e in prof.key_averages():
            if e.device_type == torch.autograd.DeviceType.CUDA and e.self_device_time_total > 0:
                kernels[e.key[:80]] = round(e.self_device_time_total / 1000.0, 4)
        sha = hashlib.sha1()
        for x in leaves:
            sha.update(x.grad.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes())
        out[name] = {"bwd_ms": round(t["graph_bwd_ms"], 4),
                     "fwd_bwd_ms": round(t["graph_fwd_bwd_ms"], 4),
                     "kernels_ms": kernels, "grads_sha1": sha.hexdigest()}
        if args.saved:
            out[name]["plan"] = bb.saved_schedule(leaves, cu, **schedule)
        del leaves, o, s
        torch.cuda.empty_cache()
    out["device"] = torch.cuda.get_device_name()
    print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="*", help="NAME=LIBRARY[?VAR=VALUE[&VAR=VALUE]]")
    ap.add_argument("--out", default="out/ab_backward.json")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--no-saved", dest="saved", action="store_false",
                    help="the backward that recomputes the states (save_states=False)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    if not args.variants:
        ap.error("no variants given")
    variants = []
    for v in args.variants:
        name, _, spec = v.partition("=")
        lib, _, extra = spec.partition("?")
        env = dict(kv.split("=", 1) for kv in extra.split("&") if kv)
        if not name or not os.path.exists(lib):
            ap.error(f"bad variant {v!r} (no such library?)")
        variants.append((name, lib, env))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    result = {"saved": args.saved, "reps": args.reps, "runs": []}
    for r in range(args.rounds):
        for name, lib, env in variants:
            e = dict(os.environ, KLA_CUDA_LIBRARY=lib, **env)
            cmd = [sys.executable, os.path.abspath(__file__), "--child", "--reps", str(args.reps)]
            if not args.saved:
                cmd.append("--no-saved")
            p = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=900)
            if p.returncode != 0:
                log(f"{name} round {r + 1} failed:\n{p.stderr[-3000:]}")
                result["runs"].append({"variant": name, "round": r + 1, "error": p.stderr[-3000:]})
                continue
            m = json.loads(p.stdout.strip().splitlines()[-1])
            result["runs"].append({"variant": name, "round": r + 1, "library": lib, "env": env, **m})
            log(f"{name} round {r + 1}: " + " / ".join(
                f"{m[k]['bwd_ms']:.3f}" for k in ("1x32768", "8 seqs", "1x8192")) + " ms")
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
    print("\n| variant | round | bwd ms 1x32768 / 8 seqs / 1x8192 | fwd+bwd ms "
          "| grads SHA-1 (first 8) | saved backward's schedule |")
    print("|---|---|---|---|---|---|")
    for run in result["runs"]:
        if "error" in run:
            print(f"| {run['variant']} | {run['round']} | failed | | | |")
            continue
        rows = ("1x32768", "8 seqs", "1x8192")
        print(f"| {run['variant']} | {run['round']} | "
              + " / ".join(f"{run[k]['bwd_ms']:.3f}" for k in rows) + " | "
              + " / ".join(f"{run[k]['fwd_bwd_ms']:.3f}" for k in rows) + " | "
              + " ".join(run[k]["grads_sha1"][:8] for k in rows) + " | "
              + " / ".join(saved_schedule_text(run[k].get("plan")) for k in rows) + " |")


if __name__ == "__main__":
    main()
