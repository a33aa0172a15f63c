#!/usr/bin/env python3
"""Interleaved start-up comparison: runs each command once per round, round after round,
so that drift in the machine's speed (this VM's host is shared) hits every command alike.
hyperfine runs one command's samples back to back; on a noisy host the order then moves
the ratios. Prints the median wall time (posix_spawn to wait) per command and its ratio to
the first.

    scripts/interleaved.py ROUNDS 'cmd one' 'cmd two' ...
"""
import os
import shlex
import statistics
import sys
import time


def main():
    rounds = int(sys.argv[1])
    commands = [shlex.split(c) for c in sys.argv[2:]]
    devnull = os.open(os.devnull, os.O_RDWR)
    actions = [(os.POSIX_SPAWN_DUP2, devnull, 1), (os.POSIX_SPAWN_DUP2, devnull, 2)]

    def once(argv):
        start = time.perf_counter()
        pid = os.posix_spawnp(argv[0], argv, os.environ, file_actions=actions)
        _, status = os.waitpid(pid, 0)
        elapsed = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"{shlex.join(argv)} failed: {status}")
        return elapsed

    for _ in range(20):  # warm-up
        for argv in commands:
            once(argv)
    samples = [[] for _ in commands]
    for _ in range(rounds):
        for i, argv in enumerate(commands):
            samples[i].append(once(argv))
    first = statistics.median(samples[0])
    for argv, times in zip(commands, samples):
        times.sort()
        median = statistics.median(times)
        p10, p90 = times[len(times) // 10], times[len(times) * 9 // 10]
        print(
            f"{median * 1000:8.2f} ms median  p10 {p10 * 1000:6.2f}  p90 {p90 * 1000:6.2f}"
            f"  x{median / first:5.2f}  {shlex.join(argv)[:90]}"
        )


if __name__ == "__main__":
    main()
