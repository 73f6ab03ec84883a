#!/usr/bin/env python3
"""Sums the warp-state samples of an `ncu --set full` profile by kernel, stall reason, phase and
instruction, from its SASS-level source page:

  ncu --set full -o prof ...                                  # on the GPU machine
  ncu --import prof.ncu-rep --page source --csv --print-source sass > sass.csv
  python3 tools/ncu_sass_stalls.py sass.csv [KERNEL_SUBSTRING] [--top N]

The export repeats a header row ("Address", "Source", ...) before each kernel's instructions, and
the columns differ between kernels (a kernel with local-memory traffic has one more), so every
row is read by the header of its own kernel. (Session 19 read every kernel by the last header and
so attributed two kernels' samples to the neighbouring stall column: docs/prefill_notes.md, round
2 session 20.) A kernel profiled twice is reported once (its first profile).

Per kernel: the stall reasons (share of all samples, above 1%), the regions between block
barriers (BAR.SYNC or the kernel's end) with their share, and the N instructions with the most
samples with their three largest reasons.
"""
import argparse
import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"


def read_profile(path):
    """{kernel: [row dict]} in file order, each row keyed by its own kernel's header."""
    kernels = collections.OrderedDict()
    name, header = None, None
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                # "void kla::kernels::NAME<...>(...)": the name alone
                name = row[1].split("(")[0].split("<")[0].split("::")[-1]
                if name in kernels:
                    name = None  # a second profile of the same kernel: skipped
                else:
                    kernels[name] = []
                header = None
                continue
            if row[0] == "Address":
                header = row
                continue
            if name is None:
                continue
            if header is None or len(row) != len(header):
                raise ValueError(f"{path}: a row of {name} does not match its header")
            kernels[name].append(dict(zip(header, row)))
    return kernels


def _count(row, key):
    return int(row.get(key) or 0)


def stall_reasons(rows):
    """{reason: samples} over the kernel, reasons as ncu names them less the 'stall_' prefix."""
    keys = [k for k in rows[0] if k.startswith("stall_") and "Not Issued" not in k] if rows else []
    return {k[len("stall_"):]: sum(_count(r, k) for r in rows) for k in keys}


def regions(rows):
    """[(first address, instructions, samples, what ends it)] between block barriers."""
    out, start, n, total = [], None, 0, 0
    for r in rows:
        start = start or r["Address"]
        n += 1
        total += _count(r, SAMPLES)
        src = r["Source"].strip()
        if src.startswith("BAR.SYNC") or src.startswith("EXIT"):
            out.append((start, n, total, src.split()[0]))
            start, n, total = None, 0, 0
    if n:
        out.append((start, n, total, "end"))
    return out


def report(kernels, which=None, top=15, out=sys.stdout):
    for name, rows in kernels.items():
        if which and which not in name:
            continue
        total = sum(_count(r, SAMPLES) for r in rows) or 1
        reasons = sorted(stall_reasons(rows).items(), key=lambda kv: -kv[1])
        print(f"== {name}: {len(rows)} instructions, {total} samples", file=out)
        print("   " + ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in reasons
                                if v > 0.01 * total), file=out)
        print("   regions ending at a block barrier (first address, instructions, share):",
              file=out)
        for start, n, samples, end in regions(rows):
            if samples > 0.01 * total:
                print(f"     {start[-5:]} n={n:5d} {100 * samples / total:5.1f}%  {end}", file=out)
        keys = [k for k in rows[0] if k.startswith("stall_") and "Not Issued" not in k]
        for r in sorted(rows, key=lambda r: -_count(r, SAMPLES))[:top]:
            why = sorted(((k[len("stall_"):], _count(r, k)) for k in keys), key=lambda kv: -kv[1])
            print(f"   {r['Address'][-5:]} {100 * _count(r, SAMPLES) / total:5.2f}% "
                  f"{r['Source'].strip()[:60]:60s} {why[:3]}", file=out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("kernel", nargs="?", default=None, help="a substring of the kernels to show")
    ap.add_argument("--top", type=int, default=15, help="instructions listed a kernel")
    a = ap.parse_args(argv)
    report(read_profile(a.csv), a.kernel, a.top)


if __name__ == "__main__":
    main()
