"""`python -m bench.sim`: one simulated crawl on a virtual clock; prints progress and the one-line figures, and
with `--report DIR` writes DIR/simulation.md and its charts."""

from __future__ import annotations

import argparse
import dataclasses
import time

from bench.sim.run import SimSettings, simulate


def _flag(value: str) -> bool:
    if value.lower() in ("true", "1", "yes", "on"):
        return True
    if value.lower() in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"not a yes/no value: {value!r}")


def main() -> None:
    defaults = SimSettings()
    parser = argparse.ArgumentParser(prog="python -m bench.sim", description=__doc__)
    for field in dataclasses.fields(SimSettings):
        default = getattr(defaults, field.name)
        parser.add_argument(f"--{field.name.replace('_', '-')}", default=default,
                            type=_flag if isinstance(default, bool) else type(default))
    parser.add_argument("--report", metavar="DIR", help="write DIR/simulation.md and DIR/simulation/*.svg")
    args = vars(parser.parse_args())
    report = args.pop("report")
    started = time.monotonic()
    run = simulate(SimSettings(**args), progress=lambda line: print(line, flush=True))
    wall = time.monotonic() - started
    figures = run.figures
    print(f"sim: {wall:.1f} s wall; {figures.stale} stale results, {figures.in_flight_at_faults} requests in flight "
          f"at faults, {figures.takeovers} takeovers, fresh_p50_s={figures.fresh_p50_s:.0f}, "
          f"oldest_due_age_h={figures.oldest_due_age_s / 3600:.1f} "
          f"(within cap {figures.oldest_due_age_within_cap_s / 3600:.2f}), giant_share={figures.giant_share:.3f}, "
          f"tail_fresh_p99_s={figures.tail_fresh_p99_s:.0f}, "
          f"slo_10min_healthy={figures.slo_10min_healthy:.3f}, lease_lag_p99_s={figures.lease_lag_p99_s:.0f}, "
          f"discovery_durable_p50_s={figures.discovery_durable_p50_s:.0f}, segments={figures.segments}, "
          f"refused={figures.refused}, change_rate={figures.change_rate:.3f}, "
          f"dead_hosts={figures.dead_hosts}")
    if report:
        from bench.sim.report import write_report
        print(f"sim: wrote {write_report(run, report, wall)}")
    print(figures.line())


if __name__ == "__main__":
    main()
