"""What every bench plot shares: its command line, matplotlib without a display, a wrapped title,
the save."""
import argparse
import textwrap


def plot_arguments(doc, runs_help):
    """RUNS... --out PNG [--title T], the program described by the first line of doc."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("runs", nargs="+", help=runs_help)
    ap.add_argument("--out", required=True)
    ap.add_argument("--title", default="")
    return ap.parse_args()


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display on the machines that draw)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def wrap(title, width):
    return "\n".join(textwrap.wrap(title, width))


def save(fig, out, rect=None):
    """tight_layout (inside rect, figure fractions (left, bottom, right, top), where given: room
    for a legend outside the axes), then the PNG."""
    fig.tight_layout(**({"rect": rect} if rect else {}))
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")
