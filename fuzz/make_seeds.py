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


def main():
    rng = random.Random(20250105)
    rb = lambda n: [rng.randrange(256) for _ in range(n)]
    # validate: the first ~45 bytes build a valid struct, the rest mutate it.
    for i in range(24):
        write("validate", "%02d" % i, rb(rng.choice([20, 40, 60, 90])))
    write("validate", "zeros", [0] * 64)
    write("validate", "ones", [0xFF] * 64)
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
