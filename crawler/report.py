"""The cycle report of one segment, rendered from plain aggregates: a self-contained HTML page and a terminal
summary. Pure (no Spark): jobs/report.py computes the aggregates, these functions only draw them.

The page works offline and from any file viewer: inline CSS and hand-made inline SVG, no script, no network.
Every string from the crawl (host names, error texts, reasons) is attacker-controlled and goes through
`html.escape`.
"""

from __future__ import annotations

import html
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field

from crawler.service_levels import ServiceLevels, lease_decided

# Histogram bin edges; bin i holds values v with edges[i-1] <= v < edges[i] (bin 0: below the first edge, the
# last bin: at or above the last edge), i.e. bin_index = bisect_right(edges, v). Log-ish spacing: the
# interesting differences are ratios.
GAP_EDGES_S = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
ELAPSED_EDGES_MS = (10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)
BYTES_EDGES = (1_000, 10_000, 100_000, 1_000_000, 10_000_000)  # decimal, like human_bytes

LABEL_WIDTH = 15  # terminal summary: the label column
CLOCK_NOTE = ("Gaps come from fetched_at and elapsed_ms, both taken from the fetch daemon's clock; "
              "the authoritative politeness check is the server's access log.")


@dataclass
class HostStats:
    """One host's line in the report: fetch attempts, requests actually made and its inter-request gaps."""

    host_key: str
    fetches: int
    robots_denied: int = 0
    delay_s: float = 0.0               # the politeness delay the host was owed (crawler.politeness.effective_delay)
    gaps: int = 0                      # gaps measured: requests after the host's first one
    under_delay: int = 0               # gaps shorter than delay_s
    min_gap_s: float | None = None
    gap_bins: list[int] = field(default_factory=list)  # counts per GAP_EDGES_S bin


@dataclass
class ReportData:
    """Everything the report shows: small aggregates, never rows."""

    segment_id: str
    min_delay_s: float                                  # politeness.min_delay_s
    fetches: int
    hosts: int                                          # distinct hosts fetched
    outcomes: dict[str, int]
    top_hosts: list[HostStats]                          # by fetches, with gap histograms
    gaps: int
    under_delay: int
    min_gap_s: float | None                             # smallest gap of any host
    gap_bins: list[int]                                 # all hosts
    under_delay_hosts: list[HostStats]                  # hosts with gaps under their delay, most first
    elapsed_bins: list[int]
    elapsed_p50_ms: float | None
    elapsed_p95_ms: float | None
    bytes_bins: list[int]
    bytes_total: int
    truncated: int
    buckets: list[dict[str, object]]                    # `segments` rows: bucket, state, results, applied, ...
    counters: dict[str, int]                            # `segments.counters` summed over buckets
    new_urls: dict[str, int]                            # by urls.source
    pages: int
    exact_duplicates: int
    near_duplicates: int
    parse_errors: int
    sitemaps: int
    sitemap_urls: int
    sitemap_refused: dict[str, int]
    robots_denied_hosts: list[tuple[str, int]]
    trap_hosts: list[tuple[str, dict[str, int]]]        # cumulative maps of hosts this segment touched
    trap_reasons: dict[str, int]                        # those maps summed
    host_states: dict[str, int] = field(default_factory=dict)  # crawler.politeness.host_state -> hosts, now
    frontier: list[dict[str, object]] = field(default_factory=list)  # recent `cycle_metrics` rows, oldest first
    # (IP address, host names, requests) of the addresses that answered for the most host names: where the per-IP
    # guard (politeness.max_concurrency_per_ip, min_delay_per_ip_s) matters
    shared_addresses: list[tuple[str, int, int]] = field(default_factory=list)
    levels: ServiceLevels | None = None  # the service levels' targets: the summary and the page judge them (None: not)

    def figures(self, step: str) -> dict[str, object] | None:
        """This segment's `cycle_metrics` row of `step` (generate, update), if any."""
        return next((row for row in self.frontier if row["segment_id"] == self.segment_id and row["step"] == step),
                    None)


def bin_index(value: float, edges: Sequence[float]) -> int:
    return bisect_right(edges, value)


def bin_labels(edges: Sequence[float], unit: str, scale: float = 1.0) -> list[str]:
    """'<a', 'a-b', ..., '>=z' for len(edges) + 1 bins; `scale` divides the edges for display."""
    shown = [_short(e / scale) for e in edges]
    return ([f"<{shown[0]}{unit}"] + [f"{a}-{b}{unit}" for a, b in zip(shown, shown[1:], strict=False)]
            + [f">={shown[-1]}{unit}"])


def _short(number: float) -> str:
    return f"{number:g}"


def human_bytes(count: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(count) < 1000 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.2f} {unit}"
        count /= 1000
    raise AssertionError("unreachable")


def _pairs(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))) or "-"


def _age(seconds: object) -> str:
    if seconds is None:
        return "-"
    hours = float(seconds) / 3600
    return f"{hours / 24:.1f} d" if hours >= 48 else f"{hours:.1f} h"


def _rate(value: object) -> str:
    return "-" if value is None else f"{100 * float(value):.0f}%"


def _share(leased: object, due: object) -> str:
    return "-" if not due else f"{100 * int(leased or 0) / int(due):.1f}%"


def hot_domain_rows(data: ReportData) -> list[tuple[str, int, int, str, str]]:
    """This segment's hot domains (generate's `cycle_metrics.hot_domains`): (domain, due URLs, leased, share of
    its backlog taken, the shares earlier cycles in the report's history took of it, oldest first)."""
    chosen = data.figures("generate")
    if not chosen:
        return []
    earlier: dict[str, list[str]] = {}
    for row in data.frontier:
        if row["step"] == "generate" and row["segment_id"] != data.segment_id:
            for hot in row.get("hot_domains") or []:
                earlier.setdefault(hot["domain"], []).append(_share(hot["leased"], hot["due"]))
    return [(hot["domain"], int(hot["due"]), int(hot["leased"]), _share(hot["leased"], hot["due"]),
             ", ".join(earlier.get(hot["domain"], [])) or "-") for hot in chosen.get("hot_domains") or []]


def verdict(met: bool | None) -> str:
    """A level's verdict as the report prints it: what on-call reads first."""
    return "not measured" if met is None else "MET" if met else "MISSED"


def _seconds(value: object) -> str:
    return "-" if value is None else f"{float(value):.0f} s"


def discovery_text(levels: ServiceLevels, merged: dict[str, object] | None) -> str:
    """The discovery level of a segment from its update row: figures, target, verdict."""
    target = f"target p99 <= {levels.discovery_durable_s:g} s"
    if not merged:
        return f"- (not merged yet; {target})"
    p99 = merged.get("discovery_durable_p99_s")
    return (f"p99 {_seconds(p99)}, p50 {_seconds(merged.get('discovery_durable_p50_s'))} fetch -> durable over "
            f"{merged.get('discovery_pages') or 0} pages with outlinks; {target}: "
            f"{verdict(levels.discovery_met(None if p99 is None else float(p99)))}")


def lease_text(levels: ServiceLevels, chosen: dict[str, object] | None) -> str:
    """The lease level at a segment's generate from its row: figures, target, verdict."""
    target = f"target >= {100 * levels.lease_share:g}% within {levels.lease_within_s:g} s"
    if not chosen:
        return f"- (no generate row; {target})"
    share = chosen.get("lease_share_within")
    return (f"{chosen.get('hp_leased_within') or 0} of {lease_decided(chosen)} eligible high-priority URLs leased in "
            f"time ({_rate(share)}; {chosen.get('hp_leased_late') or 0} leased late, "
            f"{chosen.get('hp_waiting_late') or 0} waiting past), p99 due -> lease "
            f"{_seconds(chosen.get('hp_lease_lag_p99_s'))}; {target}: "
            f"{verdict(levels.lease_met(None if share is None else float(share)))}")


def _service_level_lines(data: ReportData) -> list[tuple[str, str]]:
    if data.levels is None:
        return []
    return [("discovery SLO", discovery_text(data.levels, data.figures("update"))),
            ("lease SLO", lease_text(data.levels, data.figures("generate")))]


def _frontier_lines(data: ReportData) -> list[tuple[str, str]]:
    chosen, merged = data.figures("generate"), data.figures("update")
    lines = []
    if chosen:
        lines.append(("frontier", f"{chosen['due_urls']} due when generated, oldest due "
                                  f"{_age(chosen['oldest_due_age_s'])}; {chosen['due_high_priority']} high-priority "
                                  f"due, {chosen['high_priority_not_leased']} of them not leased; "
                                  f"{chosen['unmerged_segments']} other segments not merged"))
        hot = hot_domain_rows(data)[:3]
        if hot:
            lines.append(("hot domains", "; ".join(f"{domain} {leased} of {due} due ({share})"
                                                   for domain, due, leased, share, _ in hot)))
    if merged:
        lines.append(("change", f"{merged['new_urls']} new URLs; {merged['changed']} of {merged['refetched']} "
                                f"refetched pages changed ({_rate(merged['change_rate'])})"))
    lines.append(("host states", _pairs(data.host_states)))
    return lines


def terminal_summary(data: ReportData) -> str:
    """A few aligned lines read at a glance after a cycle."""
    duplicates = data.exact_duplicates + data.near_duplicates
    results = {k: sum(int(b.get(k) or 0) for b in data.buckets) for k in ("results", "applied", "stale", "discovered")}
    smallest = "" if data.min_gap_s is None else f", smallest {data.min_gap_s:.3f} s"
    times = ("-" if data.elapsed_p50_ms is None
             else f"p50 {data.elapsed_p50_ms:.0f} ms, p95 {data.elapsed_p95_ms:.0f} ms")
    rows = [
        ("segment", f"{data.segment_id}: {data.fetches} fetches from {data.hosts} hosts"),
        *_service_level_lines(data),
        ("outcomes", _pairs(data.outcomes)),
        ("politeness", f"{data.gaps} gaps, {data.under_delay} under the delay (min_delay_s {data.min_delay_s:g})"
                       + f"{smallest} [daemon clock]"),
        ("response time", times),
        ("bytes", f"{human_bytes(data.bytes_total)}, {data.truncated} truncated"),
        # Unchanged content stored as revisit records, apart: the server said so (304), or the bytes did.
        ("revisits", f"{data.outcomes.get('not_modified', 0)} not modified (304), "
                     f"{data.outcomes.get('identical_payload', 0)} identical payload (stored once)"),
        ("update", f"{results['results']} results, {results['applied']} applied, {results['stale']} stale, "
                   f"{results['discovered']} discovered"),
        ("new URLs", f"{sum(data.new_urls.values())} ({_pairs(data.new_urls)})"),
        ("pages", f"{data.pages}, {duplicates} duplicates ({data.exact_duplicates} exact, {data.near_duplicates} "
                  f"near), {data.sitemaps} sitemaps, {data.parse_errors} parse errors"),
        ("robots denied", f"{data.outcomes.get('robots_denied', 0)} on {len(data.robots_denied_hosts)} hosts"),
        ("trap rejections", f"{sum(data.trap_reasons.values())} on {len(data.trap_hosts)} hosts "
                            f"(cumulative) ({_pairs(data.trap_reasons)})"),
        *_frontier_lines(data),
    ]
    return "\n".join(f"{label + ':':<{LABEL_WIDTH + 1}} {text}" for label, text in rows)


# --- HTML -------------------------------------------------------------------------------------------------

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ccc;margin-top:2em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:2px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}.note{color:#666;font-size:.9em}
.multiples{display:flex;flex-wrap:wrap;gap:12px}.multiples figure{margin:0}
figcaption{font-size:.85em;max-width:300px;overflow-wrap:anywhere}.warn{color:#b00020;font-weight:bold}
svg text{font:11px system-ui,sans-serif;fill:#333}
"""
BAR, WARN = "#4a78b5", "#d9534f"


def e(value: object) -> str:
    """Escape anything for HTML text and attribute values."""
    return html.escape(str(value), quote=True)


def bar_chart_svg(title: str, items: Sequence[tuple[str, int]], width: int = 640) -> str:
    """Horizontal bars, one per (label, value): long labels (host names) stay readable."""
    if not items:
        return f'<p class="note">{e(title)}: none</p>'
    row, label_w, top = 18, 260, 4
    top_value = max(max(v for _, v in items), 1)
    bar_w = width - label_w - 70
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{width}" '
             f'height="{top + row * len(items) + 4}"><title>{e(title)}</title>']
    for i, (label, value) in enumerate(items):
        y = top + i * row
        length = round(bar_w * value / top_value)
        shown = label if len(label) <= 40 else label[:39] + "…"
        parts.append(f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end">{e(shown)}</text>'
                     f'<rect x="{label_w}" y="{y + 2}" width="{length}" height="{row - 4}" fill="{BAR}"/>'
                     f'<text x="{label_w + length + 4}" y="{y + 13}">{value}</text>')
    parts.append("</svg>")
    return "".join(parts)


def histogram_svg(title: str, labels: Sequence[str], counts: Sequence[int], width: int = 640, height: int = 180,
                  warn_bins: int = 0) -> str:
    """Vertical bars over ordered bins; the first `warn_bins` bins are drawn in the warning colour."""
    pad_bottom, pad_top = 34, 14
    slot = width / max(len(counts), 1)
    top_value = max(max(counts, default=0), 1)
    plot_h = height - pad_bottom - pad_top
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{width}" height="{height}">'
             f'<title>{e(title)}</title>']
    for i, (label, count) in enumerate(zip(labels, counts, strict=True)):
        bar_h = round(plot_h * count / top_value)
        x = i * slot
        colour = WARN if i < warn_bins else BAR
        parts.append(f'<rect x="{x + 2:.1f}" y="{pad_top + plot_h - bar_h}" width="{slot - 4:.1f}" '
                     f'height="{bar_h}" fill="{colour}"/>')
        if count:
            parts.append(f'<text x="{x + slot / 2:.1f}" y="{pad_top + plot_h - bar_h - 2}" '
                         f'text-anchor="middle">{count}</text>')
        if width >= 400 or i % 2 == 0:
            parts.append(f'<text x="{x + slot / 2:.1f}" y="{height - pad_bottom + 14}" '
                         f'text-anchor="middle">{e(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def bins_under(delay_s: float, edges: Sequence[float] = GAP_EDGES_S) -> int:
    """How many leading gap bins lie wholly below `delay_s` (their upper edge is <= it): drawn as warnings."""
    return bisect_right(edges, delay_s)


def table_html(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    if not rows:
        return '<p class="note">none</p>'
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _counts_rows(counts: dict[str, int]) -> list[tuple[str, int]]:
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def _gap(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


FRONTIER_COLUMNS = (("segment", "segment_id"), ("step", "step"), ("due", "due_urls"),
                    ("oldest due", "oldest_due_age_s"), ("high-priority due", "due_high_priority"),
                    ("not leased", "high_priority_not_leased"), ("leased", "leased_urls"), ("results", "results"),
                    ("stale", "stale"), ("new URLs", "new_urls"), ("change rate", "change_rate"),
                    ("unmerged", "unmerged_segments"))


def _frontier_cell(key: str, value: object) -> object:
    if key == "oldest_due_age_s":
        return _age(value)
    if key == "change_rate":
        return _rate(value)
    return "-" if value is None else value


def service_level_rows(data: ReportData) -> list[tuple[str, str, str, str, str, str, str]]:
    """Per segment in the report's history (oldest first): (segment, discovery p99, pages, verdict, share leased in
    time, decided URLs, verdict); [] without targets."""
    if data.levels is None:
        return []
    levels, by_segment = data.levels, {}
    for row in data.frontier:
        by_segment.setdefault(str(row["segment_id"]), {})[row["step"]] = row
    rows = []
    for segment, steps in by_segment.items():
        merged, chosen = steps.get("update") or {}, steps.get("generate") or {}
        p99, share = merged.get("discovery_durable_p99_s"), chosen.get("lease_share_within")
        rows.append((segment, _seconds(p99), "-" if not merged else str(merged.get("discovery_pages") or 0),
                     verdict(levels.discovery_met(None if p99 is None else float(p99))) if merged else "-",
                     _rate(share), "-" if not chosen else str(lease_decided(chosen)),
                     verdict(levels.lease_met(None if share is None else float(share))) if chosen else "-"))
    return rows


def _service_levels_html(data: ReportData) -> list[str]:
    if data.levels is None:
        return []
    levels = data.levels
    missed = levels.misses({"generate": data.figures("generate"), "update": data.figures("update")})
    return [
        "<h2>Service levels</h2>",
        f'<p class="{"warn" if missed else ""}">This segment: {e("; ".join(missed) or "no level missed")}.</p>',
        f'<p class="note">Discovery: a fetched page\'s links are durable (the <code>links</code> commit that holds '
        f"them) within {levels.discovery_durable_s:g} s of the fetch, at the 99th percentile. Leases: at least "
        f"{100 * levels.lease_share:g}% of the eligible due high-priority URLs (priority &gt;= "
        f"{levels.high_priority:g}, host ok, within its per-host cap) are leased within {levels.lease_within_s:g} s of "
        "falling due; one still "
        "waiting past that is a miss. From cycle_metrics (crawler/service_levels.py).</p>",
        table_html(("segment", "discovery p99", "pages", "discovery", "leased in time", "decided", "leases"),
                   service_level_rows(data)),
    ]


def _frontier_html(data: ReportData) -> list[str]:
    """Hosts by state now, and the recent frontier figures (`cycle_metrics`), with the due backlog per segment."""
    backlog = [(str(row["segment_id"]), int(row["due_urls"] or 0)) for row in data.frontier
               if row["step"] == "generate"]
    return [
        "<h2>Hosts by state</h2>",
        '<p class="note">ok, backing off (backoff_until ahead), robots unreachable (last robots.txt fetch found '
        "none), dead (nothing but failures for politeness.dead_after_days: one probe URL per segment).</p>",
        bar_chart_svg("hosts by state", _counts_rows(data.host_states)),
        table_html(("state", "hosts"), _counts_rows(data.host_states)),
        "<h2>Hot domains (registered domains with the most due URLs)</h2>",
        '<p class="note">What this segment leased of each one\'s backlog (generate.per_domain_max_urls and '
        "generate.domain_budgets cap it), and what earlier cycles took.</p>",
        table_html(("domain", "due", "leased", "taken", "taken by earlier cycles"), hot_domain_rows(data)),
        "<h2>Frontier figures (cycle_metrics, recent runs)</h2>",
        bar_chart_svg("due URLs when each segment was generated", backlog),
        table_html([label for label, _ in FRONTIER_COLUMNS],
                   [[_frontier_cell(key, row.get(key)) for _, key in FRONTIER_COLUMNS] for row in data.frontier]),
    ]


def render_html(data: ReportData) -> str:
    """The whole report page."""
    gap_labels = bin_labels(GAP_EDGES_S, " s")
    multiples = "".join(
        f"<figure>{histogram_svg(f'gaps of {h.host_key}', gap_labels, h.gap_bins, 300, 130, bins_under(h.delay_s))}"
        f"<figcaption>{e(h.host_key)}: {h.gaps} gaps, delay {h.delay_s:g} s, "
        f"<span class=\"{'warn' if h.under_delay else ''}\">{h.under_delay} under</span></figcaption></figure>"
        for h in data.top_hosts)
    under_class = "warn" if data.under_delay else ""
    duplicates = data.exact_duplicates + data.near_duplicates
    sections = [
        f"<h1>Cycle report: segment {e(data.segment_id)}</h1>",
        f"<pre>{e(terminal_summary(data))}</pre>",
        *_service_levels_html(data),
        "<h2>Fetches by outcome</h2>",
        bar_chart_svg("fetches by outcome", _counts_rows(data.outcomes)),
        f"<h2>Top hosts by fetches ({len(data.top_hosts)} of {data.hosts})</h2>",
        bar_chart_svg("top hosts by fetches", [(h.host_key, h.fetches) for h in data.top_hosts]),
        table_html(("host", "fetches", "robots denied", "gaps", "delay s", "under delay", "smallest gap s"),
                   [(h.host_key, h.fetches, h.robots_denied, h.gaps, f"{h.delay_s:g}", h.under_delay,
                     _gap(h.min_gap_s)) for h in data.top_hosts]),
        "<h2>Politeness: inter-request gaps</h2>",
        f'<p>{data.gaps} gaps (next request start − previous request end, per host); '
        f'<span class="{under_class}">{data.under_delay} under the delay</span> '
        f"(politeness.min_delay_s = {data.min_delay_s:g} s, or the host's Crawl-delay). A correct crawl has 0. "
        "Red bins lie wholly below the host's delay.</p>",
        f'<p class="note">{e(CLOCK_NOTE)}</p>',
        "<h3>All hosts</h3>",
        histogram_svg("gaps, all hosts", gap_labels, data.gap_bins, warn_bins=bins_under(data.min_delay_s)),
        "<h3>Per host (top hosts by fetches)</h3>",
        f'<div class="multiples">{multiples}</div>',
        "<h3>Hosts with gaps under the delay</h3>",
        table_html(("host", "gaps", "under delay", "delay s", "smallest gap s"),
                   [(h.host_key, h.gaps, h.under_delay, f"{h.delay_s:g}", _gap(h.min_gap_s))
                    for h in data.under_delay_hosts]),
        "<h2>Response times (elapsed_ms)</h2>",
        histogram_svg("response times", bin_labels(ELAPSED_EDGES_MS, " ms"), data.elapsed_bins),
        "<h2>Response sizes (content_length)</h2>",
        f"<p>{e(human_bytes(data.bytes_total))} in total; {data.truncated} truncated.</p>",
        histogram_svg("response sizes", bin_labels(BYTES_EDGES, " kB", 1000), data.bytes_bins),
        "<h2>New URLs by source</h2>",
        bar_chart_svg("new URLs by source", _counts_rows(data.new_urls)),
        table_html(("source", "URLs"), _counts_rows(data.new_urls)),
        "<h2>Pages, duplicates and sitemaps</h2>",
        table_html(("pages", "duplicates", "exact", "near", "parse errors", "sitemaps", "sitemap URLs kept"),
                   [(data.pages, duplicates, data.exact_duplicates, data.near_duplicates, data.parse_errors,
                     data.sitemaps, data.sitemap_urls)]),
        "<h3>Sitemap entries refused</h3>",
        table_html(("reason", "entries"), _counts_rows(data.sitemap_refused)),
        "<h2>Robots denials</h2>",
        table_html(("host", "denied"), data.robots_denied_hosts),
        "<h2>Addresses carrying the most host names</h2>",
        table_html(("IP address", "host names", "requests"), data.shared_addresses),
        "<h2>Trap rejections (cumulative, hosts touched by this segment)</h2>",
        table_html(("reason", "rejections"), _counts_rows(data.trap_reasons)),
        table_html(("host", "rejections"), [(host, _pairs(counts)) for host, counts in data.trap_hosts]),
        "<h2>Update: results and stale results per bucket</h2>",
        table_html(("bucket", "state", "results", "applied", "stale", "discovered"),
                   [tuple("-" if b.get(k) is None else b[k]
                          for k in ("bucket", "state", "results", "applied", "stale", "discovered"))
                    for b in data.buckets]),
        "<h3>Counters</h3>",
        table_html(("counter", "value"), sorted(data.counters.items())),
        *_frontier_html(data),
    ]
    return ('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f"<title>cyclecrawl report {e(data.segment_id)}</title><style>{_CSS}</style></head><body>"
            + "\n".join(sections) + "</body></html>\n")
