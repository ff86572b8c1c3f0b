"""Ports for `paddle.distributed.launch` that no outgoing connection can take first.

Why this exists. Paddle 2.6.2's launcher picks the job's ports (the rendezvous store of rank 0,
`PADDLE_MASTER`, and one endpoint per rank) with a bind test in `PORT_RANGE`, default
35100:64000, and the ranks bind them seconds later, after importing paddle. Linux hands out
ephemeral ports for outgoing connections from `net.ipv4.ip_local_port_range`, 32768:60999 by
default: nearly the same range. Every connection made in between (gloo's mesh, store clients,
rank 1 retrying to reach a store that is not listening yet, anything else on the node) can take
the chosen port, and rank 0 then fails with `Bind network on IP_ANY:<port> failed`. Seen as a
rare failed start in our multi-process tests; on a busy node it is a failed job start.

The fix is the launcher's own setting: `PORT_RANGE` above (or below) the ephemeral range. The launch
scripts export it for the launcher (`eval "$(python -m ernie_mtl.dist.ports --shell)"`) unless the
user set it; the test suite sets it for every job it starts. Nothing here binds or connects.

Stdlib only (the launch scripts run it with any python3).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Mapping, Optional, Sequence, Tuple

EPHEMERAL_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
PADDLE_DEFAULT = (35100, 64000)  # paddle/distributed/launch/context/node.py
MIN_PORTS = 1000  # a range smaller than this is not offered (the launcher needs a few per job)
LOWEST = 10000  # below: well-known and registered services are more likely


def ephemeral_range(path: str = EPHEMERAL_FILE) -> Optional[Tuple[int, int]]:
    """The kernel's range for outgoing connections' local ports, or None where it cannot be read."""
    try:
        with open(path, encoding="ascii") as f:
            lo, hi = (int(x) for x in f.read().split()[:2])
    except (OSError, ValueError):
        return None
    return (lo, hi) if 0 < lo <= hi <= 65535 else None


def launcher_port_range(ephemeral: Optional[Tuple[int, int]]) -> Optional[Tuple[int, int]]:
    """A range for the launcher outside `ephemeral`: above it when it leaves at least MIN_PORTS
    ports, else below it (not under LOWEST); None when neither side has room or nothing is known."""
    if ephemeral is None:
        return None
    lo, hi = ephemeral
    if 65535 - hi >= MIN_PORTS:
        return hi + 1, 65535
    if lo - LOWEST >= MIN_PORTS:
        return max(LOWEST, lo - 20001), lo - 1
    return None


def port_range_value(path: str = EPHEMERAL_FILE) -> Optional[str]:
    """PORT_RANGE's value (`a:b`) for this machine, or None when no safe range is known."""
    chosen = launcher_port_range(ephemeral_range(path))
    return f"{chosen[0]}:{chosen[1]}" if chosen else None


def shell_line(env: Mapping[str, str] = os.environ, path: str = EPHEMERAL_FILE) -> str:
    """`export PORT_RANGE=a:b`, or "" when the user set PORT_RANGE or no safe range is known."""
    value = None if env.get("PORT_RANGE") else port_range_value(path)
    return f"export PORT_RANGE={value}" if value else ""


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ernie_mtl.dist.ports", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shell", action="store_true", help="print `export PORT_RANGE=a:b` (nothing if PORT_RANGE is set "
                                                        "or no range outside the ephemeral one exists)")
    args = p.parse_args(argv)
    if args.shell:
        line = shell_line()
        if line:
            print(line)
        return 0
    eph = ephemeral_range()
    print(f"ephemeral (outgoing) ports: {eph[0]}-{eph[1]}" if eph else "ephemeral ports: unknown")
    print(f"PORT_RANGE in the environment: {os.environ.get('PORT_RANGE') or 'unset'} "
          f"(Paddle's default {PADDLE_DEFAULT[0]}:{PADDLE_DEFAULT[1]})")
    print(f"suggested PORT_RANGE: {port_range_value() or 'none (keep the default)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
