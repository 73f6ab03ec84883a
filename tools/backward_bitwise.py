#!/usr/bin/env python3
"""Whether two builds of libkla_cuda give bitwise the same forward and backward on fixed problems.

  KLA_CUDA_LIBRARY=OLD.so python3 tools/backward_bitwise.py run old.pt
  KLA_CUDA_LIBRARY=NEW.so python3 tools/backward_bitwise.py run new.pt
  python3 tools/backward_bitwise.py compare old.pt new.pt

`run` (on a GPU, PYTHONPATH=python) calls kla's forward and autograd backward on ten fixed
problems in each arithmetic (ACCURATE, FAST): fp32 / bf16 / fp16, K = V = 128 and four other head
dims, grouped value heads (groups of 1 to 16), packed sequences with an empty and a one-token sequence, both
coefficients, an initial state and the final state's gradient; it saves o, the final state and
every input's gradient. `compare` (anywhere with torch) reports each tensor that differs in one
bit (NaN where NaN) and exits 1 if any does. A kernel change meant to keep the arithmetic
(docs/prefill_notes.md, backward v8-v11) shows "differing tensors 0".
"""
import argparse
import sys

import torch


def cases():
    """(dtype, T, H, HV, K, V, cu_seqlens or None, given beta)."""
    return [
        (torch.bfloat16, 8192, 16, 32, 128, 128, None, True),
        (torch.bfloat16, 3000, 4, 8, 128, 128, [0, 700, 700, 2100, 3000], False),
        (torch.float16, 1000, 2, 2, 64, 128, [0, 333, 1000], False),
        (torch.float32, 777, 2, 4, 128, 64, None, False),
        (torch.float32, 500, 3, 3, 96, 96, [0, 1, 250, 500], True),
        (torch.float16, 2000, 2, 4, 128, 128, [0, 1, 900, 2000], False),
        (torch.float32, 1500, 2, 2, 128, 128, None, True),
        (torch.bfloat16, 700, 2, 2, 64, 64, None, False),
        (torch.bfloat16, 1000, 1, 3, 128, 128, [0, 77, 1000], True),  # groups of 3
        (torch.bfloat16, 600, 1, 16, 128, 128, None, False),  # 16: more than a cluster holds
    ]


def run(out):
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        raise SystemExit("backward_bitwise run: needs a CUDA GPU (and PYTHONPATH=python, "
                         "KLA_CUDA_LIBRARY=the build to check)")
    import kla

    dev = "cuda"
    res = {}
    for ci, (dt, T, H, HV, K, V, cu, given) in enumerate(cases() * 2):
        arithmetic = "fast" if ci >= len(cases()) else "accurate"
        gen = torch.Generator(device=dev).manual_seed(100 + ci)

        def r(*shape):
            return torch.randn(*shape, device=dev, generator=gen)

        N = 1 if cu is None else len(cu) - 1
        q, k, v = r(1, T, H, K).to(dt), r(1, T, H, K).to(dt), r(1, T, HV, V).to(dt)
        g = F.logsigmoid(r(1, T, HV)) / 16
        b = torch.sigmoid(r(1, T, HV))
        h0 = 0.1 * r(N, HV, K, V)
        do, dht = r(1, T, HV, V).to(dt), r(N, HV, K, V)
        leaves = [x.detach().requires_grad_() for x in (q, k, v, g, b, h0)]
        kw = dict(arithmetic=arithmetic, initial_state=leaves[5], output_final_state=True,
                  use_qk_l2norm_in_kernel=True)
        if cu is not None:
            kw["cu_seqlens"] = torch.tensor(cu, device=dev, dtype=torch.int32)
        fn = kla.chunk_gated_delta_rule if given else kla.chunk_kla
        o, f = fn(*leaves[:5], **kw)
        torch.autograd.backward((o, f), (do, dht))
        res[ci] = [o.detach().cpu(), f.detach().cpu()] + [x.grad.cpu() for x in leaves]
        print(f"case {ci}: {dt}, T {T}, H {H}/{HV}, K {K}, V {V}, {arithmetic}", flush=True)
    torch.save(res, out)
    print("saved", out, len(res), "cases")


def same(x, y):
    nan = torch.isnan(x)
    return (x.dtype == y.dtype and x.shape == y.shape and torch.equal(nan, torch.isnan(y))
            and torch.equal(torch.where(nan, 0, x), torch.where(nan, 0, y)))


def load(path):
    try:
        res = torch.load(path)
    except Exception as e:  # noqa: BLE001 (a missing, truncated or foreign file alike)
        raise SystemExit(f"backward_bitwise: cannot read {path}: {type(e).__name__}: {e}")
    if not isinstance(res, dict):
        raise SystemExit(f"backward_bitwise: {path} is not a file this tool's run step wrote")
    return res


def compare(a_path, b_path):
    a, b = load(a_path), load(b_path)
    if a.keys() != b.keys():
        print("the files hold different cases")
        return 1
    bad = 0
    for ci in a:
        for j, (x, y) in enumerate(zip(a[ci], b[ci])):
            if not same(x, y):
                bad += 1
                d = (x.double() - y.double()).abs().max().item()
                print(f"case {ci} tensor {j}: differs (max abs {d:.3e})")
    print("cases", len(a), "differing tensors", bad)
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("run").add_argument("out")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    args = ap.parse_args()
    if args.cmd == "run":
        run(args.out)
        return 0
    return compare(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
