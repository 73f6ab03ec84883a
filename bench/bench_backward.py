"""Forward and backward time of kla's autograd path on one GPU (issue 25's 8192-token row).

    PYTHONPATH=python KLA_CUDA_LIBRARY=build-gpu/dist/libkla_cuda.so.4 python3 bench/bench_backward.py

The case of FlashQLA's backward script: one packed sequence (cu_seqlens) of T = 8192 tokens,
H = 16 query/key heads, HV = 32 value heads, K = V = 128, bf16, l2-normalised q and k in the kernel
(use_qk_l2norm_in_kernel), g = logsigmoid(randn) / 16, beta = rand, an initial state, upstream
gradients of o and of the final state (ones). Three warm-up passes, then one timed with CUDA
events: forward (the CUDA kernel) and backward (python/kla/_backward.py, PyTorch), and the peak
memory torch allocated over the timed pass. The backward is PyTorch until the CUDA backward lands,
so this measures what training costs today, not the issue's target (docs/python.md, 'Backward').
"""
import argparse

import torch

import kla


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--HV", type=int, default=32)
    ap.add_argument("--D", type=int, default=128, help="K = V")
    a = ap.parse_args()
    B, T, H, HV, K, V = 1, a.T, a.H, a.HV, a.D, a.D
    dev = "cuda"
    q = torch.randn(B, T, H, K, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, device=dev), dim=-1)
    k = k.bfloat16().requires_grad_()
    v = torch.randn(B, T, HV, V, device=dev, dtype=torch.bfloat16, requires_grad=True)
    g = (torch.nn.functional.logsigmoid(torch.randn(B, T, HV, device=dev)) / 16).requires_grad_()
    beta = torch.rand(B, T, HV, device=dev, requires_grad=True)
    h0 = torch.zeros(1, HV, K, V, device=dev, requires_grad=True)
    cu = torch.tensor([0, T], device=dev, dtype=torch.int32)

    def forward():
        return kla.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                          output_final_state=True, cu_seqlens=cu,
                                          cu_seqlens_cpu=cu.cpu(), use_qk_l2norm_in_kernel=True)

    def backward(o, s):
        torch.autograd.backward((o, s), (torch.ones_like(o), torch.ones_like(s)))

    for _ in range(3):
        backward(*forward())
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
    ev[0].record()
    o, s = forward()
    ev[1].record()
    backward(o, s)
    ev[2].record()
    torch.cuda.synchronize()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: 1x{T}, H={H}/HV={HV}, "
          f"K=V={K}, bf16: fwd ms {ev[0].elapsed_time(ev[1]):.3f} bwd ms "
          f"{ev[1].elapsed_time(ev[2]):.3f} peak GiB "
          f"{torch.cuda.max_memory_allocated() / 2**30:.2f}")


if __name__ == "__main__":
    main()
