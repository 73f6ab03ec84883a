"""tools/sass_compare.py on made-up cuobjdump listings (CPU; a stub cuobjdump on PATH): two builds
whose kernels differ only in kernel-parameter offsets (a field appended to a parameter struct moves
the parameters after it) compare identical under --ignore-param-offsets and differ without it; an
instruction that really changed is a difference either way."""
import importlib.util
import os
import stat
import sys

import pytest

_spec = importlib.util.spec_from_file_location(
    "sass_compare", os.path.join(os.path.dirname(__file__), "..", "..", "tools", "sass_compare.py"))
sc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sc)


def _listing(param_offset, opcode="IMAD"):
    return "\n".join([
        "\tcode for sm_90a",
        "\t\tFunction : _ZN3kla7kernels6kernelEv",
        f"        /*0000*/                   MOV R1, c[0x0][0x28] ;     /* 0x00000a0000017a02 */",
        f"        /*0010*/                   LDC R2, c[0x0][{param_offset}] ;  /* 0x0000000000027b82 */",
        f"        /*0020*/                   {opcode} R3, R2, R2, RZ ;   /* 0x0000000202037224 */",
        ""])


@pytest.fixture
def builds(tmp_path, monkeypatch):
    """Writes two listings and a cuobjdump stub that prints the one named by its last argument."""
    def make(old, new):
        (tmp_path / "old.so").write_text(old)
        (tmp_path / "new.so").write_text(new)
        stub = tmp_path / "cuobjdump"
        stub.write_text(f"#!{sys.executable}\nimport sys\nprint(open(sys.argv[-1]).read())\n")
        stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
        return str(tmp_path / "old.so"), str(tmp_path / "new.so")
    return make


def _run(monkeypatch, *argv):
    monkeypatch.setattr(sys, "argv", ["sass_compare.py", *argv])
    return sc.main()


def test_moved_parameters_are_identical_only_when_ignored(builds, monkeypatch, capsys):
    old, new = builds(_listing("0x210"), _listing("0x218"))
    assert _run(monkeypatch, old, new) == 1
    assert "differs (1 of 3 instructions)" in capsys.readouterr().out
    assert _run(monkeypatch, old, new, "--ignore-param-offsets") == 0
    assert "SASS identical" in capsys.readouterr().out


def test_a_changed_instruction_still_differs(builds, monkeypatch, capsys):
    old, new = builds(_listing("0x210"), _listing("0x218", opcode="IADD3"))
    assert _run(monkeypatch, old, new, "--ignore-param-offsets") == 1
    assert "differs (1 of 3 instructions)" in capsys.readouterr().out
