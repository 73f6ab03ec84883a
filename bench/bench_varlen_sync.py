"""One training step of a stack of layers sharing one CUDA cu_seqlens (FLA's usual int64 device
tensor, no cu_seqlens_cpu): the host copy the library validates is made once per tensor and
version (kla._indices), not once per call. Times the step with that memory and without it (each
call copying, as before), in one process, alternating; prints a markdown table.

  python3 bench/bench_varlen_sync.py [--layers 8] [--reps 10]

The step: for each layer, kla.chunk_gated_delta_rule on its own q, k, v, g, beta (bf16,
K = V = 128, H 16 / HV 32, qk l2-norm in the kernel, arithmetic "fast"), sequences packed with
cu_seqlens (4 of random lengths totalling 8192 tokens), the outputs summed into a loss, then
backward. Every layer's call copies cu_seqlens to the host without the memory: a copy waits for
the stream, so the host cannot run ahead of the GPU and each call's launch cost is exposed.
"""
import argparse
import statistics
import sys

import torch

import kla
from kla import _indices


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    lengths = [1500, 2600, 900, 3192]
    T, H, HV, D = sum(lengths), 16, 32, 128
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), device=dev)  # int64

    def leaf(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, device=dev, generator=gen).to(dtype).requires_grad_()

    layers = [(leaf(1, T, H, D), leaf(1, T, H, D), leaf(1, T, HV, D),
               (torch.nn.functional.logsigmoid(torch.randn(1, T, HV, device=dev, generator=gen))
                / 16).requires_grad_(),
               torch.sigmoid(torch.randn(1, T, HV, device=dev, generator=gen)).requires_grad_())
              for _ in range(a.layers)]

    def step():
        loss = 0.0
        for q, k, v, g, beta in layers:
            o, _ = kla.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu,
                                              use_qk_l2norm_in_kernel=True, arithmetic="fast")
            loss = loss + o.float().square().mean()
        loss.backward()

    remembered = _indices.remembered_host
    forgetful = lambda t: None  # noqa: E731  (every call copies: the previous behaviour)
    times = {"remembered": [], "copied each call": []}
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    for _ in range(a.reps):
        for name, fn in (("remembered", remembered), ("copied each call", forgetful)):
            _indices.remembered_host = fn
            a0, b0 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            a0.record()
            step()
            b0.record()
            torch.cuda.synchronize()
            times[name].append(a0.elapsed_time(b0))
    _indices.remembered_host = remembered
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, kla {kla.__version__}; "
          f"{a.layers} layers, {len(lengths)} packed sequences of {T} tokens, median of {a.reps}")
    print("| host copy of cu_seqlens | forward + backward of the stack, ms |")
    print("|---|---|")
    for name, ts in times.items():
        print(f"| {name} | {statistics.median(ts):.3f} (min {min(ts):.3f}) |")


if __name__ == "__main__":
    sys.exit(main())
