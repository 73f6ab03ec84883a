"""bench/make_performance_md.py and the benchmarks' record of what they timed, on the CPU: a page
regenerated from runs of several scripts says where each section comes from (the status block,
the command, the library's BUILD_INFO.json), links only the raw files the run wrote, and can be
regenerated from the committed copies of earlier runs (a section's file already in docs/). The
benchmarks themselves need a GPU (docs/performance.md, 'How to reproduce')."""
import json
import os
import shutil
import sys

from bench_scripts import load as _load

_DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "performance")


def test_build_info_is_read_beside_the_library(tmp_path):
    sbs = _load("side_by_side")
    lib = tmp_path / "dist" / "libkla_cuda.so.5"
    lib.parent.mkdir()
    assert sbs.build_info_beside(str(lib)) == {}
    info = {"commit": "0123abc", "uncommitted_files_in_cuda_bench": 0}
    (lib.parent / "BUILD_INFO.json").write_text(json.dumps(info))
    assert sbs.build_info_beside(str(lib)) == info


def test_copy_in_skips_the_file_itself(tmp_path):
    md = _load("make_performance_md")
    src, dst = tmp_path / "a.json", tmp_path / "b.json"
    src.write_text("{}")
    md.copy_in(str(src), str(src))  # shutil.copyfile would raise SameFileError
    md.copy_in(str(src), str(dst))
    assert dst.read_text() == "{}"


def test_page_says_where_each_section_comes_from(tmp_path, monkeypatch):
    md, split = _load("make_performance_md"), _load("bench_split")
    run = tmp_path / "run"
    run.mkdir()
    for name in ("side_by_side.json", "prefill_vs_T.png"):  # a committed run's output
        shutil.copy(os.path.join(_DOCS, name), run)
    split_dir = tmp_path / "split"
    split_dir.mkdir()
    rows = json.load(open(os.path.join(_DOCS, "split.json")))
    (split_dir / "split.json").write_text(json.dumps(rows))
    (split_dir / "split.md").write_text(split.table(rows["rows"], rows["meta"]))
    status = tmp_path / "status.md"
    status.write_text("**Status** (test).\n\n- first bullet\n  - nested\n")
    why = tmp_path / "why.md"
    why.write_text("What the rows show: a test note.\n")
    docs = tmp_path / "docs"
    monkeypatch.setattr(sys, "argv", [
        "make_performance_md.py", str(run), "--docs", str(docs), "--status", str(status),
        "--command", "`side_by_side.py --only x` on two GPUs", "--split", str(split_dir),
        "--split-why", str(why)])
    md.main()
    page = (docs / "performance.md").read_text()
    assert "> **Status** (test).\n>\n> - first bullet\n>   - nested\n" in page
    assert "| command | `side_by_side.py --only x` on two GPUs |" in page
    assert "from the run the table below names (its command row)" in page
    assert "### Sequence split (issue 26; `bench/bench_split.py`)" in page
    assert f"commit `{rows['meta']['commit']}`" in page  # the split table names its own build
    assert "What the rows show: a test note." in page
    assert (docs / "performance" / "split.json").exists()
    # no kla_bench_cuda.json in the run: the page links none
    assert "[side_by_side.json](performance/side_by_side.json)." in page
    assert "kla_bench_cuda.json](performance" not in page
