"""tools/ncu_sass_stalls.py on a made-up export (CPU): every kernel's rows are read by that
kernel's own header, whose columns differ between kernels (the fault that misattributed two
kernels' stall reasons in round 2, session 19); a second profile of a kernel is left out; the
regions between block barriers add up."""
import csv
import importlib.util
import io
import os
import random

_spec = importlib.util.spec_from_file_location(
    "ncu_sass_stalls",
    os.path.join(os.path.dirname(__file__), "..", "..", "tools", "ncu_sass_stalls.py"))
ns = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ns)

_REASONS = ["stall_barrier", "stall_long_sb", "stall_short_sb", "stall_wait"]


def _kernel(w, name, extra_column, rows):
    """One kernel's section: its name row, its header (with an extra column before the stall
    columns when extra_column, as ncu writes for a kernel with local-memory traffic), its rows."""
    w.writerow(["Kernel Name", f"void kla::kernels::{name}<__nv_bfloat16>(kla::kernels::BwdParams)"])
    head = ["Address", "Source", ns.SAMPLES, "Instructions Executed"]
    if extra_column:
        head.append("L2 Theoretical Sectors Local")
    w.writerow(head + _REASONS + [r + " (Not Issued)" for r in _REASONS])
    for addr, src, reasons in rows:
        row = [addr, src, str(sum(reasons)), "1"] + (["7"] if extra_column else [])
        w.writerow(row + [str(x) for x in reasons] + ["0"] * len(reasons))


def _export(tmp_path, sections):
    buf = io.StringIO()
    w = csv.writer(buf)
    for s in sections:
        _kernel(w, *s)
    p = tmp_path / "sass.csv"
    p.write_text(buf.getvalue())
    return str(p)


def test_each_kernel_read_by_its_own_header(tmp_path):
    rnd = random.Random(int.from_bytes(os.urandom(4), "little"))
    a = [(f"0x{i:05x}", "HMMA.16816.F32.BF16 R0, R4, R8, R0", [rnd.randrange(1, 50) for _ in _REASONS])
         for i in range(6)]
    a.append(("0x00100", "BAR.SYNC.DEFER_BLOCKING 0x0", [rnd.randrange(1, 50), 0, 0, 0]))
    b = [(f"0x{i:05x}", "LDSM.16.M88.4 R4, [R2]", [rnd.randrange(1, 50) for _ in _REASONS])
         for i in range(5)]
    # the kernel without the extra column first, as in session 19's export, then one with it
    path = _export(tmp_path, [("first_kernel", False, a), ("second_kernel", True, b),
                              ("first_kernel", True, b)])  # a second profile: left out
    prof = ns.read_profile(path)
    assert list(prof) == ["first_kernel", "second_kernel"]
    for name, rows in (("first_kernel", a), ("second_kernel", b)):
        got = ns.stall_reasons(prof[name])
        want = {r[len("stall_"):]: sum(x[2][i] for x in rows) for i, r in enumerate(_REASONS)}
        assert got == want, name
    regions = ns.regions(prof["first_kernel"])
    assert [r[3] for r in regions] == ["BAR.SYNC.DEFER_BLOCKING"]
    assert regions[0][1] == len(a) and regions[0][2] == sum(sum(x[2]) for x in a)
    out = io.StringIO()
    ns.report(prof, "second", top=2, out=out)
    assert "second_kernel" in out.getvalue() and "first_kernel" not in out.getvalue()


def test_row_that_does_not_match_its_header_is_an_error(tmp_path):
    path = _export(tmp_path, [("k", False, [("0x00000", "NOP", [1, 2, 3, 4])])])
    text = open(path).read().splitlines()
    text[-1] += ",9"  # one column more than the header
    open(path, "w").write("\n".join(text) + "\n")
    try:
        ns.read_profile(path)
    except ValueError as e:
        assert "does not match its header" in str(e)
    else:
        raise AssertionError("a row longer than its header was read")
