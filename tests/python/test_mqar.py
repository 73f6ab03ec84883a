"""tools/mqar.py (issue 25's training comparison) on the CPU: the task generator's contract, and a
seconds-long training run through kla.nn.KLA (impl "torch") that must lower the loss and write
its result. The comparison itself (impl "both") needs a GPU: docs/python.md, 'Training'."""
import importlib.util
import json
import os

import pytest
import torch

_spec = importlib.util.spec_from_file_location(
    "mqar", os.path.join(os.path.dirname(__file__), "..", "..", "tools", "mqar.py"))
mqar = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mqar)


def test_generator_asks_for_the_value_of_each_key():
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    x, y = mqar.make_mqar(50, 256, 32, 8192, gen)
    assert x.shape == y.shape == (50, 256)
    for row, lab in zip(x, y):
        keys, values = row[0:64:2], row[1:64:2]
        assert len(set(keys.tolist())) == 32 and (keys >= 1).all() and (keys < 4096).all()
        assert (values >= 4096).all() and (values < 8192).all()
        asked = (lab != -100).nonzero().flatten()
        assert len(asked) == 32 and (asked >= 64).all() and ((asked - 64) % 2 == 0).all()
        table = dict(zip(keys.tolist(), values.tolist()))
        for t in asked.tolist():
            assert lab[t].item() == table[row[t].item()]
        rest = torch.ones(256, dtype=torch.bool)
        rest[:64] = False
        rest[asked] = False
        assert (row[rest] == 0).all()
    with pytest.raises(ValueError, match="too small"):
        mqar.make_mqar(1, 40, 32, 8192, gen)


def test_tiny_training_run_learns_and_writes_its_result(tmp_path):
    r = mqar.main(["--impl", "torch", "--device", "cpu", "--tiny", "--out", str(tmp_path)])
    losses = r["train_loss"]["torch/42"]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.1, losses
    saved = json.loads((tmp_path / "mqar.json").read_text())
    assert [c["step"] for c in saved["curves"]["torch/42"]] == [20, 40]
    assert saved["final_val_accuracy"]["torch/42"] == r["final_val_accuracy"]["torch/42"]
    assert saved["summary"]["torch"]["n"] == 1


def test_seeds_give_a_spread_and_the_plot_can_be_redrawn(tmp_path):
    r = mqar.main(["--impl", "torch", "--device", "cpu", "--tiny", "--seeds", "2",
                   "--steps", "20", "--out", str(tmp_path)])
    assert sorted(r["final_val_accuracy"]) == ["torch/42", "torch/43"]
    s = r["summary"]["torch"]
    xs = list(r["final_val_accuracy"].values())
    assert s["n"] == 2 and abs(s["mean"] - sum(xs) / 2) < 1e-12
    assert abs(s["seed_spread"] - abs(xs[0] - xs[1]) / 2 ** 0.5) < 1e-12
    again = mqar.main(["--plot", str(tmp_path / "mqar.json")])
    assert again["final_val_accuracy"] == r["final_val_accuracy"]
    with pytest.raises(SystemExit, match="at least 1"):
        mqar.main(["--impl", "torch", "--device", "cpu", "--tiny", "--seeds", "0"])


@pytest.mark.parametrize("impl", ["kernels", "kernels-fast", "both", "all"])
def test_kernels_need_a_cuda_device(tmp_path, impl):
    with pytest.raises(SystemExit, match="CUDA"):
        mqar.main(["--impl", impl, "--device", "cpu", "--tiny", "--out", str(tmp_path)])
