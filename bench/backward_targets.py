"""Issue 25's bar for the backward, per bench/bench_backward.py case: FlashQLA's published H200
backward time (ms) and the goal (ms), the backward's memory floor, and the words for the saved
backward's state-gradient schedule. One place for bench_backward.py, make_performance_md.py and
plot_backward.py."""

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


def saved_schedule_text(plan):
    """bench_backward.py's record of the saved backward's plan (kla.backward_plan's fields as a
    dict, or {"error": why}) in a few words: "chain, segments of 128 chunks", "scan, its prep
    beside it", "scan, its prep before it", or why it is not known."""
    if not plan:
        return "not recorded"
    if "error" in plan:
        return f"not known ({plan['error']})"
    if plan["state_grad"] == "chain":
        return f"chain, segments of {plan['chain_segment']} chunks"
    return "scan, its prep " + ("beside it" if plan["prep_beside"] else "before it")
