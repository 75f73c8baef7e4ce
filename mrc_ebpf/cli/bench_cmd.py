"""`mrcctl bench SCENARIO`: benchmarks on fabrics of namespaces the run
builds and always removes.  The work is in mrc_ebpf/bench/ (runner.py and
one module per scenario); registered at the end of cli/mrcctl.py."""
from __future__ import annotations

import json

import click

from mrc_ebpf.bench.runner import DEFAULT_CC, DEFAULT_HOST_SYSCTLS, SCENARIOS, VM_SCENARIOS
from mrc_ebpf.cli.progress import Progress, progress_option


@click.command()
@click.argument("scenario", type=click.Choice([*SCENARIOS, *VM_SCENARIOS, "all"]))
@click.option("--short", is_flag=True, help="Seconds, small numbers (what the tests run).")
@click.option("--out", "out", default="bench-results", show_default=True, metavar="DIR",
              help="Where <scenario>.json and <scenario>.png go.")
@click.option("--repeat", type=click.IntRange(1, 100), metavar="N",
              help="Repetitions of every measurement (default: the scenario's own).")
@click.option("-C", "--congestion", metavar="ALGO",
              help=f"TCP congestion control of every flow the scenarios start (default {DEFAULT_CC}: "
                   "fixed, so results do not depend on the host's default, which the namespaces "
                   "inherit).")
@click.option("--host-sysctl", "host_sysctls", multiple=True, metavar="net.KEY=VALUE",
              help="Sysctls for every fabric host, in place of the default "
                   f"({' '.join(DEFAULT_HOST_SYSCTLS)}: RACK's reordering window on the current "
                   "RTT, a 5 ms RTO floor where the kernel has it); give the kernel's own values "
                   "(net.ipv4.tcp_min_rtt_wlen=300 ...) to run without.")
@click.option("--mtu", type=int, metavar="BYTES",
              help="Link MTU of every fabric the scenarios build (default: each scenario's own; "
                   "spray-vs-ecmp runs 1500 and 9000).")
@click.option("--ecn-threshold", "ecn_threshold", metavar="TIME|none",
              help="Where the fabric's switches mark ECN, for collisions and congested-spine (default 1ms) "
                   "and failover (default none: no marking, loss is the only congestion signal); the other "
                   "scenarios ignore it.")
@click.option("--hosts-default", "hosts_default", is_flag=True,
              help="Leave the hosts as a user's are: no sysctls set and their own default congestion "
                   "control (this machine's: see /proc/sys/net/ipv4/tcp_congestion_control), in place "
                   "of the datacenter profile (-C and --host-sysctl).")
@click.option("--modes", metavar="M1,M2,..",
              help="The modes to run (default: all the scenario has, e.g. ecmp, prr, plb, mptcp and "
                   "the MRC policies; a contender this kernel cannot run is left out with a note).")
@click.option("--param", "params", multiple=True, metavar="KEY=JSON",
              help="Set a scenario parameter (as stored in the JSON's params), e.g. seconds=4 or "
                   "'flows={\"1500\": [1, 4]}'.")
@click.option("-j", "--json", "json_", is_flag=True, help="Print the JSON document(s) instead of tables.")
@progress_option
def bench(scenario, short, out, repeat, congestion, host_sysctls, mtu, ecn_threshold, hosts_default, modes,
          params, json_, progress):
    """Run SCENARIO (spray-vs-ecmp, failover, cost, collisions, reorder, shared-fate, line-rate,
    congested-spine, probe-budget, port-down, trim-incast, all):
    JSON + PNG under --out and a table of min/median/max.  roce (soft-RoCE)
    runs only in the VM (`make vm-test`: its kernel has rdma_rxe); not in all."""
    from mrc_ebpf.bench import runner, steps
    from mrc_ebpf.errors import MrcError
    names = list(SCENARIOS) if scenario == "all" else [scenario]
    overrides = {}
    for kv in params:
        k, eq, v = kv.partition("=")
        try:
            if not eq or not k:
                raise ValueError
            overrides[k] = json.loads(v)
        except ValueError:
            raise MrcError(f"bad --param {kv!r}: KEY=JSON, e.g. seconds=4")
    mode_list = [m.strip() for m in modes.split(",") if m.strip()] if modes else None
    if modes is not None and not mode_list:
        raise MrcError("--modes: give at least one mode")
    with Progress("bench", progress) as shown:
        steps.PROGRESS = shown if shown.enabled else None
        try:
            docs = runner.run_all(names, short=short, out=out, repeat=repeat, quiet=json_,
                                  congestion=congestion,
                                  host_sysctls=list(host_sysctls) or None, mtu=mtu,
                                  ecn_threshold=ecn_threshold, hosts_default=hosts_default,
                                  modes=mode_list, overrides=overrides or None)
        finally:
            steps.PROGRESS = None
    if json_:
        pretty = (click.get_current_context().obj or {}).get("pretty")
        click.echo(json.dumps(docs if scenario == "all" else docs[0], indent=2 if pretty else None,
                              sort_keys=True))
