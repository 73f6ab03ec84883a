"""What every bench plot shares: matplotlib without a display, a wrapped title, the save."""
import textwrap


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display on the machines that draw)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def wrap(title, width):
    return "\n".join(textwrap.wrap(title, width))


def save(fig, out):
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")
