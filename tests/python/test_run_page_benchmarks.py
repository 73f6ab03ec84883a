"""bench/run_page_benchmarks.sh on the CPU (KLA_PAGE_DRY=1: each GPU's queue printed, nothing
run): the jobs are dealt over the GPUs so that no two share one unless there are more jobs than
GPUs, a job the script does not know and a machine without a GPU are refused. The benchmarks
themselves need a GPU (docs/performance.md, 'How to reproduce')."""
import os
import subprocess

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench",
                      "run_page_benchmarks.sh")


def dry(**env):
    e = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    e.update(KLA_PAGE_DRY="1", **env)
    return subprocess.run(["bash", SCRIPT], env=e, capture_output=True, text=True, timeout=30)


def queues(stdout):
    q = {}
    for line in stdout.splitlines():
        gpu, name = line.split(":")[0:2]
        q.setdefault(gpu, []).append(name.strip())
    return q


def test_four_gpus_one_job_each():
    r = dry(KLA_PAGE_GPUS="4")
    assert r.returncode == 0, r.stderr
    assert queues(r.stdout) == {"gpu 0": ["sbs"], "gpu 1": ["recipe"], "gpu 2": ["backward"],
                                "gpu 3": ["split"]}
    assert "--only '^(?!recipe)'" in r.stdout and "--only '^recipe'" in r.stdout


def test_two_gpus_two_calls():
    first = dry(KLA_PAGE_GPUS="2", KLA_PAGE_JOBS="sbs recipe")
    second = dry(KLA_PAGE_GPUS="2", KLA_PAGE_JOBS="backward split")
    assert queues(first.stdout) == {"gpu 0": ["sbs"], "gpu 1": ["recipe"]}
    assert queues(second.stdout) == {"gpu 0": ["backward"], "gpu 1": ["split"]}
    # all four on two GPUs: two a GPU, one after the other
    assert queues(dry(KLA_PAGE_GPUS="2").stdout) == {"gpu 0": ["sbs", "backward"],
                                                     "gpu 1": ["recipe", "split"]}


def test_visible_devices_are_the_gpus():
    # a caller keeping GPUs 0 and 1 for other work
    r = dry(CUDA_VISIBLE_DEVICES="2,3", KLA_PAGE_JOBS="backward split")
    assert r.returncode == 0, r.stderr
    assert queues(r.stdout) == {"gpu 2": ["backward"], "gpu 3": ["split"]}
    assert queues(dry(CUDA_VISIBLE_DEVICES="2,3", KLA_PAGE_GPUS="1").stdout) == {
        "gpu 2": ["sbs", "recipe", "backward", "split"]}
    r = dry(CUDA_VISIBLE_DEVICES="2,3", KLA_PAGE_GPUS="3")
    assert r.returncode == 2 and "CUDA_VISIBLE_DEVICES names 2" in r.stderr


def test_refusals():
    r = dry(KLA_PAGE_GPUS="2", KLA_PAGE_JOBS="sbs decode")
    assert r.returncode == 2 and "no job 'decode'" in r.stderr
    r = dry(KLA_PAGE_GPUS="0")
    assert r.returncode == 2 and "no GPU" in r.stderr
