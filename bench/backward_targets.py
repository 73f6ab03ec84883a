"""Issue 25's bar for the backward, per bench/bench_backward.py case: FlashQLA's published H200
backward time (ms) and the goal (ms). One place for make_performance_md.py and plot_backward.py."""

# case name (bench_backward.py) -> (FlashQLA published bwd ms on an H200, goal ms)
ISSUE25 = {
    "1x32768": (2.515, 2.5),
    "8 seqs, 32768 total": (2.893, 2.9),
    "1x8192": (0.789, 0.79),
}
