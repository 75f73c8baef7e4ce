"""mrcctl: load, configure and inspect the mrc-ebpf datapath.

One verb per job, as bpftool and xdp-loader do; every verb takes
-j/--json (one JSON document per line, of a fixed shape; -p/--pretty
indents it); errors are one line on stderr and a non-zero exit, and under
-j also {"error": ...} on stdout.

Shell completion is click's: `eval "$(_MRCCTL_COMPLETE=bash_source mrcctl)"`
(zsh_source, fish_source for the others); it completes devices, attached
devices and peer prefixes.
"""
from __future__ import annotations

import os
import sys

import click

from mrc_ebpf.errors import MrcError
from mrc_ebpf.cli.common import (attached, complete_attached, complete_devices, complete_prefixes,  # noqa: F401
                                  dev_option, dumps, emit, enter_netns, exact_prefix, json_option,
                                  lock_timeout,
                                  tabulate)
from mrc_ebpf.control.config import schema as config_schema
from mrc_ebpf.datapath.source import prefixed

EXIT_ERROR = 1
# rr, weighted, random, hash, adaptive, bytes: the MRC_POLICY_* of bpf/mrc_common.h
POLICY_NAMES = prefixed("MRC_POLICY_")


def _json_asked(argv: list[str]) -> tuple[bool, bool]:
    """(-j, -p) as given anywhere on the command line: a usage error is
    found before the verb's own -j is parsed.  -p counts only before the
    verb (`fabric up -p` is --planes)."""
    as_json = pretty = False
    verb_seen = False
    for tok in argv:
        if tok == "--":
            break
        if tok in ("-j", "--json") or (tok.startswith("-") and not tok.startswith("--")
                                       and "j" in tok[1:] and tok[1:].isalpha()):
            as_json = True
        elif tok == "--pretty" or (tok == "-p" and not verb_seen):
            as_json = pretty = True
        elif not tok.startswith("-"):
            verb_seen = True
    return as_json, pretty


class Group(click.Group):
    """Turns MrcError (and stray OS errors) into one line and exit 1;
    under -j the error is also a JSON document on stdout.  Usage errors
    (click's, exit 2 with usage lines) are made the same: one line, exit 1,
    as docs/ops.md promises scripts."""

    _argv: list[str] = []

    @staticmethod
    def _fail(ctx, message: str):
        obj = (ctx.obj if ctx is not None else None) or {}
        as_json, pretty = obj.get("json"), obj.get("pretty", False)
        if not as_json:
            as_json, pretty = _json_asked(Group._argv)
        if as_json:
            click.echo(dumps({"error": message}, pretty))
        click.echo(f"mrcctl: error: {message}", err=True)
        sys.exit(EXIT_ERROR)

    def _usage(self, ctx, e: click.ClickException):
        where = e.ctx.command_path if getattr(e, "ctx", None) is not None else "mrcctl"
        message = " ".join(e.format_message().split())      # one line
        if isinstance(e, click.UsageError):
            message = f"{message} (see `{where} --help`)"
        self._fail(ctx, message)

    def main(self, args=None, *rest, **extra):
        Group._argv = list(sys.argv[1:] if args is None else args)
        return super().main(args, *rest, **extra)

    def make_context(self, info_name, args, parent=None, **extra):
        # the top level's own options are parsed here, before invoke
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.exceptions.NoArgsIsHelpError:
            raise           # `mrcctl` alone: its help, as click prints it
        except click.ClickException as e:
            self._usage(parent, e)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except MrcError as e:
            self._fail(ctx, str(e))
        except PermissionError as e:
            self._fail(ctx, f"{e.strerror or e}: needs root (CAP_BPF and CAP_NET_ADMIN)")
        except click.exceptions.NoArgsIsHelpError:
            raise           # a group without its verb (`mrcctl path`): its help
        except click.ClickException as e:
            self._usage(ctx, e)
        except (click.exceptions.Exit, click.exceptions.Abort, SystemExit):
            raise
        except BrokenPipeError:
            # the reader left (`mrcctl path list | head`): end quietly, as
            # a tool killed by SIGPIPE does, and keep Python's own flush
            # at exit from failing on the closed pipe again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(128 + 13)
        except Exception as e:  # a bug: say so in one line; MRC_DEBUG=1 shows where
            if os.environ.get("MRC_DEBUG"):
                raise
            self._fail(ctx, f"internal error: {type(e).__name__}: {e} (MRC_DEBUG=1 for a traceback)")


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-j", "--json", "json_", is_flag=True, help="Print JSON, one document per line.")
@click.option("-p", "--pretty", is_flag=True, help="Print JSON, indented.")
@click.option("--netns", "netns_name", metavar="NS", help="Run inside network namespace NS (never creates it).",
              shell_complete=lambda ctx, param, incomplete: [
                  n for n in (os.listdir("/run/netns") if os.path.isdir("/run/netns") else [])
                  if n.startswith(incomplete)])
@click.option("--lock-timeout", metavar="SECONDS", callback=lock_timeout, expose_value=False,
              help="How long a change waits for another mrcctl changing the same namespace's "
                   "attachments (default 10, or MRC_LOCK_TIMEOUT).")
@click.version_option(package_name="mrc-ebpf")
@click.pass_context
def cli(ctx, json_, pretty, netns_name):
    """Multipath SRv6 datapath in eBPF: attach it, give it paths, watch it."""
    ctx.ensure_object(dict)
    ctx.obj["json"] = json_ or pretty
    ctx.obj["pretty"] = pretty
    if netns_name:
        enter_netns(netns_name)


def ranged_option(name: str, help: str):
    """--NAME of `attach`: its range and default from the config schema's
    one table (the config file's attach section takes the same)."""
    return click.option(f"--{name.replace('_', '-')}", type=click.IntRange(*config_schema.RANGES[name]),
                        default=config_schema.DEFAULTS[name], show_default=True, help=help)


@cli.command()
@click.argument("devices", metavar="DEVICE...", nargs=-1, required=True,
                shell_complete=complete_devices)
@click.option("--sid", help="This host's SRv6 SID (outer source; decapsulated here); required, except with --replace.")
@click.option("--mode", type=click.Choice(config_schema.MODES), default="auto",
              show_default=True, help="XDP mode: native (driver) or skb (generic); auto: native, "
                                      "but generic on a veth (native turns the sender's TSO off).")
@click.option("--granularity", type=click.Choice(config_schema.GRANULARITIES), default="auto", show_default=True,
              help="auto: spray GSO bursts of at most 50 us of the slowest link's time (full "
                   "64 KB bursts at 10 Gbit/s and up: segmentation offload kept); packet: each "
                   "packet its own path (gso_max_segs 1: the kernel's no-GSO rate); burst: "
                   "the device's own GSO bound.")
@click.option("--link-rate", metavar="RATE",
              help="The slowest link of the fabric (e.g. 200mbit, 100gbit), which auto sizes "
                   "bursts for; default: the device's own speed.")
@ranged_option("loss_hold_us",
               help="adaptive: how long a path that reported a loss is avoided.")
@ranged_option("ack_timeout_us",
               help="A path whose packets go unacknowledged this long is taken down.")
@ranged_option("probe_us",
               help="A down path is tried with one packet this often.")
@ranged_option("probe_max_us",
               help="A down path's probe interval doubles from --probe-us up to this (reset when it "
                    "answers); 0 keeps it at --probe-us.")
@ranged_option("probe_budget",
               help="Down paths' probes a second through one first hop at most (a path without "
                    "a known first hop: through itself); 0: no limit.")
@ranged_option("skip_rotations",
               help="A path the peer reports CE-marked skips this many of its spray turns (MRC's skip: "
                    "congestion, never assumed-bad); 0: CE marks skip nothing.")
@ranged_option("fb_interval_us",
               help="One-way traffic: the receiver sends feedback at least this often.")
@ranged_option("reorder_max_us",
               help="Late packets widen --ack-timeout-us up to this; 0 keeps it fixed.")
@click.option("--retrans-steer/--no-retrans-steer", default=True, show_default=True,
              help="A TCP retransmission whose spray turn is a path the peer has stopped "
                   "acknowledging goes on one it acknowledges (a failed path's losses are "
                   "not resent into it).")
@ranged_option("min_active",
               help="The datapath takes no path out that would leave a peer fewer than this many "
                    "usable ones (MRC's ev_min_active); each refusal is an event (kept).")
@click.option("--shared-fate/--no-shared-fate", default=False, show_default=True,
              help="A path taken out makes its first hop suspect: the other peers' paths through "
                   "it are tested at once by probe copies and taken out if they go unanswered "
                   "(off by default: what it saves depends on the load, docs/performance/shared-fate.md).")
@click.option("--key-file", metavar="FILE",
              help="The fabric's shared key (32 hex digits): sign what we send, file only "
                   "authentic feedback (see `mrcctl key`).")
@click.option("--active-peers", type=int, metavar="N",
              help="Peers sent to and senders heard from at once that the datapath keeps state "
                   "for (its LRUs; more are evicted, counted in `status`) [default: 16384; "
                   "256 to 65536; kernel memory about 8 KB each].")
@click.option("--replace", is_flag=True,
              help="Upgrade the running datapath of DEVICE in place: build the installed "
                   "sources, then swap the programs atomically, keeping every map and setting.")
@click.option("--repair", is_flag=True,
              help="Put the pinned programs back on the hooks of DEVICE's running datapath that "
                   "another tool took them off (xdp-loader unload, ip link set DEV xdp off, tc "
                   "filter del); mrc_rx chains to an XDP program loaded there since.")
@json_option
@click.pass_context
def attach(ctx, devices, sid, mode, granularity, link_rate, loss_hold_us, ack_timeout_us, probe_us,
           probe_max_us, probe_budget, skip_rotations,
           fb_interval_us, reorder_max_us, retrans_steer, min_active, shared_fate, key_file, active_peers,
           replace, repair):
    """Load the datapath on DEVICE and pin it; it stays after mrcctl exits.

    Several devices (a host's plane NICs) share one datapath: a path leaves
    by the device its first hop is on; the pins are named after the first.
    With --replace, DEVICE's running datapath gets the newly built programs
    without a restart (docs/ops.md)."""
    from mrc_ebpf.datapath import loader
    if replace and repair:
        raise click.UsageError("--replace or --repair, not both")
    if replace or repair:
        flag = "--replace" if replace else "--repair"
        given = [f"--{p.replace('_', '-')}" for p in ctx.params
                 if p not in ("devices", "replace", "repair", "json_", "pretty_")
                 and ctx.get_parameter_source(p) == click.core.ParameterSource.COMMANDLINE]
        if given:
            raise click.UsageError(f"{flag} keeps the running settings and takes no {given[0]} "
                                   f"(detach and attach to change them)")
    if repair:
        from mrc_ebpf.datapath import repair as mend
        if len(devices) > 1:
            raise click.UsageError("--repair takes one DEVICE (it mends the whole attachment)")
        result = mend.repair(devices[0])
        emit(ctx, result, lambda r: click.echo(
            "\n".join(f"{c['device']}: {c['done']}" for c in r["repaired"])
            or f"{r['device']}: every hook runs its program: nothing to repair"))
        return
    if replace:
        from mrc_ebpf.datapath import replace as upgrade
        result = upgrade.replace(list(devices))
        emit(ctx, result, lambda r: click.echo(
            f"replaced the programs of {' '.join(r['devices'])} ("
            + ", ".join(f"{k} {v['old_id']} -> {v['new_id']}" for k, v in r["programs"].items())
            + f"), keeping its {r['maps_kept']} maps: compiled in {r['compile_s']:.1f} s, loaded in "
            f"{r['load_s']:.1f} s, swapped in {r['swap_ms']:.2f} ms"))
        return
    if not sid:
        raise click.UsageError("Missing option '--sid'.")
    from mrc_ebpf.lab.fabric.plan import parse_rate
    link_mbps = -(-parse_rate(link_rate) // 1_000_000) if link_rate else 0
    result = loader.attach(list(devices), sid, mode, granularity, link_rate_mbps=link_mbps,
                             retrans_steer=retrans_steer,
                             key_file=key_file, loss_hold_us=loss_hold_us,
                             ack_timeout_us=ack_timeout_us, probe_us=probe_us,
                             fb_interval_us=fb_interval_us, reorder_max_us=reorder_max_us,
                             min_active=min_active, shared_fate=shared_fate,
                             probe_max_us=probe_max_us, probe_budget=probe_budget,
                             skip_rotations=skip_rotations, active_peers=active_peers)
    emit(ctx, result, lambda r: click.echo(
        f"attached {' '.join(r['devices'])}: SID {r['sid']}, XDP {r['xdp_mode']}, TC egress, "
        f"{r['granularity']}; feedback "
        f"{'authenticated' if r['auth']['authenticated'] else 'unauthenticated (no --key-file)'}; "
        f"pinned at {r['pins']}"
        + "".join(f"; chained to {c['device']}'s XDP program {c['id']} {c['name']}"
                  for c in r["xdp_chained"])))


@cli.command()
@click.argument("device", required=False, shell_complete=complete_attached)
@click.option("--all", "all_", is_flag=True, help="Detach every device attached in this namespace.")
@json_option
@click.pass_context
def detach(ctx, device, all_):
    """Remove the datapath from DEVICE: programs, filter, routes, pins."""
    from mrc_ebpf.datapath import loader, lock, pins
    if bool(device) == all_:
        raise click.UsageError("give a DEVICE or --all")
    if all_:
        loader.require_root()
        with lock.writer(create=False, recover="lenient"):
            results = [loader.detach(d) for d in pins.attached_devices()]
    else:
        results = [loader.detach(device)]
    # a list, whether one device or --all was given
    emit(ctx, results, lambda r: click.echo(
        "\n".join(f"detached {x['device']}" + "".join(
            f"; XDP program {b['id']} is back on {b['device']}" for b in x["xdp_restored"])
            for x in r) or "nothing attached"))


def fmt_auth(a: dict | None) -> str:
    """`status`'s feedback line: authenticated by which key, or not."""
    if not a:
        return "-"
    if not a["authenticated"]:
        return ("unauthenticated: no key, so anyone on the fabric can forge or replay it "
                "(mrcctl key add --key-file FILE)")
    return "authenticated, " + ", ".join(f"key id {k['key_id']} {'signs' if k['signs'] else 'accepted'}"
                                         for k in a["keys"])


def _fmt_probing(p: dict | None) -> str:
    """status: down paths and the probe rate their schedule gives."""
    if not p:
        return "-"
    budget = f"{p['budget_per_hop_per_s']}/s a first hop" if p["budget_per_hop_per_s"] else "no budget"
    return (f"{p['down_paths']} down paths, {p['probes_per_s']} probes/s "
            f"(every {p['probe_us']} us doubling to {p['probe_max_us']} us; {budget})")


def fmt_memory(mem: dict | None) -> str:
    """`status`'s kernel memory line: the maps' memlock, and the largest."""
    if not mem:
        return "-"
    mib = lambda n: f"{n / (1 << 20):.1f} MiB"  # noqa: E731
    largest = sorted(mem["maps"].items(), key=lambda kv: -kv[1])[:3]
    line = (f"{mib(mem['bytes'])} in {len(mem['maps'])} maps on {mem['cpus']} CPUs "
            f"({mib(mem['scaled_bytes'])} on {mem['scaled_cpus']}); largest: "
            + ", ".join(f"{n} {mib(b)}" for n, b in largest))
    if "kernel_bytes" in mem:
        line += (f"; as the kernel counts it (slab objects, the trie's intermediate nodes): "
                 f"{mib(mem['kernel_bytes'])} ({mib(mem['kernel_scaled_bytes'])} on {mem['scaled_cpus']})")
    return line


def fmt_learnt(state: dict | None) -> str:
    """`status`'s learnt state line: the LRU's use and its evictions."""
    if not state:
        return "-"
    return (f"{state['active']} of {state['max']} peers; {state['started']} states started, "
            f"{state['evicted_and_remade']} after an eviction, {state['failed']} could not be made")


def fmt_receive(state: dict | None) -> str:
    """`status`'s receive state line: the receiver's LRUs of senders and
    of (sender, path) pairs, and what they evicted."""
    if not state:
        return "-"
    s, p = state["senders"], state["paths"]
    return (f"{s['held']} of {s['max']} senders ({s['made']} made, {s['evicted']} evicted, "
            f"{s['failed']} could not be made); {p['held']} of {p['max']} (sender, path) pairs "
            f"({p['made']} made, {p['evicted']} evicted: restarted when heard again)")


def _fmt_port_status(p: dict | None) -> str:
    if not p:
        return "-"
    how = (f"kernel hooks on {', '.join(p['hooks'])}" if p["detector"] == "kernel"
           else "`mrcctl ports watch` (netlink): no kernel hooks" + (f" (only {', '.join(p['hooks'])})"
                                                                      if p["hooks"] else ""))
    return f"found by {how}; ports down {p['ports_down']:#x}"


@cli.command()
@json_option
@click.pass_context
def status(ctx):
    """What is attached in this network namespace, as the kernel sees it."""
    from mrc_ebpf.control import status as status_mod
    rows = status_mod.collect()

    def human(rows):
        from mrc_ebpf.cli.gc_cmd import describe
        stranded = [r for r in rows if r.get("stale")]
        cut_short = next((r["journal"] for r in rows if r.get("journal")), None)
        rows = [r for r in rows if not r.get("stale") and r.get("device")]
        if cut_short:
            click.echo(f"HALF-DONE: {cut_short['what']}; the next mrcctl command that changes "
                       f"this namespace (e.g. `mrcctl gc`) rolls it back")
        if not rows:
            click.echo("nothing attached in this network namespace")
        for r in stranded:
            click.echo(f"stranded: {describe(r)}; `mrcctl gc` removes it")
        for r in rows:
            click.echo(f"{r['device']}: {'OK' if r['healthy'] else 'DEGRADED'}")
            items = [("SID", r["sid"])]
            for h in r["hooks"]:
                items += [(f"{h['device']} XDP", f"{h['xdp_mode'] or 'none'} (prog {h['xdp_prog_id'] or '-'}"
                                                 f"{'' if h['xdp_ours'] else ', not ours'})"
                                                 + (f": {h['xdp_why']}" if h.get("xdp_why") else "")),
                          (f"{h['device']} granularity", f"{h['granularity']}"
                                                         + (f": {h['granularity_why']}"
                                                            if h.get("granularity_why") else "")),
                          *([(f"{h['device']} XDP chained",
                               f"prog {h['xdp_chained']['id']} {h['xdp_chained']['name']} "
                               f"(gets what MRC passes)")] if h.get("xdp_chained") else []),
                          (f"{h['device']} TC egress",
                           f"prog {h['tc_prog_id'] or '-'}{'' if h['tc_ours'] else ' (missing)'}")]
            items += [("MTU", r["mtu"]), ("overhead", ", ".join(f"{n}: {b} B" for n, b in r["overhead"].items())),
                     ("peers", f"{r['peers']} ({r['templated_peers']} on templates, "
                               f"{r['active_peers']} with learnt state)"),
                     ("learnt state", fmt_learnt(r.get("learnt_state"))),
                     ("receive state", fmt_receive(r.get("receive_state"))),
                     ("paths", r["paths"]),
                     ("path states", ", ".join(f"{k} {v}" for k, v in r["path_states"].items())),
                     ("min active", r["min_active"] or "no floor"),
                     ("congestion skip", f"{r['skip_rotations']} turns a CE report"
                      if r.get("skip_rotations") else "off"),
                     ("probing", _fmt_probing(r.get("probing"))),
                     ("programs", ", ".join(f"{k} {v['id']}" for k, v in r["programs"].items())
                      + f"; loaded {max((v['loaded'] or '' for v in r['programs'].values()), default='') or '-'}"),
                     ("shared fate", {True: "on", False: "off"}.get(r.get("shared_fate"), "-")),
                     ("port status", _fmt_port_status(r.get("port_status"))),
                     ("feedback", fmt_auth(r.get("auth"))),
                     ("kernel memory", fmt_memory(r["memory"])),
                     ("pins", r["pins"])]
            for route in r["routes"]:
                items.append(("route", f"{route['prefix']}: {fmt_metrics(route['route_metrics'])}"))
            for w in r["ack_windows"]:
                items.append(("ack window", f"{w['prefix']}: {w['window_us']} us, widened from "
                                            f"{w['ack_timeout_us']} us by late packets"))
            for problem in r["problems"]:
                items.append(("problem", problem))
            click.echo(tabulate(items, tablefmt="plain"))
    emit(ctx, rows, human)
    # not healthy (a killed change left it half-done, a hook another tool
    # changed, stranded state...): non-zero, as `systemctl is-active`
    if any(not r.get("healthy", True) for r in rows):
        ctx.exit(1)


@cli.command()
@dev_option
@click.option("--paths", "by_path", is_flag=True, help="Per path: sent, received, loss, delay.")
@click.option("--events", "show_events", is_flag=True, help="Path state changes, with kernel times.")
@click.option("--roce", "show_roce", is_flag=True,
              help="RoCEv2 per queue pair and per path: PSNs, retransmissions, NAK sequence errors.")
@click.option("--watch", type=click.FloatRange(min=0.1), metavar="N", help="Refresh every N seconds.")
@json_option
@click.pass_context
def stats(ctx, device, by_path, show_events, show_roce, watch):
    """Datapath counters (summed over CPUs), per-path measurements, events, or RoCE."""
    import math
    import time
    from mrc_ebpf.datapath import loader
    from mrc_ebpf.control import events, paths, roce, stats as rx_stats
    if sum((by_path, show_events, show_roce)) > 1:
        raise MrcError("--paths, --events and --roce: one at a time")
    if watch is not None and not (math.isfinite(watch) and watch <= 86400):
        raise MrcError(f"bad --watch {watch}: seconds between refreshes, 0.1..86400")
    device = loader.resolve_device(device)

    def collect():
        with loader.Attachment.open(device) as att:
            if show_events:
                prefixes = {p["peer_id"]: p["prefix"] for p in paths.peers(att)}
                return {"device": device, "events": events.read(att, prefixes)}
            if show_roce:
                return {"device": device, "qps": roce.qps(att), "paths": roce.paths(att)}
            if by_path:
                return {"device": device, "sent": paths.list_paths(att),
                        "received": rx_stats.received(att), "reorder": rx_stats.reorder(att)}
            return {"device": device, "counters": att.counters()}

    def human(d):
        if show_events:
            click.echo(tabulate([(e["seq"], e["ns"], e["ago_ms"], e["type"], e["state"], e["prefix"],
                                  e["path_id"], e["after_us"] if e["after_us"] is not None else "")
                                 for e in d["events"]],
                                headers=["seq", "kernel ns", "ms ago", "event", "state", "peer", "path",
                                         "us after unacked send"]) if d["events"] else "no events")
            return
        if show_roce:
            dash = lambda v: "-" if v is None else v     # noqa: E731
            click.echo("queue pairs (peer, UDP source port)")
            click.echo(tabulate([(r["peer"], r["sport"], r["dqpn"], dash(r["path_id"]), r["moves"],
                                  r["tx_packets"], r["tx_retrans"], r["naks_seq"], dash(r["in_flight"]),
                                  r["rx_packets"], r["rx_ahead"], r["rx_behind"]) for r in d["qps"]],
                                headers=["peer", "sport", "dest qp", "path", "moves", "tx pkts", "tx retrans",
                                         "nak seq", "in flight", "rx pkts", "rx ahead", "rx behind"]))
            click.echo("\npaths (tx: ours to the peer; rx: the peer's to us)")
            click.echo(tabulate([(r["peer"], r["side"], r["path_id"], r["tx_packets"], r["tx_retrans"],
                                  r["naks_seq"], r["rx_packets"], r["rx_ahead"], r["rx_behind"])
                                 for r in d["paths"]],
                                headers=["peer", "side", "path", "tx pkts", "tx retrans", "nak seq",
                                         "rx pkts", "rx ahead", "rx behind"]))
            return
        if not by_path:
            click.echo(tabulate(sorted(d["counters"].items()), headers=["counter", device]))
            return
        click.echo("sent (this host's paths; fb = what the peer reported)")
        click.echo(tabulate([(r["prefix"], r["path_id"], " > ".join(r["segments"]), r["class"],
                              r["state"], r["downs"], r["weight"], r["tx_packets"], r["tx_bytes"],
                              (r["feedback"] or {}).get("qdelay_us", "-"),
                              (r["feedback"] or {}).get("lost", "-"), r["ce_reports"]) for r in d["sent"]],
                             headers=["prefix", "id", "segments", "class", "state", "downs", "weight",
                                      "tx pkts", "tx bytes", "fb qdelay us", "fb lost", "fb ce"]))
        click.echo("\nreceived (per sender and its path)")
        click.echo(tabulate([(r["from"], r["path_id"], r["rx_packets"], r["rx_bytes"], r["lost"],
                              r["late"], r["ce"], r["trimmed"], r["qdelay_p50_us"], r["qdelay_p99_us"])
                             for r in d["received"]],
                             headers=["from", "path", "rx pkts", "rx bytes", "lost", "late", "ce", "trimmed",
                                      "qdelay p50 us", "p99 us"]))
        for r in d["reorder"]:
            click.echo(f"reordered from {r['from']}: {r['reordered']} of {r['packets']}")

    while True:
        emit(ctx, collect(), human)
        if not watch:
            return
        time.sleep(watch)
        if not ctx.obj["json"]:
            click.echo("")


@cli.command()
@click.argument("address")
@click.option("--path", "path_ids", type=click.IntRange(0, 255), multiple=True, metavar="ID",
              help="Probe only this path (repeatable; default: every path of the peer).")
@click.option("--count", "-c", type=click.IntRange(1, 255), default=3, show_default=True,
              help="Echo requests per path.")
@click.option("--interval", type=click.FloatRange(0.001, 10), default=0.05, show_default=True,
              help="Seconds between rounds.")
@click.option("--timeout", type=click.FloatRange(0.01, 60), default=1.0, show_default=True,
              help="Seconds to wait for the last replies.")
@dev_option
@json_option
@click.pass_context
def probe(ctx, address, path_ids, count, interval, timeout, device):
    """Echo requests to ADDRESS on each path of its peer: for idle paths.

    Each request is pinned to one path; the datapath files its
    acknowledgement, so an answering path comes back up and a silent one is
    taken down as with any traffic."""
    from mrc_ebpf.control import probe as probe_mod
    with attached(device) as att:
        result = probe_mod.probe(att, address, list(path_ids), count, interval, timeout)

    def human(r):
        click.echo(f"probe {r['address']} ({r['prefix']}), {count} per path")
        click.echo(tabulate([(p["path_id"], " > ".join(p["segments"]), f"{p['received']}/{p['sent']}",
                              *((p["rtt_us"]["min"], p["rtt_us"]["median"], p["rtt_us"]["max"])
                                if p["rtt_us"] else ("-", "-", "-")), p["state"])
                             for p in r["paths"]],
                            headers=["id", "path", "replies", "rtt min us", "median", "max", "state"]))
    emit(ctx, result, human)


@cli.group()
def path():
    """Path sets: peer prefixes and the segment lists that reach them."""


@path.command("add")
@click.argument("prefix", callback=exact_prefix)
@click.option("--via", multiple=True, metavar="SEG1,SEG2,...",
              help="An SRH path: segments in travel order, as `ip route ... encap seg6 segs` "
                   "takes them; repeat to add several paths at once.")
@click.option("--usid", multiple=True, metavar="CONTAINER",
              help="A compressed (uSID) path: 32-bit block, then one 16-bit ID per hop, the "
                   "peer's last (e.g. fc00:0:101:e002::); repeatable.")
@click.option("--entropy", type=int, default=0, metavar="N",
              help="N entropy paths (EVs): no segment list, outer IPv6 straight to --sid, each "
                   "with its own outer flow label for the fabric's ECMP to hash.")
@click.option("--spare", type=int, default=0, metavar="M",
              help="With --entropy: M more EVs held back from the spray; while an EV is out "
                   "(assumed bad), a spare of its plane (device, and hop once `path trace "
                   "--order` knows it) takes its turns.")
@click.option("--sid", "peer_sid", metavar="PEER_SID",
              help="With --entropy or --template: the peer's SID.")
@click.option("--template", metavar="NAME",
              help="The paths of template NAME (mrcctl path template add), ending at --sid.")
@click.option("--weight", type=int, default=1, show_default=True, help="Weight (policy weighted).")
@click.option("--class", "tclass", metavar="NAME", help="Reserve the path for this traffic class.")
@click.option("--route-metric", "route_metrics", multiple=True, metavar="KEY=VALUE",
              help="A TCP metric of the route to PREFIX, in place of mrcctl's "
                   "(rto_min=5ms reordering=127); also quickack=1, features=ecn (where the fabric "
                   "marks) and congctl=ALGO; KEY=none removes one. Repeatable.")
@dev_option
@json_option
@click.pass_context
def path_add(ctx, prefix, via, usid, entropy, spare, peer_sid, weight, tclass, route_metrics, device,
             template):
    """Add paths towards PREFIX (a prefix may have many)."""
    from mrc_ebpf.control import paths
    if template:
        from mrc_ebpf.cli.template_cmd import add_templated
        return add_templated(ctx, prefix, template, peer_sid, device,
                             via or usid or entropy or spare or route_metrics or tclass or weight != 1)
    if not via and not usid and not entropy and not peer_sid and not spare:
        raise click.UsageError("give --via SEG1,SEG2,..., --usid CONTAINER (repeatable) "
                               "or --entropy N --sid PEER_SID")
    with attached(device, change=True) as att:
        results = paths.add(att, prefix, list(via), weight, tclass, list(usid), entropy, peer_sid,
                            list(route_metrics), spare=spare)

    def where(r):
        if r["encoding"] == "entropy":
            return (f"entropy {r['peer_sid']}" + (f" EV {r['flowlabel']:#07x}" if "flowlabel" in r else "")
                    + (" spare" if r.get("spare") else ""))
        return "usid " + r["usid"] if r["encoding"] == "usid" else "via " + ",".join(r["segments"])
    emit(ctx, results, lambda _: click.echo("\n".join(
        f"{r['prefix']} path {r['path_id']} {where(r)} "
        + ("exists already: unchanged" if r["existed"] else
           f"(+{r['overhead']} B, route MTU {r['route_mtu']}, {fmt_metrics(r['route_metrics'])})")
        for r in results)))


def fmt_metrics(metrics: dict) -> str:
    """A route's TCP metrics as `ip route` writes them."""
    return " ".join(f"{k} {v}" for k, v in metrics.items()) or "no TCP metrics"


@path.command("del")
@click.argument("prefix", shell_complete=complete_prefixes, callback=exact_prefix)
@click.option("--id", "path_id", type=int, help="Delete only this path (default: all paths of PREFIX).")
@dev_option
@json_option
@click.pass_context
def path_del(ctx, prefix, path_id, device):
    """Delete PREFIX's paths, or one of them."""
    from mrc_ebpf.control import paths
    with attached(device, change=True) as att:
        result = paths.delete(att, prefix, path_id)
    emit(ctx, result, lambda r: click.echo(f"deleted {r['removed']} {r['prefix']}"))


@path.command("policy")
@click.argument("prefix", shell_complete=complete_prefixes, callback=exact_prefix)
@click.argument("policy", type=click.Choice(POLICY_NAMES))
@dev_option
@json_option
@click.pass_context
def path_policy(ctx, prefix, policy, device):
    """How PREFIX's packets are sprayed over its paths.  A new peer takes
    bytes: round robin by bytes, a turn as long as the peer's recent
    largest packet (a segment, or a burst where bursts are sprayed);
    rr takes turns by packets."""
    from mrc_ebpf.control import paths
    with attached(device, change=True) as att:
        result = paths.set_policy(att, prefix, policy)
    emit(ctx, result, lambda r: click.echo(f"{r['prefix']}: policy {r['policy']}"))


@cli.group("class")
def class_():
    """Traffic classes: DSCP values -> class; paths may be reserved per class."""


@class_.command("set")
@click.argument("name")
@click.option("--dscp", required=True, metavar="N,N,...", help="DSCP values (0..63) of the class.")
@dev_option
@json_option
@click.pass_context
def class_set(ctx, name, dscp, device):
    """Define (or redefine) class NAME by its DSCP values."""
    from mrc_ebpf.control import classes
    with attached(device, change=True) as att:
        result = classes.set_class(att, name, dscp)
    emit(ctx, result, lambda r: click.echo(
        f"class {r['class']} (id {r['id']}): DSCP {','.join(map(str, r['dscp']))}"))


@class_.command("list")
@dev_option
@json_option
@click.pass_context
def class_list(ctx, device):
    """Classes and their DSCP values."""
    from mrc_ebpf.control import classes
    with attached(device) as att:
        rows = classes.list_classes(att)
    emit(ctx, rows, lambda rows: click.echo(tabulate(
        [(r["class"], r["id"], ",".join(map(str, r["dscp"]))) for r in rows],
        headers=["class", "id", "dscp"])))


@path.command("list")
@dev_option
@json_option
@click.pass_context
def path_list(ctx, device):
    """Configured paths with what each has sent."""
    from mrc_ebpf.control import paths
    with attached(device) as att:
        rows = paths.list_paths(att)

    def human(rows):
        # an EV's traced hop (path trace --order) before the peer's SID it ends at
        # a spare: what it stands in for ("up for 3,17"), or "spare" held back
        table = [(r["prefix"], r["path_id"], " > ".join(([r["hop"]] if r.get("hop") else []) + r["segments"]),
                  r["policy"], r["class"],
                  r["state"] + (" for " + ",".join(map(str, r["stands_in_for"])) if r["stands_in_for"] else ""),
                  r["weight"], r["tx_packets"], r["tx_bytes"], r["ce_reports"])
                 for r in rows]
        click.echo(tabulate(table, headers=["prefix", "id", "segments", "policy", "class", "state",
                                            "weight", "tx pkts", "tx bytes", "fb ce"]))
        routes = {r["prefix"]: r["route_metrics"] for r in rows if not r.get("template")}
        for prefix, metrics in routes.items():
            click.echo(f"route {prefix}: {fmt_metrics(metrics)}")
    emit(ctx, rows, human)


def main():
    cli(obj={})


from mrc_ebpf.cli.fabric_cmd import fabric  # noqa: E402
cli.add_command(fabric)
from mrc_ebpf.cli.bench_cmd import bench  # noqa: E402
cli.add_command(bench)
from mrc_ebpf.cli import ops_cmd  # noqa: E402
cli.add_command(ops_cmd.exporter)
cli.add_command(ops_cmd.decode)
cli.add_command(ops_cmd.monitor)
cli.add_command(ops_cmd.top)
cli.add_command(ops_cmd.ports)
from mrc_ebpf.cli.gc_cmd import gc  # noqa: E402
cli.add_command(gc)
from mrc_ebpf.cli.host_cmd import tune_host  # noqa: E402
cli.add_command(tune_host)
from mrc_ebpf.cli.path_state_cmd import allow as path_allow, deny as path_deny  # noqa: E402
path.add_command(path_deny)
path.add_command(path_allow)
from mrc_ebpf.cli.trace_cmd import trace as path_trace  # noqa: E402
path.add_command(path_trace)
from mrc_ebpf.cli.key_cmd import key  # noqa: E402
cli.add_command(key)
from mrc_ebpf.cli import config_cmd  # noqa: E402
cli.add_command(config_cmd.apply)
cli.add_command(config_cmd.show_config)
cli.add_command(config_cmd.save)
from mrc_ebpf.cli.fate_cmd import shared_fate  # noqa: E402
cli.add_command(shared_fate)
from mrc_ebpf.cli.template_cmd import template as path_template, bulk as path_bulk  # noqa: E402
path.add_command(path_template)
path.add_command(path_bulk)
from mrc_ebpf.cli.render_cmd import render  # noqa: E402
cli.add_command(render)
from mrc_ebpf.cli.unit_cmd import install_unit  # noqa: E402
cli.add_command(install_unit)


if __name__ == "__main__":
    main()
