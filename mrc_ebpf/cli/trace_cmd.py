"""`mrcctl path trace PREFIX`: which first-tier hop each entropy path (EV)
crosses, learnt by a hop-limited probe per EV (control/ev_trace.py);
with --order the hops are recorded and the spray rotates over them.
Registered on mrcctl's `path` group at the end of cli/mrcctl.py."""
from __future__ import annotations

import click

from mrc_ebpf.cli.common import attached, complete_prefixes, dev_option, emit, exact_prefix, json_option


@click.command("trace")
@click.argument("prefix", required=False, shell_complete=complete_prefixes, callback=exact_prefix)
@click.option("--order", is_flag=True,
              help="Record each EV's hop on its path (path list, path deny --hop) and order the "
                   "spray list to rotate over the hops, each the same number of turns.")
@click.option("--forget", is_flag=True, help="Drop the recorded hops: the spray goes back to id order.")
@click.option("--rounds", type=click.IntRange(1, 50), default=6, show_default=True,
              help="Send unanswered probes again this many times in all (switches rate-limit ICMPv6).")
@click.option("--wait", type=click.FloatRange(0.01, 10), default=0.25, show_default=True,
              help="Seconds to wait for answers after each round.")
@dev_option
@json_option
@click.pass_context
def trace(ctx, prefix, order, forget, rounds, wait, device):
    """Show which first-tier hop each entropy path of PREFIX (of every
    peer with entropy paths, without PREFIX) crosses.

    Each EV is probed with its own outer header (our SID, the peer's SID,
    its flow label) and hop limit 2: the switch after the first hop
    answers ICMPv6 Time Exceeded, and its address names the hop."""
    from mrc_ebpf.control import ev_trace
    with attached(device, change=order or forget) as att:
        docs = ev_trace.trace_all(att, prefix, order=order, forget=forget, rounds=rounds, wait=wait)

    def human(docs):
        for d in docs:
            one(d)

    def one(d):
        if d["forgot"]:
            click.echo(f"{d['prefix']}: recorded hops dropped; spray in id order ({len(d['spray'])} turns)")
            return
        for r in d["paths"]:
            rtt = f"{r['rtt_ms']:.3f} ms" if r["rtt_ms"] is not None else ""
            click.echo(f"{r['path_id']:>4}  ev {r['ev']:>7}  {r['hop'] or '*':<28} {rtt:>11}  {r['state']}")
        counts = ", ".join(f"{h} {n}" for h, n in d["hops"].items())
        click.echo(f"{d['prefix']}: {len(d['paths'])} EVs over {len(d['hops'])} hops ({counts}); "
                   f"{len(d['unanswered'])} unanswered; {d['took_s']} s")
        if d["recorded"]:
            click.echo(f"hops recorded; spray list {len(d['spray'])} turns rotating over the hops")
    emit(ctx, docs, human)
