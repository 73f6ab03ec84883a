#!/usr/bin/env python3
"""Smoke test of kla_report (ctest `report.smoke`): runs the quick sweep and checks that every
CSV and every report section is there, that the numbers parse, that the MPFR ground truth agrees
with the reference library's own Mpfr/Rational runs, that a nested report (a folder with its own
report.md, as docs/report/gpu) survives the replacement and is linked, that the CUDA columns are
complete where they ran and the provenance says "GPU: none" where they did not, and that a bad
option exits 2 writing nothing. Usage: check_report.py KLA_REPORT_BINARY OUT_DIR"""
import csv
import math
import os
import shutil
import subprocess
import sys

binary, out = sys.argv[1], sys.argv[2]
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)


def rows(name):
    with open(os.path.join(out, name), newline="") as f:
        return list(csv.DictReader(f))


# Plots only when the Debian python the program calls has matplotlib.
plots = subprocess.run(["/usr/bin/python3", "-c", "import matplotlib"],
                       capture_output=True).returncode == 0 if os.path.exists("/usr/bin/python3") else False
shutil.rmtree(out, ignore_errors=True)
# A previous report with a nested one (the GPU report lives in docs/report/gpu this way).
os.makedirs(os.path.join(out, "gpu"))
with open(os.path.join(out, "report.md"), "w") as f:
    f.write("# previous report\n")
with open(os.path.join(out, "gpu", "report.md"), "w") as f:
    f.write("# nested\nGPU report: the cuda-* columns\n")
args = [binary, "--quick", "--out", out, "--threads", "2"] + ([] if plots else ["--no-plots"])
r = subprocess.run(args, capture_output=True, text=True)
sys.stderr.write(r.stderr[-3000:])
check(r.returncode == 0, f"kla_report --quick exited {r.returncode}")

if r.returncode == 0:
    report = open(os.path.join(out, "report.md")).read()
    for n in range(1, 9):
        check(f"\n## {n}. " in report, f"report.md lacks section {n}")
    check(os.path.exists(os.path.join(out, "gpu", "report.md")), "nested report gpu/ was not kept")
    check("(gpu/report.md)" in report, "report.md does not link the nested report gpu/")
    check(report.count("**Finding:**") == 8, "each of the 8 sections must open with a Finding")
    expected = {
        "sec2_eps_knorm.csv": ["variant", "algo", "eps", "knorm", "rel_err", "nonfinite"],
        "sec3_defect.csv": ["variant", "eps", "knorm", "max_defect"],
        "sec4_length.csv": ["variant", "algo", "decay", "T", "rel_err"],
        "sec5_forms.csv": ["variant", "family", "form", "order", "chunk", "rel_err"],
        "sec6_stress.csv": ["case", "variant", "algo", "rel_err", "nonfinite"],
        "sec7_contraction.csv": ["variant", "eta", "eps", "tokens", "increased"],
        "eps_storage.csv": ["eps", "dtype", "stored", "class"],
        "groundtruth_check.csv": ["check", "max_rel_diff"],
    }
    for name, cols in expected.items():
        path = os.path.join(out, name)
        check(os.path.exists(path), f"missing {name}")
        if not os.path.exists(path):
            continue
        data = rows(name)
        check(len(data) > 0, f"{name} is empty")
        for c in cols:
            check(c in data[0], f"{name} lacks column {c}")
        for row in data:
            for c in cols:
                if c in ("rel_err", "max_defect", "stored", "max_rel_diff", "eps", "knorm"):
                    try:
                        float(row[c])
                    except ValueError:
                        check(False, f"{name}: {c}={row[c]!r} does not parse")
    # The MPFR ground truth must agree with kla::ref's Mpfr and Rational instantiations.
    for row in rows("groundtruth_check.csv"):
        check(float(row["max_rel_diff"]) < 1e-25, f"ground truth vs {row['check']}: {row['max_rel_diff']}")
    # Exact rationals reproduce the interpolation formula exactly.
    for row in rows("sec3_defect.csv"):
        if row["variant"] == "exact":
            check(float(row["max_defect"]) == 0.0, f"exact defect not 0: {row}")
    # fp32 on ordinary inputs: finite and small.
    for row in rows("sec2_eps_knorm.csv"):
        if row["variant"] == "fp32" and float(row["knorm"]) == 1.0:
            e = float(row["rel_err"])
            check(math.isfinite(e) and e < 1e-4, f"fp32 error at |k|=1 too large: {row}")
    # The CUDA columns: all five where a GPU ran them, otherwise none, and the provenance says
    # which. The three ACCURATE ones in every section; the two FAST ones (chunk64/raw, no
    # per-token trace) in every section but the per-token ones (3 and 7).
    cuda = sorted({r["variant"] for r in rows("sec2_eps_knorm.csv") if r["variant"].startswith("cuda-")})
    if cuda:
        fast = ["cuda-bf16-fast", "cuda-fp16-fast"]
        check(cuda == ["cuda-bf16", "cuda-bf16-fast", "cuda-fp16", "cuda-fp16-fast", "cuda-fp32"],
              f"CUDA columns {cuda}")
        check("GPU report:" in report, "a report with CUDA columns must say it is a GPU report")
        for name in ("sec2_eps_knorm.csv", "sec3_defect.csv", "sec4_length.csv", "sec5_forms.csv",
                     "sec6_stress.csv", "sec7_contraction.csv"):
            have = {r["variant"] for r in rows(name)}
            want = set(cuda) - (set(fast) if name in ("sec3_defect.csv", "sec7_contraction.csv")
                                else set())
            check(want <= have, f"{name} lacks CUDA columns: {want - have}")
            if name in ("sec3_defect.csv", "sec7_contraction.csv"):
                check(not (set(fast) & have), f"{name} has FAST columns, which have no trace")
        for row in rows("sec2_eps_knorm.csv"):
            if row["variant"] == "cuda-fp32" and float(row["knorm"]) == 1.0:
                e = float(row["rel_err"])
                check(math.isfinite(e) and e < 1e-4, f"cuda-fp32 error at |k|=1 too large: {row}")
    else:
        check("| GPU | none (CPU reference columns only)" in report,
              "without CUDA columns the provenance must say GPU: none (CPU reference columns only)")
    # The arithmetic models (arith_models.cpp) run chunk64/raw in §2 and §6, and FAST keeps its
    # contract there: no larger an error than the one-part arithmetic's (a one-part NaN/Inf
    # counts as FAST's win), and never NaN/Inf itself.
    models = ["bf16-fast-model", "bf16-onepart-model", "fp16-fast-model", "fp16-onepart-model"]
    for name in ("sec2_eps_knorm.csv", "sec6_stress.csv"):
        have = {r["variant"] for r in rows(name)}
        check(set(models) <= have, f"{name} lacks the arithmetic models: {set(models) - have}")
    s6 = {(r["case"], r["variant"]): r for r in rows("sec6_stress.csv")
          if r["algo"] == "chunk64/raw"}
    for (case, variant), r in s6.items():
        # the FAST model, and the FAST kernels (cuda-<dt>-fast) in a GPU report
        if not (variant.endswith("-fast-model") or variant.endswith("-fast")):
            continue
        check(int(r["nonfinite"]) == 0, f"FAST NaN/Inf on {case}: {r}")
        d = variant.replace("cuda-", "").split("-")[0]
        one = s6.get((case, d + "-onepart-model"))
        if one and int(one["nonfinite"]) == 0:
            check(float(r["rel_err"]) <= float(one["rel_err"]),
                  f"FAST above the one-part arithmetic on {case}: {r} vs {one}")
    # fp16 stores 1e-9 as 0 and 1e-6 as a subnormal.
    st = {(r["eps"], r["dtype"]): r["class"] for r in rows("eps_storage.csv")}
    check(st.get(("1e-09", "fp16")) == "zero", "fp16 should flush eps=1e-9 to zero")
    check(st.get(("1e-06", "fp16")) == "subnormal", "fp16 should store eps=1e-6 as subnormal")
    if plots:
        for png in ["sec2_heatmap.png", "sec3_defect.png", "sec4_length.png", "sec5_forms.png",
                    "sec6_stress.png", "sec7_contraction.png"]:
            check(os.path.getsize(os.path.join(out, png)) > 1000, f"plot {png} missing or empty")
        check("Plots are missing" not in report, "report.md says plots are missing")

# Bad usage: exit 2, nothing written.
bad_out = out + "-bad"
shutil.rmtree(bad_out, ignore_errors=True)
for bad in (["--dk", "0"], ["--frobnicate"], ["--max-len", "abc"], ["--quick", "--full"]):
    r = subprocess.run([binary, "--out", bad_out] + bad, capture_output=True, text=True)
    check(r.returncode == 2, f"{bad}: exit {r.returncode}, expected 2")
    check("kla_report:" in r.stderr, f"{bad}: no error message")
    check(not os.path.exists(bad_out), f"{bad}: wrote {bad_out}")

if failures:
    print("report.smoke FAILED:\n  " + "\n  ".join(failures))
    sys.exit(1)
print(f"report.smoke passed ({'with' if plots else 'without'} plots)")
