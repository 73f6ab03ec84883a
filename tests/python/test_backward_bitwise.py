"""tools/backward_bitwise.py's compare step on the CPU: it must report a one-bit difference in
any tensor (and a NaN against a number), and nothing for equal files (NaN where NaN included).
Its run step needs a GPU: docs/prefill_notes.md, backward v11."""
import importlib.util
import os

import pytest
import torch

_spec = importlib.util.spec_from_file_location(
    "backward_bitwise",
    os.path.join(os.path.dirname(__file__), "..", "..", "tools", "backward_bitwise.py"))
bb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bb)


def _files(tmp_path, a, b):
    pa, pb = tmp_path / "a.pt", tmp_path / "b.pt"
    torch.save(a, pa)
    torch.save(b, pb)
    return str(pa), str(pb)


def _results(gen):
    return {ci: [torch.randn(3, 5, generator=gen).to(dt) for _ in range(4)]
            for ci, dt in enumerate((torch.float32, torch.bfloat16, torch.float16))}


def test_equal_files_pass_nan_where_nan_included(tmp_path, capsys):
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    a = _results(gen)
    a[1][2][0, 0] = float("nan")
    b = {ci: [x.clone() for x in ts] for ci, ts in a.items()}
    assert bb.compare(*_files(tmp_path, a, b)) == 0
    assert "differing tensors 0" in capsys.readouterr().out


def test_one_bit_or_one_nan_fails(tmp_path, capsys):
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    a = _results(gen)
    for ci, j, dt in ((0, 1, torch.int32), (1, 3, torch.int16), (2, 0, torch.int16)):
        b = {c: [x.clone() for x in ts] for c, ts in a.items()}
        bits = b[ci][j].view(dt)
        bits[1, 2] ^= 1  # the last bit of one element
        assert bb.compare(*_files(tmp_path, a, b)) == 1
        assert f"case {ci} tensor {j}: differs" in capsys.readouterr().out
    for first in (0, 1):  # a NaN against a number, in either file
        pair = [a, {c: [x.clone() for x in ts] for c, ts in a.items()}]
        pair[first] = {c: [x.clone() for x in ts] for c, ts in a.items()}
        pair[first][2][2][0, 4] = float("nan")
        assert bb.compare(*_files(tmp_path, pair[0], pair[1])) == 1
        assert "case 2 tensor 2: differs" in capsys.readouterr().out


def test_unreadable_files_are_a_clear_error(tmp_path):
    good = tmp_path / "good.pt"
    torch.save({0: [torch.zeros(2)]}, good)
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    torch.save([1, 2], tmp_path / "list.pt")
    for bad, words in (("missing.pt", "cannot read"), ("junk.pt", "cannot read"),
                       ("list.pt", "is not a file")):
        with pytest.raises(SystemExit) as e:
            bb.compare(str(good), str(tmp_path / bad))
        assert words in str(e.value) and bad in str(e.value)
