#!/usr/bin/env python3
"""Writes the seed corpora fuzz/corpus/<target>/seed-* (deterministic; rerun to regenerate).

The harnesses read their inputs front to back, one byte per choice (fuzz/bytes.hpp), and read
zeros past the end, so any byte string is a valid input. Seeds are pseudo-random strings with the
leading mode byte(s) pinned so every mode / dtype / scalar type is covered, plus a few hand-made
inputs for the special cases (all-zero input: k = 0 with eps = 0; all-0xff: NaN patterns).
"""
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
# Generated seeds that reproduce an open finding (docs/fuzzing.md) are not written: the corpus
# must pass today; the findings' reproducers live in fuzz/regressions/.
EXCLUDE = {("validate", "02"), ("validate", "10")}


def write(target, name, data):
    if (target, name) in EXCLUDE:
        return
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(bytes(data))


def abi4_prefix(dtype=1, k=64, v=64, workspace=True, arithmetic=0):
    """The bytes fuzz_validate reads before the ABI-4 fields, for a valid struct with no mutation:
    dtype (0 fp32, 1 bf16, 2 fp16), B = 1, T = 48, H = 1, HV = 2, head dims k and v (multiples of
    16), unpadded [B,T,H,D] layouts, no gates, eps read from its byte, no cu_seqlens, no
    states; then no mutation, a valid workspace (or none) and arithmetic."""
    b = [dtype, 0, 47, 0, 1, k // 16 - 1, v // 16 - 1]
    b += [0, 0, 0] + [1, 0, 0] + [2, 0, 0] + [8, 0]  # q, k, v (ptr, pad, not time-major), o
    b += [0, 0, 8, 0, 0, 16, 0, 0, 0, 0]  # no g / eta, eta_value, eps, scale, enums, B, states
    b += [0]  # no mutation
    b += [2, 0] if workspace else [0]  # workspace: valid (0 spare bytes) or none
    b += [0, arithmetic]
    return b


def abi4_validate_seeds():
    """Inputs for the ABI-4 tail: path byte (% 16: < 12 -> value % 6, 12 -> -1, 13 -> 6, 14 -> a
    64-bit pick truncated, 15 -> 4 raw bytes), value_slice byte (% 12: 0 0, 1 8, 2 16, 3 32, 4 64,
    10 -> a bad one, 11 -> 4 raw bytes), device byte (% 4: 0 H100, 1 A100, else cc index,
    multiprocessors - 1, smem byte (odd: a listed size; even: 4 raw bytes), tensor maps), then the
    stamp byte (% 16 == 15: corrupt; which: 0 abi_version, 1 struct_size, 2 both; each a pick)."""
    p = abi4_prefix
    h100, a100, end = [0], [1], [0]
    return [
        ("wy-bf16-h100", p() + [1, 0] + h100 + end),
        ("wy-bf16-vs8-k96", p(k=96) + [1, 1] + h100 + end),
        ("wy-transposed-fp16", p(dtype=2, k=128, v=128) + [2, 4] + h100 + end),
        ("tf32-vs8-a100", p(dtype=0) + [3, 1] + a100 + end),
        ("generic-vs32-cc10", p() + [4, 3, 2, 6, 131, 9, 1] + end),
        ("tokenwise-refused", p() + [5, 0] + h100 + end),
        ("auto-fp32-fast-k96", p(dtype=0, k=96, arithmetic=1) + [0, 0] + h100 + end),
        ("auto-value-slice", p() + [0, 1] + h100 + end),
        ("auto-no-workspace", p(workspace=False) + [0, 0] + h100 + end),
        ("wy-no-workspace", p(workspace=False) + [1, 0] + h100 + end),
        ("wy-sm86-refused", p() + [1, 2, 2, 2, 83, 5, 1] + end),
        ("path-raw", p() + [15, 0xFF, 0xFF, 0xFF, 0x7F, 0] + h100 + end),
        ("path-minus-one", p() + [12, 0] + h100 + end),
        ("value-slice-raw", p() + [1, 11, 48, 0, 0, 0] + h100 + end),
        ("value-slice-24", p() + [3, 10, 5] + h100 + end),
        ("small-smem", p() + [0, 0, 2, 2, 15, 0, 0, 0xC0, 0, 0, 0] + end),
        ("stamp-abi3", p() + [1, 0] + h100 + [15, 0, 1]),
        ("stamp-size-abi3", p() + [1, 0] + h100 + [15, 1, 1]),
        ("stamp-both-raw", p() + [13, 0] + h100 + [15, 2, 5, 1, 2, 3, 4, 5, 9, 9, 9, 9]),
    ]


def main():
    rng = random.Random(20250105)
    rb = lambda n: [rng.randrange(256) for _ in range(n)]
    # validate: the first ~45 bytes build a valid struct, the rest mutate it.
    for i in range(24):
        write("validate", "%02d" % i, rb(rng.choice([20, 40, 60, 90])))
    write("validate", "zeros", [0] * 64)
    write("validate", "ones", [0xFF] * 64)
    # ABI 4 (path, value_slice, device, stamp; read after the fields above, see abi4_prefix).
    for name, data in abi4_validate_seeds():
        write("validate", "abi4-" + name, data)
    # exact: byte 0 % 4 == 3 selects the batched (tensor.hpp) mode, else one head.
    for i in range(24):
        write("exact", "%02d" % i, [3 if i % 3 == 0 else i % 3] + rb(rng.choice([12, 40, 90, 160])))
    write("exact", "zeros", [0] * 64)
    write("exact", "batched-zeros", [3] + [0] * 64)
    # rounded: byte 0 % 4 picks fp32 / bf16 / fp16 / fp64, byte 1 % 3 == 0 allows raw bit patterns.
    for i in range(32):
        write("rounded", "%02d" % i, [i % 4, (i // 4) % 3] + rb(rng.choice([16, 64, 160, 320])))
    for t in range(4):
        write("rounded", "zeros-%d" % t, [t] + [0] * 96)
        write("rounded", "nan-%d" % t, [t, 0] + [0xFF] * 200)


if __name__ == "__main__":
    main()
