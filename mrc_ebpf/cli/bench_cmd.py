"""`mrcctl bench SCENARIO`: benchmarks on fabrics of namespaces the run
builds and always removes.  The work is in mrc_ebpf/bench/ (runner.py and
one module per scenario); registered at the end of cli/mrcctl.py."""
from __future__ import annotations

import json

import click

from mrc_ebpf.bench.runner import DEFAULT_CC, DEFAULT_HOST_SYSCTLS, SCENARIOS


@click.command()
@click.argument("scenario", type=click.Choice([*SCENARIOS, "all"]))
@click.option("--short", is_flag=True, help="Seconds, small numbers (what the tests run).")
@click.option("--out", "out", default="bench-results", show_default=True, metavar="DIR",
              help="Where <scenario>.json and <scenario>.png go.")
@click.option("--repeat", type=click.IntRange(1, 100), metavar="N",
              help="Repetitions of every measurement (default: the scenario's own).")
@click.option("-C", "--congestion", default=DEFAULT_CC, show_default=True, metavar="ALGO",
              help="TCP congestion control of every flow the scenarios start (fixed, so results do "
                   "not depend on the host's default, which the namespaces inherit).")
@click.option("--host-sysctl", "host_sysctls", multiple=True, metavar="net.KEY=VALUE",
              help="Sysctls for every fabric host, in place of the default "
                   f"({' '.join(DEFAULT_HOST_SYSCTLS)}: RACK's reordering window on the current "
                   "RTT, a 5 ms RTO floor where the kernel has it); give the kernel's own values "
                   "(net.ipv4.tcp_min_rtt_wlen=300 ...) to run without.")
@click.option("--mtu", type=int, metavar="BYTES",
              help="Link MTU of every fabric the scenarios build (default: each scenario's own; "
                   "spray-vs-ecmp runs 1500 and 9000).")
@click.option("--ecn-threshold", "ecn_threshold", metavar="TIME|none",
              help="Where the fabric's switches mark ECN, for collisions (default 1ms) and failover "
                   "(default none: no marking, loss is the only congestion signal); the other "
                   "scenarios ignore it.")
@click.option("-j", "--json", "json_", is_flag=True, help="Print the JSON document(s) instead of tables.")
def bench(scenario, short, out, repeat, congestion, host_sysctls, mtu, ecn_threshold, json_):
    """Run SCENARIO (spray-vs-ecmp, failover, cost, collisions, reorder, all):
    JSON + PNG under --out and a table of min/median/max."""
    from mrc_ebpf.bench import runner
    names = list(SCENARIOS) if scenario == "all" else [scenario]
    docs = runner.run_all(names, short=short, out=out, repeat=repeat, quiet=json_, congestion=congestion,
                          host_sysctls=list(host_sysctls) or None, mtu=mtu, ecn_threshold=ecn_threshold)
    if json_:
        pretty = (click.get_current_context().obj or {}).get("pretty")
        click.echo(json.dumps(docs if scenario == "all" else docs[0], indent=2 if pretty else None,
                              sort_keys=True))
