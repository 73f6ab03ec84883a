"""bench/bench_backward.py's saving on the CPU: the JSON it writes after every row is whole and
replaces the previous one (no temporary file left), so a run a time limit stops keeps the rows it
finished, marked incomplete; make_performance_md.py says so under the backward table; the saved
backward's schedule each row records (kla.backward_plan) is named, or why it is not known. The
benchmark itself needs a GPU (docs/performance.md, 'How to reproduce')."""
import json
import os

import pytest
from bench_scripts import load as _load


def test_each_save_replaces_the_file_whole(tmp_path):
    bb = _load("bench_backward")
    path = str(tmp_path / "backward.json")
    result = {"device": "test", "speed": [{"case": "1x8192", "kla_bwd_ms": 3.5}],
              "accuracy": [], "complete": False}
    bb.save_json(path, result)
    assert json.load(open(path)) == result
    result["speed"].append({"case": "1x32768", "kla_bwd_ms": 13.0})
    result["complete"] = True
    bb.save_json(path, result)
    assert json.load(open(path)) == result
    assert os.listdir(tmp_path) == ["backward.json"]


@pytest.mark.parametrize("complete", [False, True])
def test_the_table_says_when_the_run_stopped_early(tmp_path, complete):
    md = _load("make_performance_md")
    row = {"case": "1x8192", "lengths": [8192], "kla_bwd_ms": 5.0, "kla_fwd_bwd_ms": 6.0,
           "kla_fast_bwd_ms": 3.8, "kla_fast_fwd_bwd_ms": 4.4, "kla_workspace_GiB": 1.6,
           "kla_peak_GiB": 1.8}
    bwd = {"device": "test", "torch": "x", "fla": None, "speed": [row], "accuracy": [],
           "complete": complete}
    out = []
    md.render_backward(out.append, bwd, str(tmp_path), "")
    text = "\n".join(out)
    assert "| 1x8192 | 5.000 | 3.800 |" in text
    assert ("The run stopped before its end" in text) == (not complete)


def test_the_replayed_table_shows_each_library_or_why_not(tmp_path):
    md = _load("make_performance_md")
    row = {"case": "1x8192", "lengths": [8192], "kla_bwd_ms": 5.0, "kla_fwd_bwd_ms": 6.0,
           "kla_fast_bwd_ms": 3.8, "kla_fast_fwd_bwd_ms": 4.4, "kla_workspace_GiB": 1.6,
           "kla_peak_GiB": 1.8, "kla_graph_bwd_ms": 4.5, "kla_graph_fwd_bwd_ms": 5.5,
           "kla_fast_graph_bwd_ms": 3.25, "kla_fast_graph_fwd_bwd_ms": 3.75,
           "fla_bwd_ms": 3.0, "fla_fwd_bwd_ms": 4.0, "fla_graph_error": "RuntimeError: x"}
    bwd = {"device": "test", "torch": "x", "fla": None, "speed": [row], "accuracy": [],
           "complete": True}
    out = []
    md.render_backward(out.append, bwd, str(tmp_path), "")
    text = "\n".join(out)
    assert ("| 1x8192 | 4.500 | 3.250 | capture failed | 5.500 | 3.750 | capture failed | "
            "0.789 | ≤ 0.79 |") in text
    row = {k: x for k, x in row.items() if "graph" not in k}
    out = []
    md.render_backward(out.append, dict(bwd, speed=[row]), str(tmp_path), "")
    assert "replayed from CUDA graphs" not in "\n".join(out)


def test_the_plot_reads_a_runs_replays_under_graph(tmp_path):
    pb = _load("plot_backward")
    path = tmp_path / "backward.json"
    row = {"case": "1x8192", "kla_bwd_ms": 5.0, "kla_fast_bwd_ms": 2.5, "fla_bwd_ms": 2.4,
           "kla_graph_bwd_ms": 4.6, "kla_fast_graph_bwd_ms": 2.1, "fla_graph_bwd_ms": 1.7}
    path.write_text(json.dumps({"speed": [row]}))
    label, rows = pb.load(f"replayed={path}#graph")
    assert label == "replayed"
    assert [rows["1x8192"][k] for k in ("kla_bwd_ms", "kla_fast_bwd_ms", "fla_bwd_ms")] == [
        4.6, 2.1, 1.7]
    _, rows = pb.load(f"plain={path}")
    assert rows["1x8192"]["kla_fast_bwd_ms"] == 2.5
    path.write_text(json.dumps({"speed": [{k: x for k, x in row.items() if "graph" not in k}]}))
    with pytest.raises(SystemExit, match="no CUDA-graph replays"):
        pb.load(f"replayed={path}#graph")
    with pytest.raises(SystemExit, match="the only part after #"):
        pb.load(f"replayed={path}#other")


def test_the_backward_floor_counts_each_tensor_once():
    bt = _load("backward_targets")
    # 1x8192, H 16 / HV 32, K = V = 128, bf16, one sequence, counted by hand: q, k, dq, dk
    # 4 x 8192 x 16 x 128 x 2; v, dO, dv 3 x 8192 x 32 x 128 x 2; g, beta, dg, dbeta
    # 4 x 8192 x 32 x 4; h0, d(final state), dh0 3 x 32 x 128 x 128 x 4.
    assert bt.backward_floor_bytes(8192, 16, 32, 128, 128, 2, 1) == (
        134217728 + 201326592 + 4194304 + 6291456)
    # eight sequences of the same tokens: seven more sets of the three states
    assert (bt.backward_floor_bytes(8192, 16, 32, 128, 128, 2, 8) -
            bt.backward_floor_bytes(8192, 16, 32, 128, 128, 2, 1)) == 7 * 6291456


def _replayed_run(**more):
    """A bench_backward.py run of one 1x8192 row with its shape, plain and replayed times (kla,
    kla FAST, FLA replayed) and a copy rate of 3.4603008 TB/s: 346030080 bytes, a floor of 0.1 ms;
    `more` adds to the row."""
    row = {"case": "1x8192", "lengths": [8192], "H": 16, "HV": 32, "K": 128, "V": 128,
           "dtype": "bf16", "kla_bwd_ms": 5.0, "kla_fwd_bwd_ms": 6.0, "kla_fast_bwd_ms": 3.8,
           "kla_fast_fwd_bwd_ms": 4.4, "kla_workspace_GiB": 1.6, "kla_peak_GiB": 1.8,
           "kla_graph_bwd_ms": 4.5, "kla_graph_fwd_bwd_ms": 5.5, "kla_fast_graph_bwd_ms": 2.0,
           "kla_fast_graph_fwd_bwd_ms": 3.75, "fla_graph_bwd_ms": 1.0,
           "fla_graph_fwd_bwd_ms": 2.0, **more}
    return {"device": "test", "torch": "x", "fla": None, "speed": [row], "accuracy": [],
            "complete": True, "copy_TBps": 3.4603008}


def test_the_replayed_table_gives_the_floor_where_the_run_measured_its_copy_rate(tmp_path):
    md = _load("make_performance_md")
    # a floor of 0.1 ms: 5% of 2.0 ms and 10% of 1.0 ms
    bwd = _replayed_run()
    out = []
    md.render_backward(out.append, bwd, str(tmp_path), "")
    text = "\n".join(out)
    assert "| 0.100 | 5.0% | 10.0% |" in text
    assert "this run's copy rate, 3.46 TB/s" in text
    out = []
    md.render_backward(out.append, dict(bwd, copy_TBps=None), str(tmp_path), "")
    assert "% floor" not in "\n".join(out)


def test_each_library_is_given_one_derived_cu_seqlens_a_tensor():
    torch = pytest.importorskip("torch")
    bb = _load("bench_backward")
    made = []
    get = bb.per_tensor(lambda t: made.append(t) or t.long())
    a, b = torch.tensor([0, 5, 9], dtype=torch.int32), torch.tensor([0, 5, 9], dtype=torch.int32)
    first = get(a)
    assert get(a) is first and len(made) == 1  # the same tensor: the same copy (a capture's need)
    assert get(b) is not first and len(made) == 2  # equal values, another tensor: made again
    assert first.dtype == torch.int64 and first.tolist() == [0, 5, 9]


def test_the_copy_rate_counts_bytes_read_and_written():
    torch = pytest.importorskip("torch")
    sbs = _load("side_by_side")
    timed = []

    def median_ms(fn):
        fn()
        timed.append(fn)
        return 0.5

    # 1 MiB read and 1 MiB written in 0.5 ms
    assert sbs.device_copy_bps(torch, "cpu", median_ms, n=1 << 20) == 2 * (1 << 20) / 0.5e-3
    assert len(timed) == 1


def test_the_saved_backward_gets_its_own_columns_where_the_run_timed_it(tmp_path):
    md = _load("make_performance_md")
    bwd = _replayed_run(kla_fast_saved_bwd_ms=3.1, kla_fast_saved_fwd_bwd_ms=4.1, fla_bwd_ms=3.0,
                        fla_fwd_bwd_ms=4.0, kla_saved_GiB=0.19, kla_fast_saved_peak_GiB=1.85,
                        fla_peak_GiB=0.95, kla_fast_saved_graph_bwd_ms=0.5,
                        kla_fast_saved_graph_fwd_bwd_ms=3.5)
    out = []
    md.render_backward(out.append, bwd, str(tmp_path), "")
    text = "\n".join(out)
    assert ("| case | kla bwd ms | kla FAST bwd ms | kla FAST saved bwd ms | FLA bwd ms | "
            "kla fwd+bwd ms | kla FAST fwd+bwd ms | kla FAST saved fwd+bwd ms | FLA fwd+bwd ms |"
            ) in text
    assert ("| 1x8192 | 5.000 | 3.800 | 3.100 | 3.000 | 6.000 | 4.400 | 4.100 | 4.000 | 0.789 | "
            "≤ 0.79 | 1.60 | 1.80 | 0.19 | 1.85 | 0.95 |") in text
    # the floor of 0.1 ms against each fast variant and FLA, replayed
    assert ("| 1x8192 | 4.500 | 2.000 | 0.500 | 1.000 | 5.500 | 3.750 | 3.500 | 2.000 | 0.789 | "
            "≤ 0.79 | 0.100 | 5.0% | 20.0% | 10.0% |") in text
    assert "kla FAST saved: kla FAST with `save_states=True`" in text
    # every row has as many cells as its header
    for table in [t for t in text.split("\n\n") if t.startswith("| case")]:
        lines = table.splitlines()
        assert len({line.count("|") for line in lines}) == 1, table


def test_the_plot_draws_the_saved_backward_where_the_run_timed_it(tmp_path):
    pb = _load("plot_backward")
    path = tmp_path / "backward.json"
    row = {"case": "1x8192", "kla_bwd_ms": 5.0, "kla_fast_bwd_ms": 2.5,
           "kla_fast_saved_bwd_ms": 2.2, "fla_bwd_ms": 2.4, "kla_graph_bwd_ms": 4.6,
           "kla_fast_graph_bwd_ms": 2.1, "kla_fast_saved_graph_bwd_ms": 1.3,
           "fla_graph_bwd_ms": 1.7}
    older = {k: x for k, x in row.items() if "saved" not in k}  # a run before saved states
    path.write_text(json.dumps({"speed": [row]}))
    (tmp_path / "older.json").write_text(json.dumps({"speed": [older]}))
    runs = [pb.load(f"new={path}#graph"), pb.load(f"old={tmp_path / 'older.json'}")]
    series = [(label, vals) for label, vals, _ in pb.bars(runs)]
    assert series == [("kla ACCURATE (new)", {"1x8192": 4.6}), ("kla FAST (new)", {"1x8192": 2.1}),
                      ("kla FAST saved (new)", {"1x8192": 1.3}),
                      ("kla ACCURATE (old)", {"1x8192": 5.0}), ("kla FAST (old)", {"1x8192": 2.5}),
                      ("FLA (new)", {"1x8192": 1.7}), ("FLA (old)", {"1x8192": 2.4})]


def test_the_saved_backward_schedule_in_words():
    """backward_targets.saved_schedule_text: each plan bench_backward.py records (the fields of
    kla.backward_plan) in the words the tables print, and a plan that could not be asked says
    why."""
    bt = _load("backward_targets")
    words = bt.saved_schedule_text
    assert words({"state_grad": "chain", "chain_segment": 128, "prep_beside": False,
                  "reason": "x"}) == "chain, segments of 128 chunks"
    assert words({"state_grad": "scan", "chain_segment": 0, "prep_beside": True,
                  "reason": "x"}) == "scan, its prep beside it"
    assert words({"state_grad": "scan", "chain_segment": 0, "prep_beside": False,
                  "reason": "x"}) == "scan, its prep before it"
    assert words({"error": "KlaLibraryError: no entry"}) == "not known (KlaLibraryError: no entry)"
    assert words(None) == "not recorded"


def test_the_page_names_the_saved_backward_schedule_where_the_run_recorded_it(tmp_path):
    md = _load("make_performance_md")
    row = {"case": "1x8192", "lengths": [8192], "kla_bwd_ms": 5.0, "kla_fwd_bwd_ms": 6.0,
           "kla_fast_bwd_ms": 3.8, "kla_fast_fwd_bwd_ms": 4.4, "kla_fast_saved_bwd_ms": 3.0,
           "kla_fast_saved_fwd_bwd_ms": 4.0, "kla_workspace_GiB": 1.6, "kla_peak_GiB": 1.8}
    bwd = {"device": "test", "torch": "x", "fla": None, "accuracy": [], "complete": True}
    planned = dict(row, kla_fast_saved_plan={"state_grad": "chain", "chain_segment": 32,
                                             "prep_beside": False, "reason": "r"})
    out = []
    md.render_backward(out.append, dict(bwd, speed=[planned]), str(tmp_path), "")
    assert "schedule on this GPU" in "\n".join(out)
    assert "1x8192: chain, segments of 32 chunks." in "\n".join(out)
    out = []
    md.render_backward(out.append, dict(bwd, speed=[row]), str(tmp_path), "")
    assert "schedule on this GPU" not in "\n".join(out)


def test_a_plan_the_library_cannot_give_is_recorded_not_raised(saving_lib):
    """bench_backward.saved_schedule: where the library refuses the plan (here a CPU machine: no
    device to plan for; elsewhere a library built before the plan's entry point) the row records
    why, and the timing goes on."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the plan is given there (the benchmark's rows record it)")
    bb = _load("bench_backward")
    T, H, HV, D = 128, 2, 4, 128
    leaves = [torch.zeros(1, T, H, D, dtype=torch.bfloat16),
              torch.zeros(1, T, H, D, dtype=torch.bfloat16),
              torch.zeros(1, T, HV, D, dtype=torch.bfloat16), torch.zeros(1, T, HV),
              torch.zeros(1, T, HV), torch.zeros(1, HV, D, D)]
    cu = torch.tensor([0, T], dtype=torch.int32)
    plan = bb.saved_schedule(leaves, cu)
    assert set(plan) == {"error"} and plan["error"], plan
    assert bb.saved_schedule_text(plan).startswith("not known (")
