"""`python -m bench.sim`: one simulated crawl on a virtual clock; prints progress and the one-line figures."""

from __future__ import annotations

import argparse
import time

from bench.sim.run import SimSettings, simulate


def main() -> None:
    defaults = SimSettings()
    parser = argparse.ArgumentParser(prog="python -m bench.sim", description=__doc__)
    for name in ("hosts", "urls", "daemons", "seed", "kills", "freezes", "buckets", "segment_max_urls", "giant_hosts",
                 "giant_urls"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    for name in ("hours", "segment_minutes"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=float, default=getattr(defaults, name))
    args = parser.parse_args()
    started = time.monotonic()
    figures = simulate(SimSettings(**vars(args)))
    print(f"sim: {time.monotonic() - started:.1f} s wall; {figures.stale} stale results, "
          f"{figures.in_flight_at_faults} requests in flight at kills and freezes, {figures.takeovers} takeovers, "
          f"fresh_p50_s={figures.fresh_p50_s:.0f}")
    print(figures.line())


if __name__ == "__main__":
    main()
