#!/usr/bin/env python3
"""The cost of one FUSE round trip on this machine: N calls that the daemon answers at once
(ioctl TCGETS, which intentfs refuses with ENOTTY without touching the backing file, and
getxattr of an attribute that does not exist), timed on a file through a mount and,
for comparison, on the same file natively. A program you run and read (issue 6); it
asserts nothing.

    sudo bench/roundtrip.py MOUNT/FILE [WORKSPACE/FILE] [N]

Every FUSE request costs at least this, whatever the daemon does: multiply by the
requests a workload makes (bench/run.sh prints them) for the least time it can take.
"""
import fcntl
import os
import sys
import termios
import time


def per_call_us(path, n):
    fd = os.open(path, os.O_RDONLY)
    try:
        out = {}
        for name, call in (
            ("ioctl", lambda: fcntl.ioctl(fd, termios.TCGETS, b"\0" * 64)),
            ("getxattr", lambda: os.getxattr(fd, "user.intentfs-bench-missing")),
        ):
            for _ in range(min(n, 1000)):  # warm up
                try:
                    call()
                except OSError:
                    pass
            t = time.perf_counter_ns()
            for _ in range(n):
                try:
                    call()
                except OSError:
                    pass
            out[name] = (time.perf_counter_ns() - t) / n / 1000
        return out
    finally:
        os.close(fd)


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        sys.exit(0 if len(sys.argv) > 1 else 2)
    paths = [a for a in sys.argv[1:] if not a.isdigit()]
    n = next((int(a) for a in sys.argv[1:] if a.isdigit()), 20000)
    for p in paths:
        r = per_call_us(p, n)
        print(f"{p}: ioctl {r['ioctl']:.1f} µs, getxattr {r['getxattr']:.1f} µs per call ({n} calls each)")


if __name__ == "__main__":
    main()
