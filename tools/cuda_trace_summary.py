#!/usr/bin/python3
"""What each kernel of a recorded decode step costs, from a timeline that
tools/cuda_kernel_trace.c wrote (start_ns end_ns stream graph_node name).

    tools/cuda_trace_summary.py cuda_trace.txt

The steps are the kernels of CUDA graphs (graph_node != 0) on the busiest
stream, split where the GPU idled more than 20 us; the steps with the most
common kernel count are kept, the first two dropped (recording, warm-up).
With programmatic launches a kernel starts before its predecessor ends and
waits, so its own duration says little: what it costs the chain is how much
later than its predecessor it ends ("cost"). Prints, per kernel name, calls
a step, median duration, median cost and its share of the step, then one
stretch of a step kernel by kernel. Debian's python3 and c++filt only."""
import collections
import statistics
import subprocess
import sys


def load(path):
    rows = []
    with open(path) as f:
        for line in f:
            p = line.split(" ", 4)
            if len(p) == 5:
                rows.append((int(p[0]), int(p[1]), int(p[2]), int(p[3]), p[4].strip()))
    rows.sort()
    return rows


def demangler(names):
    names = sorted(set(names))
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
    except OSError:
        out = names
    full = dict(zip(names, out))

    def short(n):
        d = full.get(n, n)
        i = d.find("(")
        return d[:i] if i > 0 else d
    return short


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: cuda_trace_summary.py TRACE")
    rows = load(sys.argv[1])
    graph = [r for r in rows if r[3] != 0]
    if not graph:
        sys.exit("no kernels of CUDA graphs in the trace (was the step recorded?)")
    stream = collections.Counter(r[2] for r in graph).most_common(1)[0][0]
    seq = [r for r in graph if r[2] == stream]
    steps, cur = [], [seq[0]]
    for a, b in zip(seq, seq[1:]):
        if b[0] - a[1] > 20000:
            steps.append(cur)
            cur = []
        cur.append(b)
    steps.append(cur)
    n = collections.Counter(len(s) for s in steps).most_common(1)[0][0]
    good = [s for s in steps if len(s) == n][2:]
    if not good:
        sys.exit("too few whole steps")
    span = statistics.median(s[-1][1] - s[0][0] for s in good)
    short = demangler(r[4] for r in seq)
    dur, cost = collections.defaultdict(list), collections.defaultdict(list)
    for s in good:
        for i, r in enumerate(s):
            k = short(r[4])
            dur[k].append(r[1] - r[0])
            cost[k].append(r[1] - s[i - 1][1] if i else r[1] - r[0])
    print("%d steps of %d kernels, median %.1f us a step" % (len(good), n, span / 1e3))
    print("%-56s %6s %9s %9s %7s" % ("kernel", "calls", "dur us", "cost us", "share"))
    for k in sorted(cost, key=lambda k: -sum(cost[k])):
        calls = len(cost[k]) / len(good)
        c = statistics.median(cost[k])
        print("%-56s %6.0f %9.2f %9.2f %6.1f%%" % (k[:56], calls, statistics.median(dur[k]) / 1e3, c / 1e3,
                                                   100 * calls * c / span))
    s = good[len(good) // 2]
    print("\na stretch of one step (cost = end - the previous kernel's end):")
    for i in range(len(s) // 2, min(len(s) // 2 + 16, len(s))):
        r = s[i]
        print("  %-52s dur %7.2f cost %7.2f" % (short(r[4])[:52], (r[1] - r[0]) / 1e3, (r[1] - s[i - 1][1]) / 1e3))


if __name__ == "__main__":
    main()
