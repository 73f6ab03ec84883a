#!/usr/bin/env python3
"""The GPU suite (tools/gpu_suite.sh) spread over the GPUs of one machine, so that the whole of it
fits one device call: its steps in groups, balanced by what each step took, run side by side (a
few groups a GPU, CUDA_VISIBLE_DEVICES), each group its own output folder; then one summary of
every step, and the steps that did not finish, ready to run in the next call.

    python3 tools/gpu_suite_parallel.py [--gpus N] [--groups-per-gpu M] [--limit SECONDS]
                                        [--steps REGEX] [--tar]   (on the GPU machine, repo root)

Writes $OUT (or build-gpu/dist/out-parallel): gN/ (each group's suite.log, steps.md, summary.md),
groups.md (which steps each group ran, on which GPU, its exit status and time) and summary.md
(every step's row, the unfinished ones, and the --steps argument that reruns them); --tar packs
the groups' folders into suite.tgz beside those two (the device tool returns only a few files a
call). Exit status 0 only when every step ran and passed. KLA_SUITE (the suite script, default tools/gpu_suite.sh) is
what the CPU test replaces with a stub. The environment of gpu_suite.sh (KLA_GPU_DIST, ...) passes
through.
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Seconds a step took with two or three groups a GPU (round 2, session 27: ten groups on four
# H200s; session 28: nine on three, where these are the larger of the two), so upper estimates of
# one alone. Only the balance of the groups depends on them; a step not listed counts as
# DEFAULT_COST, a mutant step as its test binary's whole run (the runner waits for its exit).
# Their sum, about 6,000 s, is more than one 600 s device call on four GPUs holds: session 28
# finished 31 of the 52 steps it then had on three; the summary's rerun line takes the rest to
# the next call.
COST = {
    "validate": 2, "kernels": 87, "props": 35, "kernels-wy16": 105, "kernels-wy8": 96,
    "kernels-wy32": 112, "kernels-wy_transposed": 64, "kernels-tf32": 66, "kernels-generic": 65,
    "props-wy32": 47, "props-wy_transposed": 34, "props-tf32": 25, "backward": 159,
    "accuracy": 102, "accuracy-wy_transposed": 78, "python": 110, "python-fla": 400,
    "example_c": 1, "example_cpp": 1, "memcheck": 97, "racecheck": 166, "memcheck-props": 61,
    "memcheck-backward": 142, "racecheck-backward": 364, "initcheck": 60, "synccheck": 48,
    "memcheck-wy32": 100, "memcheck-wy_transposed": 107, "racecheck-wy_transposed": 121,
    "bench": 75, "wgmma_latency": 5,
}
MUTANT_COST = 130  # a forward mutant step: test_cuda_kernels (64-147 s in session 28)
# a backward one (mutant-bwd_*, mutant-saved_*): test_cuda_backward, 157-198 s
BWD_MUTANT_COST = 185
DEFAULT_COST = 60


def cost(step):
    if step in COST:
        return COST[step]
    if step.startswith(("mutant-bwd_", "mutant-saved_")):  # both run test_cuda_backward
        return BWD_MUTANT_COST
    return MUTANT_COST if step.startswith("mutant-") else DEFAULT_COST


def suite_steps(suite):
    """The step names the suite runs, in its order (gpu_suite.sh list)."""
    out = subprocess.run(["bash", suite, "list"], check=True, capture_output=True, text=True)
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def make_groups(steps, n):
    """Longest first, each to the group with the least work so far: n groups of steps (the groups
    keep the suite's order inside, so a group's log reads like the suite's)."""
    order = {s: i for i, s in enumerate(steps)}
    groups, load = [[] for _ in range(n)], [0] * n
    for s in sorted(steps, key=lambda s: (-cost(s), order[s])):
        i = min(range(n), key=lambda j: (load[j], j))
        groups[i].append(s)
        load[i] += cost(s)
    return [sorted(g, key=order.get) for g in groups if g]


def step_rows(path):
    """{step: its summary row} from a group's steps.md (rows of the steps that finished)."""
    rows = {}
    if os.path.exists(path):
        for line in open(path):
            m = re.match(r"\|\s*([\w.-]+)\s*\|", line)
            if m:
                rows[m.group(1)] = line.rstrip("\n")
    return rows


def row_passed(row):
    """A gpu_suite.sh row passed: a step's exit status 0, or a mutant rejected."""
    cells = [c.strip() for c in row.strip().strip("|").split("|")]
    if len(cells) > 1 and cells[1].startswith("rejected by"):
        return True
    return len(cells) > 1 and cells[1] == "0"


def stop(proc):
    """Stops a group's whole process group (the suite's test binaries, sanitizers and their own
    `timeout`s included, not only its shell): TERM, then KILL after 5 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue
    proc.wait()


def run_groups(procs, limit, t0, progress, every=30.0):
    """Waits for the groups; at t0 + limit stops those still running. Every `every` seconds prints
    progress() (a line on the steps finished so far). Returns each group's (exit status, seconds
    since t0): 124, as timeout(1) says it, for a group stopped at the limit."""
    done, next_line = {}, t0 + every
    while len(done) < len(procs):
        now = time.time()
        for i, p in enumerate(procs):
            if i not in done and p.poll() is not None:
                done[i] = (p.returncode, now - t0)
        if len(done) < len(procs) and now >= t0 + limit:
            for i, p in enumerate(procs):
                if i not in done:
                    stop(p)
                    done[i] = (124, time.time() - t0)
        elif now >= next_line:
            print(f"gpu_suite_parallel: {progress()}, {len(procs) - len(done)} groups running, "
                  f"{now - t0:.0f} s", flush=True)
            next_line += every
        time.sleep(0.2)
    return [done[i] for i in range(len(procs))]


def devices(n):
    """The GPUs the groups are dealt over: the entries of CUDA_VISIBLE_DEVICES where it is set (so
    that a caller can keep some of a machine's GPUs for other work), else 0 .. the count of
    nvidia-smi -L; n > 0 takes the first n of them (or, without CUDA_VISIBLE_DEVICES, 0 .. n-1)."""
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
               if d.strip()]
    if not visible:
        return [str(i) for i in range(n or gpu_count())]
    if n > len(visible):
        sys.exit(f"gpu_suite_parallel: --gpus {n}, but CUDA_VISIBLE_DEVICES names {len(visible)}")
    return visible[:n] if n else visible


def gpu_count():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
        return max(1, sum(1 for line in out.splitlines() if line.startswith("GPU ")))
    except OSError:
        return 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=0,
                    help="GPUs to use (default: those CUDA_VISIBLE_DEVICES names, else "
                    "nvidia-smi -L's)")
    ap.add_argument("--groups-per-gpu", type=int, default=3)
    ap.add_argument("--limit", type=int, default=560, help="seconds a group may take")
    ap.add_argument("--steps", help="only the steps this regex matches whole (a rerun)")
    ap.add_argument("--every", type=float, default=30.0, help="seconds between progress lines")
    ap.add_argument("--tar", action="store_true", help="pack the groups' folders into suite.tgz")
    args = ap.parse_args()
    suite = os.environ.get("KLA_SUITE", os.path.join(ROOT, "tools", "gpu_suite.sh"))
    out = os.environ.get("OUT") or os.path.join(ROOT, "build-gpu", "dist", "out-parallel")
    os.makedirs(out, exist_ok=True)
    steps = suite_steps(suite)
    bad = [s for s in steps if not re.fullmatch(r"[\w-]+", s)]
    if bad:  # the names go into gpu_suite.sh's KLA_SUITE_STEPS, an extended regex, as they are
        sys.exit(f"gpu_suite_parallel: step names must be letters, digits, '_' or '-': {bad}")
    if args.steps:
        steps = [s for s in steps if re.fullmatch(args.steps, s)]
    if not steps:
        sys.exit("gpu_suite_parallel: no steps to run")
    devs = devices(args.gpus)
    gpus = len(devs)
    groups = make_groups(steps, gpus * args.groups_per_gpu)
    t0 = time.time()
    procs = []
    for i, g in enumerate(groups):
        gdir = os.path.join(out, f"g{i}")
        os.makedirs(gdir, exist_ok=True)
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=devs[i % gpus], OUT=gdir,
                   KLA_SUITE_STEPS="|".join(g))
        log = open(os.path.join(gdir, "stdout.log"), "w")
        # A session of its own: at the limit the whole group goes (the suite's test binaries,
        # sanitizers and their own `timeout`s included), not only its shell.
        procs.append((subprocess.Popen(["bash", suite], env=env, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True), log))
    print(f"gpu_suite_parallel: {len(steps)} steps in {len(groups)} groups on {gpus} GPUs",
          flush=True)
    group_dirs = [os.path.join(out, f"g{i}") for i in range(len(groups))]
    status = run_groups(
        [p for p, _ in procs], args.limit, t0,
        lambda: f"{sum(len(step_rows(os.path.join(d, 'steps.md'))) for d in group_dirs)}"
                f"/{len(steps)} steps finished", args.every)
    for _, log in procs:
        log.close()
    rows, unfinished, failed = [], [], []
    with open(os.path.join(out, "groups.md"), "w") as fh:
        fh.write("| group | GPU | exit | s | steps |\n|---|---|---|---|---|\n")
        for i, (g, (rc, dt)) in enumerate(zip(groups, status)):
            fh.write(f"| g{i} | {devs[i % gpus]} | {rc}{' (time limit)' if rc == 124 else ''} | "
                     f"{dt:.0f} | {' '.join(g)} |\n")
            done = step_rows(os.path.join(out, f"g{i}", "steps.md"))
            for s in g:
                if s in done:
                    rows.append(done[s])
                    if not row_passed(done[s]):
                        failed.append(s)
                else:
                    unfinished.append(s)
    order = {s: i for i, s in enumerate(steps)}
    rows.sort(key=lambda r: order.get(re.match(r"\|\s*([\w.-]+)", r).group(1), 0))
    lines = ["| step | rc | passed | failed | skipped | sanitizer | time | paths (mutants: the "
             "result) |", "|---|---|---|---|---|---|---|---|"] + rows + [""]
    if unfinished:
        lines.append("not finished (a group's time limit, or the step could not run here: the "
                     "group's summary.md says which): " + " ".join(unfinished))
        lines.append("rerun: python3 tools/gpu_suite_parallel.py --steps '"
                     + "|".join(unfinished) + "'")
    lines.append("gpu_suite_parallel: " + ("FAILED steps: " + " ".join(failed) if failed else
                                           "every finished step passed"))
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "summary.md"), "w") as fh:
        fh.write(text)
    print(open(os.path.join(out, "groups.md")).read() + "\n" + text, end="")
    if args.tar:
        subprocess.run(["tar", "czf", "suite.tgz"] + [f"g{i}" for i in range(len(groups))],
                       cwd=out, check=True)
    sys.exit(1 if failed or unfinished else 0)


if __name__ == "__main__":
    main()
