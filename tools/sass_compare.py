#!/usr/bin/env python3
"""Compares the SASS of two builds of libkla_cuda, kernel by kernel.

  python3 tools/sass_compare.py OLD.so NEW.so [--rename OLD_SUBSTR=NEW_SUBSTR ...]

Dumps both with `cuobjdump -sass` (on PATH), splits the listing per (architecture, kernel), and
reports kernels that are missing on either side or whose instruction lists differ. A refactor
that must not change the kernels' arithmetic (docs/architecture.md) shows "identical" for every
kernel. --rename maps a kernel renamed by the refactor (a substring of its mangled name) so the
pair is compared. --ignore-param-offsets reads every kernel-parameter operand (c[0x0][offset]) as
the same: a field appended to a parameter struct moves the parameters after it, which changes those
offsets and nothing else. Exit status 1 when anything differs.
cuobjdump and nvdisasm come with the CUDA toolkit; where a toolkit lacks them (this project's
build machines have nvcc and ptxas only), PyPI's wheels nvidia-cuda-cuobjdump and
nvidia-cuda-nvdisasm carry both: unzip them and put their bin folders on PATH.
"""
import argparse
import re
import subprocess
import sys


PARAM_OPERAND = re.compile(r"c\[0x0\]\[0x[0-9a-f]+\]")


def kernels(path, ignore_param_offsets=False):
    text = subprocess.run(["cuobjdump", "-sass", path], check=True, capture_output=True,
                          text=True).stdout
    out, arch, key, body = {}, "?", None, []
    for line in text.splitlines():
        m = re.match(r"\s*code for (sm_\w+)", line)
        if m:
            arch = m.group(1)
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            if key:
                out[key] = body
            key, body = (arch, m.group(1)), []
            continue
        if key and re.search(r"/\*[0-9a-f]{4,}\*/", line):
            # The instruction alone: the address comment and the encoding words go.
            ins = re.sub(r"/\*[0-9a-f]{4,}\*/", "", line).split(";")[0].strip()
            if ins and ignore_param_offsets:
                ins = PARAM_OPERAND.sub("c[0x0][param]", ins)
            if ins:
                body.append(ins)
    if key:
        out[key] = body
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--rename", action="append", default=[])
    ap.add_argument("--ignore-param-offsets", action="store_true")
    a = ap.parse_args()
    old = kernels(a.old, a.ignore_param_offsets)
    new = kernels(a.new, a.ignore_param_offsets)
    renames = [r.split("=", 1) for r in a.rename]

    def mapped(key):
        arch, name = key
        for s, t in renames:
            name = name.replace(s, t)
        return (arch, name)

    old = {mapped(k): v for k, v in old.items()}
    bad = 0
    for key in sorted(set(old) | set(new)):
        if key not in new:
            print(f"only in old: {key[0]} {key[1]}")
            bad += 1
        elif key not in old:
            print(f"only in new: {key[0]} {key[1]}")
            bad += 1
        elif old[key] != new[key]:
            n = sum(1 for x, y in zip(old[key], new[key]) if x != y) + abs(len(old[key]) - len(new[key]))
            print(f"differs ({n} of {len(new[key])} instructions): {key[0]} {key[1]}")
            bad += 1
    print(f"{len(new)} kernels compared, {bad} differ or are unmatched" if bad else
          f"{len(new)} kernels, SASS identical")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
