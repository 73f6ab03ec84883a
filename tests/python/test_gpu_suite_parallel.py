"""tools/gpu_suite_parallel.py on the CPU, with a stub in place of tools/gpu_suite.sh: every step
the suite lists runs in exactly one group; the summary has each finished step's row, names the
failed and the unfinished ones and how to rerun the latter; the exit status is 0 only when every
step ran and passed. Also: gpu_suite.sh's own `list` names the steps it runs."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TOOL = os.path.join(ROOT, "tools", "gpu_suite_parallel.py")

# The stub: `list` prints its steps; a run writes a gpu_suite.sh-style row for each step that
# KLA_SUITE_STEPS selects ('bad' fails, 'mutant-*' is rejected, 'slow' outlives the limit) and
# records which GPU it ran on. 'slow' comes last, so whichever group it joins, it is the only step
# left running when that group meets its limit.
STUB = r"""
steps="validate kernels bad mutant-one mutant-two python slow"
if [[ ${1:-} == list ]]; then printf '%s\n' $steps; exit 0; fi
: > "$OUT/steps.md"
for s in $steps; do
  [[ $s =~ ^(${KLA_SUITE_STEPS})$ ]] || continue
  echo "$s $CUDA_VISIBLE_DEVICES" >> "$OUT/ran.txt"
  case $s in
    slow) sleep 30 & echo $! > "$OUT/slow.pid"; wait ;;
    bad) echo "| $s |   1 |      3 |      1 |       0 |         - |     1s | - |" >> "$OUT/steps.md" ;;
    mutant-*) echo "| $s | rejected by test_cuda_kernels (2 failed tests) (1s) |" >> "$OUT/steps.md" ;;
    *) echo "| $s |   0 |      5 |      0 |       0 |         - |     1s | - |" >> "$OUT/steps.md" ;;
  esac
done
"""


def run_tool(tmp_path, *args, stub=STUB, **extra):
    suite = tmp_path / "suite.sh"
    suite.write_text(stub)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update(KLA_SUITE=str(suite), OUT=str(out), **extra)
    r = subprocess.run([sys.executable, TOOL, *args], env=env, capture_output=True, text=True,
                       timeout=60)
    return r, out


def running(pid):
    """The process exists and is not a zombie (one whose parent died waits for a reaper that a
    container's init may not be)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def ran(out):
    lines = []
    for g in sorted(os.listdir(out)):
        path = out / g / "ran.txt"
        if path.exists():
            lines += path.read_text().split("\n")
    return [line.split() for line in lines if line]


def test_every_step_once_failures_and_unfinished_named(tmp_path):
    r, out = run_tool(tmp_path, "--gpus", "2", "--groups-per-gpu", "2", "--limit", "5",
                      "--every", "1")
    assert r.returncode == 1, r.stdout + r.stderr
    # a progress line while the slow group runs: all but 'slow' finished, one group left
    assert "6/7 steps finished, 1 groups running" in r.stdout
    steps = [s for s, _ in ran(out)]
    assert sorted(steps) == sorted("validate kernels bad mutant-one mutant-two python slow".split())
    assert {gpu for _, gpu in ran(out)} == {"0", "1"}  # groups alternate over the GPUs
    summary = (out / "summary.md").read_text()
    for s in ("validate", "kernels", "bad", "mutant-one", "mutant-two", "python"):
        assert f"| {s} |" in summary
    assert "not finished (a group's time limit" in summary and summary.count("slow") == 2
    assert "--steps 'slow'" in summary
    assert "FAILED steps: bad" in summary
    assert "(time limit)" in (out / "groups.md").read_text()
    # the whole group was stopped at its limit, its children too (no test left on a GPU)
    pid = int(next(out.glob("g*/slow.pid")).read_text())
    assert not running(pid)


def test_all_passing_exits_zero_and_steps_filter(tmp_path):
    r, out = run_tool(tmp_path, "--gpus", "1", "--steps", "validate|kernels|mutant-.*", "--tar")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (out / "suite.tgz").exists()
    assert sorted(s for s, _ in ran(out)) == ["kernels", "mutant-one", "mutant-two", "validate"]
    assert "every finished step passed" in (out / "summary.md").read_text()


def test_visible_devices_are_the_gpus(tmp_path):
    # a caller keeping GPUs 0 and 1 for other work: the groups go to 5 and 7 only
    r, out = run_tool(tmp_path, "--groups-per-gpu", "2", "--steps", "validate|kernels|python",
                      CUDA_VISIBLE_DEVICES="5,7")
    assert r.returncode == 0, r.stdout + r.stderr
    assert {gpu for _, gpu in ran(out)} == {"5", "7"}
    assert "| 7 |" in (out / "groups.md").read_text()
    (tmp_path / "b").mkdir()
    r, out = run_tool(tmp_path / "b", "--gpus", "1", "--steps", "validate",
                      CUDA_VISIBLE_DEVICES="5,7")
    assert r.returncode == 0 and {gpu for _, gpu in ran(out)} == {"5"}
    r, _ = run_tool(tmp_path, "--gpus", "3", CUDA_VISIBLE_DEVICES="5,7")
    assert r.returncode != 0 and "CUDA_VISIBLE_DEVICES names 2" in r.stderr


def test_groups_balance_by_cost():
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import gpu_suite_parallel as gp
    steps = ["racecheck-backward", "python-fla", "validate", "kernels", "mutant-a", "mutant-b"]
    groups = gp.make_groups(steps, 2)
    assert sorted(sum(groups, [])) == sorted(steps)
    # the two longest steps (364 s, 400 s) never share a group
    assert not any({"racecheck-backward", "python-fla"} <= set(g) for g in groups)


@pytest.mark.skipif(not os.path.exists("/bin/bash"), reason="needs bash")
def test_gpu_suite_lists_its_steps():
    out = subprocess.run(["bash", os.path.join(ROOT, "tools", "gpu_suite.sh"), "list"],
                         capture_output=True, text=True, timeout=30)
    steps = out.stdout.split()
    assert out.returncode == 0
    for s in ("validate", "kernels-wy_transposed", "backward", "python", "python-fla",
              "mutant-split_fold_transition_skipped", "racecheck-backward", "wgmma_latency"):
        assert s in steps
    assert len(steps) == len(set(steps))


def test_gpu_suite_runs_only_the_selected_steps(tmp_path):
    """gpu_suite.sh itself without a GPU or binaries: KLA_SUITE_STEPS picks the steps that run
    (here they fail, exit 127: no binaries), the rest are 'not run', and each run step's row is in
    steps.md as soon as it ends (what gpu_suite_parallel.py reads from a group it had to stop)."""
    out = tmp_path / "out"
    env = dict(os.environ, KLA_GPU_DIST=str(tmp_path / "dist"), OUT=str(out),
               KLA_SUITE_STEPS="validate|example_c")
    r = subprocess.run(["bash", os.path.join(ROOT, "tools", "gpu_suite.sh")], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0  # the two steps failed
    rows = (out / "steps.md").read_text().splitlines()
    assert [row.split("|")[1].strip() for row in rows] == ["validate", "example_c"]
    assert all(row.split("|")[2].strip() == "127" for row in rows)
    summary = (out / "summary.md").read_text()
    assert "| kernels                  | not run (KLA_SUITE_STEPS) |" in summary
    assert "| python-fla               | not run (KLA_SUITE_STEPS) |" in summary or \
        "python3 has no torch" in summary
