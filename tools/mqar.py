"""Multi-query associative recall (MQAR) with a 2-layer KLA model: does a model trained through
kla's kernels (forward CUDA, backward kla's) learn what the same model learns through the float32
PyTorch implementation of the recurrence (kla.torch_impl)?  Issue 25's "proof a user cares about".

    python3 tools/mqar.py --impl both --out out/mqar            # on a GPU: the comparison
    python3 tools/mqar.py --impl all --out out/mqar             # ... and the kernels' FAST too
    python3 tools/mqar.py --impl torch --device cpu --tiny      # a smoke run on the CPU

The task (the paper's appendix, Zoology's generator): sequences of length 256 holding 32
key-value pairs (keys from the first half of the vocabulary, values from the second), then the
keys again at random even offsets among padding zeros; at every repeated key the model must
output its value. Accuracy is over those positions. Data is made on the fly from --seed; every
implementation starts from the same weights and sees the same batches in the same order, so the
curves differ only by the arithmetic of the layer. Implementations: 'kernels' (kla.chunk_kla,
arithmetic 'accurate', forward and backward), 'kernels-fast' (the same with arithmetic 'fast'),
'torch'; 'both' is kernels and torch, 'all' the three. Writes mqar.json (arguments, device, the
curves, the final accuracies) and mqar.png (the curves) into --out, and prints a progress line
per evaluation.
"""
import argparse
import json
import os
import time

import torch
from torch import nn
from torch.nn import functional as F


def make_mqar(n, seq_len, pairs, vocab, gen):
    """(inputs, labels) [n, seq_len] long: 2*pairs context tokens k1 v1 k2 v2 ..., then each key
    once more at a distinct even offset of the remainder (zeros elsewhere); labels hold the value
    at those positions and -100 everywhere else."""
    half = vocab // 2
    context = 2 * pairs
    slots = (seq_len - context) // 2
    if slots < pairs or half - 1 < pairs:
        raise ValueError("mqar: seq_len / vocab too small for that many pairs")
    keys = torch.stack([torch.randperm(half - 1, generator=gen)[:pairs] + 1 for _ in range(n)])
    values = torch.randint(half, vocab, (n, pairs), generator=gen)
    inputs = torch.zeros(n, seq_len, dtype=torch.long)
    labels = torch.full((n, seq_len), -100, dtype=torch.long)
    inputs[:, 0:context:2], inputs[:, 1:context:2] = keys, values
    where = torch.stack([torch.randperm(slots, generator=gen)[:pairs] for _ in range(n)])
    pos = context + 2 * where
    inputs.scatter_(1, pos, keys)
    labels.scatter_(1, pos, values)
    return inputs, labels


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.eps) * self.weight


class Model(nn.Module):
    """Embedding, layers of (KLA, MLP) with pre-norm residuals, norm, tied read-out."""

    def __init__(self, vocab, d, layers, heads, head_dim, impl):
        super().__init__()
        import kla.nn
        arithmetic = "fast" if impl == "kernels-fast" else "accurate"
        impl = "kernels" if impl == "kernels-fast" else impl
        self.embed = nn.Embedding(vocab, d)
        nn.init.normal_(self.embed.weight, std=0.02)  # tied read-out: small logits at the start
        self.blocks = nn.ModuleList()
        for i in range(layers):
            self.blocks.append(nn.ModuleDict(dict(
                n1=RMSNorm(d), attn=kla.nn.KLA(hidden_size=d, head_dim=head_dim, num_heads=heads,
                                               expand_v=1, layer_idx=i, impl=impl,
                                               arithmetic=arithmetic),
                n2=RMSNorm(d), mlp=nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(),
                                                 nn.Linear(4 * d, d)))))
        self.norm = RMSNorm(d)

    def forward(self, tokens):
        x = self.embed(tokens)
        for b in self.blocks:
            x = x + b["attn"](b["n1"](x))[0]
            x = x + b["mlp"](b["n2"](x))
        return self.norm(x) @ self.embed.weight.t()


def accuracy(model, inputs, labels, batch):
    right = total = 0
    with torch.no_grad():
        for i in range(0, inputs.shape[0], batch):
            logits = model(inputs[i:i + batch])
            lab = labels[i:i + batch]
            m = lab != -100
            right += (logits.argmax(-1)[m] == lab[m]).sum().item()
            total += m.sum().item()
    return right / max(total, 1)


def train(args, impl, device, train_data, val_data, init_state):
    torch.manual_seed(args.seed)
    model = Model(args.vocab, args.d_model, args.layers, args.heads, args.head_dim, impl)
    model.load_state_dict(init_state)
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    xs, ys = (t.to(device) for t in train_data)
    vx, vy = (t.to(device) for t in val_data)
    curve, losses, t0 = [], [], time.time()
    order = torch.Generator().manual_seed(args.seed + 1)
    for step in range(1, args.steps + 1):
        idx = torch.randint(0, xs.shape[0], (args.batch,), generator=order).to(device)
        logits = model(xs[idx])
        loss = F.cross_entropy(logits.float().flatten(0, 1), ys[idx].flatten(), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % args.eval_every == 0 or step == args.steps:
            acc = accuracy(model, vx, vy, args.batch)
            curve.append({"step": step, "loss": loss.item(), "val_accuracy": acc,
                          "seconds": time.time() - t0})
            print(f"mqar [{impl}, seed {args.seed}] step {step}/{args.steps}: "
                  f"loss {loss.item():.4f}, validation accuracy {acc:.4f} "
                  f"({time.time() - t0:.0f} s)", flush=True)
    return curve, losses


def plot(result, path):
    """mqar.png: validation accuracy against step, one line per implementation and seed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("mqar: matplotlib not installed, no plot")
        return
    a = result["args"]
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    colors = {"kernels": "tab:blue", "kernels-fast": "tab:green", "torch": "tab:orange"}
    for key, curve in result["curves"].items():
        impl, _, seed = key.partition("/")
        ax.plot([c["step"] for c in curve], [c["val_accuracy"] for c in curve], marker="o",
                ms=3, color=colors.get(impl), alpha=0.85,
                label=f"{impl} seed {seed or a['seed']} (final {curve[-1]['val_accuracy']:.3f})")
    ax.set_xlabel("step")
    ax.set_ylabel("MQAR validation accuracy")
    ax.set_title(f"2-layer KLA, T={a['seq_len']}, {a['pairs']} pairs, {result['device']}",
                 fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def summarize(result):
    """Per implementation: mean and sample spread of the final accuracies over the seeds, and
    the paired differences (kernels - torch, kernels-fast - torch, same seed: same weights, same
    batches)."""
    finals = result["final_val_accuracy"]
    seeds = sorted({k.partition("/")[2] for k in finals})
    out = {}
    for impl in ("kernels", "kernels-fast", "torch"):
        xs = [finals[f"{impl}/{s}"] for s in seeds if f"{impl}/{s}" in finals]
        if xs:
            mean = sum(xs) / len(xs)
            sd = (sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5 if len(xs) > 1 else 0.0
            out[impl] = {"mean": mean, "seed_spread": sd, "n": len(xs)}
    for impl, name in (("kernels", "paired_difference"),
                       ("kernels-fast", "paired_difference_fast")):
        diffs = [finals[f"{impl}/{s}"] - finals[f"torch/{s}"] for s in seeds
                 if f"{impl}/{s}" in finals and f"torch/{s}" in finals]
        if diffs:
            out[name] = {"values": diffs, "max_abs": max(abs(d) for d in diffs)}
    return out


def write(result, out):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "mqar.json"), "w") as f:
        json.dump(result, f, indent=1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--impl", choices=("kernels", "kernels-fast", "torch", "both", "all"),
                    default="both")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default="out/mqar")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--seeds", type=int, default=1,
                    help="run seeds seed .. seed+N-1 (data, weights and batches of each), so the "
                         "seed-to-seed spread shows what 'within noise' means")
    ap.add_argument("--plot", metavar="MQAR_JSON",
                    help="only redraw mqar.png (beside the json) from a written mqar.json")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--pairs", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--train", type=int, default=20000)
    ap.add_argument("--val", type=int, default=2000)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--tiny", action="store_true",
                    help="a seconds-long CPU configuration (the test's)")
    args = ap.parse_args(argv)
    if args.plot:
        with open(args.plot) as f:
            result = json.load(f)
        plot(result, os.path.join(os.path.dirname(args.plot) or ".", "mqar.png"))
        return result
    if args.tiny:
        args.seq_len, args.pairs, args.vocab, args.train, args.val = 32, 4, 64, 256, 64
        args.d_model, args.heads, args.head_dim, args.steps, args.batch = 32, 2, 16, 40, 16
        args.eval_every = 20
    if args.seeds < 1:
        raise SystemExit("mqar: --seeds must be at least 1")
    impls = {"both": ("kernels", "torch"),
             "all": ("kernels", "kernels-fast", "torch")}.get(args.impl, (args.impl,))
    if any(i.startswith("kernels") for i in impls) and not args.device.startswith("cuda"):
        raise SystemExit(f"mqar: impl '{args.impl}' runs the kernels: a CUDA device (--device "
                         f"cuda)")
    result = {"args": vars(args), "device": (torch.cuda.get_device_name()
                                             if args.device.startswith("cuda") else "cpu"),
              "torch": torch.__version__, "curves": {}, "final_val_accuracy": {},
              "train_loss": {}}
    base = args.seed
    for seed in range(base, base + args.seeds):
        args.seed = seed
        gen = torch.Generator().manual_seed(seed)
        train_data = make_mqar(args.train, args.seq_len, args.pairs, args.vocab, gen)
        val_data = make_mqar(args.val, args.seq_len, args.pairs, args.vocab, gen)
        torch.manual_seed(seed)
        init = Model(args.vocab, args.d_model, args.layers, args.heads, args.head_dim, "torch")
        init_state = {k: v.clone() for k, v in init.state_dict().items()}
        for impl in impls:
            curve, losses = train(args, impl, args.device, train_data, val_data, init_state)
            key = f"{impl}/{seed}"
            result["curves"][key] = curve
            result["train_loss"][key] = losses
            result["final_val_accuracy"][key] = curve[-1]["val_accuracy"]
            write(result, args.out)  # after every run: a cut-short job keeps what it finished
    args.seed = base
    result["args"]["seed"] = base
    result["summary"] = summarize(result)
    write(result, args.out)
    plot(result, os.path.join(args.out, "mqar.png"))
    print("mqar: final validation accuracy " + ", ".join(
        f"{k} {v:.4f}" for k, v in result["final_val_accuracy"].items()) +
        f"; written to {args.out}/mqar.json")
    return result


if __name__ == "__main__":
    main()
