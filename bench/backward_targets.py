"""Issue 25's bar for the backward, per bench/bench_backward.py case: FlashQLA's published H200
backward time (ms) and the goal (ms), and the backward's memory floor. One place for
make_performance_md.py and plot_backward.py."""

# case name (bench_backward.py) -> (FlashQLA published bwd ms on an H200, goal ms)
ISSUE25 = {
    "1x32768": (2.515, 2.5),
    "8 seqs, 32768 total": (2.893, 2.9),
    "1x8192": (0.789, 0.79),
}


def backward_floor_bytes(tokens, H, HV, K, V, es, seqs):
    """The fewest bytes a backward moves: per token, q, k, v and dO read and dq, dk, dv written once
    in the dtype (es bytes), g and beta read and dg, dbeta written in fp32 (H key heads, HV value
    heads); per sequence, the initial state and the final state's gradient read and the initial
    state's gradient written, fp32 [HV, K, V]."""
    return tokens * (H * 4 * K * es + HV * (3 * V * es + 16)) + seqs * 3 * HV * K * V * 4
