#!/usr/bin/env python3
"""Time two whole commands side by side, alternating: A B A B ...

    python3 tools/time_pair.py [-n RUNS] [--warmup W] -- COMMAND_A ... --vs COMMAND_B ...

Each command runs W times first (not counted), then RUNS times in turn with
the other, so that a drift in the machine's speed affects both alike.
Printed per command: the wall time (median, min, max over its runs) and the
peak resident memory of the run (median; the kernel's own accounting of the
finished child, os.wait4; it cannot read below the size of this interpreter,
about 15 MiB, which the child shares until its exec), then the ratio A/B of
each pair's walls (median and range). Output of the commands is discarded. Only the standard library.
"""
import argparse
import os
import statistics
import sys
import time


def run_once(cmd):
    """(wall seconds, peak RSS MiB, exit code) of one run of cmd. posix_spawn, not fork: a
    forked copy of this interpreter would count in the child's peak before its exec."""
    devnull = os.open(os.devnull, os.O_RDWR)
    actions = [(os.POSIX_SPAWN_DUP2, devnull, fd) for fd in (0, 1, 2)]
    t = time.monotonic()
    pid = os.posix_spawnp(cmd[0], cmd, os.environ, file_actions=actions)
    _, status, usage = os.wait4(pid, 0)
    wall = time.monotonic() - t
    os.close(devnull)
    return wall, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv or "--vs" not in argv:
        print(__doc__, file=sys.stderr)
        return 2
    opts, rest = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    a, b = rest[:rest.index("--vs")], rest[rest.index("--vs") + 1:]
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    o = ap.parse_args(opts)
    if not a or not b:
        print("time_pair: both commands are needed", file=sys.stderr)
        return 2
    for _ in range(o.warmup):
        run_once(a)
        run_once(b)
    runs = {"A": [], "B": []}
    for _ in range(o.n):
        runs["A"].append(run_once(a))
        runs["B"].append(run_once(b))
    for name, cmd in (("A", a), ("B", b)):
        walls = [r[0] for r in runs[name]]
        peaks = [r[1] for r in runs[name]]
        codes = sorted({r[2] for r in runs[name]})
        print(f"{name}: wall {statistics.median(walls):.3f} s (min {min(walls):.3f}, max {max(walls):.3f}), "
              f"peak {statistics.median(peaks):.0f} MiB, exit {codes}: {' '.join(cmd)}")
    ratios = [ra[0] / rb[0] for ra, rb in zip(runs["A"], runs["B"], strict=True)]
    print(f"A/B wall: median {statistics.median(ratios):.3f} (pairs {min(ratios):.3f} to {max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
