"""bench/plot_ab_backward.py on the CPU: the kernel stages its bars are made of, the medians over
rounds, failed runs left out, repeated variant names told apart by their file, and a figure drawn
from a file as bench/ab_backward.py writes it. The A/B itself needs a GPU."""
import json
import os
import subprocess
import sys

import pytest
from bench_scripts import BENCH
from bench_scripts import load as _load

KERNELS = {
    "void kla::kernels::bwd_prep_bf16_beside_scan_kernel<__nv_bfloat16>(kla::kernels:":
        "prep beside the scan",
    "void kla::kernels::bwd_prep_bf16_kernel<__nv_bfloat16, true>(kla::kern": "prep",
    "void kla::kernels::bwd_chain_windows_kernel<__nv_bfloat16>(kla::kernel": "chain windows",
    "void kla::kernels::bwd_state_grad_segments_kernel<__nv_bfloat16>(kla::": "chain segments",
    "void kla::kernels::bwd_state_backward_bf16_kernel<__nv_bfloat16, true>": "state-gradient scan",
    "void kla::kernels::bwd_input_grads_bf16_kernel<__nv_bfloat16, true>(kl": "input gradients",
    "void kla::kernels::bwd_chunk_grads_kernel<float, false, 0>(kla::kernels": "input gradients",
    "Memset (Device)": "other",
}


@pytest.mark.parametrize("kernel,stage", sorted(KERNELS.items()))
def test_each_kernel_has_its_stage(kernel, stage):
    assert _load("plot_ab_backward").stage_of(kernel) == stage


def _run(variant, rnd, bwd, prep, grads):
    kernels = {"void kla::kernels::bwd_prep_bf16_kernel<__nv_bfloat16, true>(": prep,
               "void kla::kernels::bwd_input_grads_bf16_kernel<__nv_bfloat16, true>": grads,
               "Memset (Device)": 0.01}
    row = {"bwd_ms": bwd, "fwd_bwd_ms": bwd + 1.0, "grads_sha1": "0" * 40, "kernels_ms": kernels}
    return {"variant": variant, "round": rnd, "library": "/x", "env": {}, "device": "GPU X",
            "1x8192": row}


def test_medians_over_rounds_failed_runs_left_out_names_kept_apart(tmp_path):
    pa = _load("plot_ab_backward")
    a = tmp_path / "a.json"
    a.write_text(json.dumps({"saved": True, "reps": 10, "runs": [
        _run("base", 1, 1.0, 0.30, 0.60), _run("new", 1, 0.9, 0.20, 0.60),
        _run("base", 2, 1.2, 0.34, 0.62), {"variant": "new", "round": 2, "error": "boom"},
        _run("base", 3, 1.1, 0.32, 0.70)]}))
    b = tmp_path / "b.json"
    b.write_text(json.dumps({"saved": True, "reps": 10, "runs": [_run("base", 1, 2.0, 1.0, 1.0)]}))
    data, devices = pa.load([str(a), str(b)])
    assert list(data) == ["base", "new", "base (b)"]
    assert devices == ["GPU X"]
    r = data["base"]["1x8192"]
    assert r["bwd_ms"] == pytest.approx(1.1)
    assert r["stages"] == pytest.approx({"prep": 0.32, "input gradients": 0.62, "other": 0.01})
    assert data["new"]["1x8192"]["bwd_ms"] == pytest.approx(0.9)  # its failed round left out
    assert data["base (b)"]["1x8192"]["bwd_ms"] == pytest.approx(2.0)


def test_a_file_without_finished_runs_is_refused(tmp_path):
    pa = _load("plot_ab_backward")
    p = tmp_path / "failed.json"
    p.write_text(json.dumps({"runs": [{"variant": "x", "round": 1, "error": "boom"}]}))
    with pytest.raises(SystemExit, match="no finished runs"):
        pa.load([str(p)])
    with pytest.raises(SystemExit, match="cannot read"):
        pa.load([str(tmp_path / "missing.json")])


def _python_with_matplotlib():
    """This Python where it has matplotlib, else Debian's (tools/install_deps.sh installs
    python3-matplotlib there; the test environment's venv does not carry it), else None."""
    for py in (sys.executable, "/usr/bin/python3"):
        if os.path.exists(py) and subprocess.run([py, "-c", "import matplotlib"],
                                                 capture_output=True).returncode == 0:
            return py
    return None


def test_the_figure_is_drawn_from_the_command_line(tmp_path):
    py = _python_with_matplotlib()
    if py is None:
        pytest.skip("no Python here has matplotlib (tools/install_deps.sh installs it)")
    p = tmp_path / "ab.json"
    runs = [_run("base", 1, 1.0, 0.3, 0.6), _run("new", 1, 0.9, 0.2, 0.6)]
    p.write_text(json.dumps({"runs": runs}))
    out = tmp_path / "breakdown.png"
    r = subprocess.run([py, os.path.join(BENCH, "plot_ab_backward.py"), str(p), "--out", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10000
