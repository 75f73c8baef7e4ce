"""`mrcctl fabric`: an emulated leaf-spine fabric of network namespaces.

Registered at the end of cli/mrcctl.py; errors are MrcError, which mrcctl's
Group prints as one line and exit 1.  Names and addresses: mrc_ebpf/fabric.py.
"""
from __future__ import annotations

import functools
import json
import os

import click

from mrc_ebpf.cli.common import tabulate
from mrc_ebpf.cli.progress import Progress, progress_option
from mrc_ebpf.lab import fabric as fab_mod
from mrc_ebpf.errors import MrcError
from mrc_ebpf.datapath.source import prefixed

POLICIES = prefixed("MRC_POLICY_")      # rr, weighted, ...: bpf/mrc_common.h


def _json_opt(f):
    return click.option("-j", "--json", "json_", is_flag=True, help="Print JSON.")(f)


def _emit(json_: bool, data, human) -> None:
    ctx = click.get_current_context()
    if json_ or (ctx.obj or {}).get("json"):     # one line; mrcctl -p indents
        click.echo(json.dumps(data, indent=2 if (ctx.obj or {}).get("pretty") else None,
                              sort_keys=True))
    else:
        human(data)


class _DashDash(click.Command):
    """Everything after the first `--` is kept apart (ctx.meta['after'])."""

    def parse_args(self, ctx, args):
        if "--" in args:
            i = args.index("--")
            ctx.meta["after"] = args[i + 1:]
            args = args[:i]
        else:
            ctx.meta["after"] = None
        return super().parse_args(ctx, args)


def _name_arg(f):
    """NAME as an argument, or as -n/--name like exec, fail and heal take it."""
    @functools.wraps(f)
    def with_name(*args, name=None, name_opt=None, **kw):
        if name and name_opt and name != name_opt:
            raise MrcError(f"two fabric names, {name} and -n {name_opt}: give one")
        return f(*args, name=name or name_opt or fab_mod.DEFAULT_NAME, **kw)
    with_name = click.option("-n", "--name", "name_opt", metavar="NAME",
                             help=f"Fabric name, as NAME (default {fab_mod.DEFAULT_NAME}).")(with_name)
    return click.argument("name", required=False)(with_name)


def _fabric_of(ctx):
    """The fabric a command line being completed is about (its state, read
    without the lock: completion must not wait), or None."""
    from mrc_ebpf.lab.fabric.state import state_path
    name = ctx.params.get("name") or ctx.params.get("name_opt") or fab_mod.DEFAULT_NAME
    try:
        state = json.loads(state_path(name).read_text())
        return state, fab_mod.Fabric(state["spec"])
    except (OSError, ValueError, KeyError, MrcError):
        return None


def complete_nodes(ctx, param, incomplete):
    """Node names of the fabric (h1, s1, l2, p1s1 ...)."""
    found = _fabric_of(ctx)
    return [n for n in (found[1].nodes() if found else []) if n.startswith(incomplete)]


def complete_targets(ctx, param, incomplete):
    """What fail takes: nodes and links (s1-l2, h1-l1)."""
    found = _fabric_of(ctx)
    if not found:
        return []
    names = [*found[1].nodes(), *(lk["name"] for lk in found[1].links())]
    return [n for n in names if n.startswith(incomplete)]


def complete_faults(ctx, param, incomplete):
    """What heal takes: the targets that have faults, else every node and link."""
    found = _fabric_of(ctx)
    if not found:
        return []
    faulted = sorted({f["target"] for f in found[0].get("faults", []) if f.get("target")})
    return [n for n in faulted if n.startswith(incomplete)] or complete_targets(ctx, param, incomplete)


def _name_opt(f):
    return click.option("-n", "--name", default=fab_mod.DEFAULT_NAME, show_default=True,
                        help="Fabric name.")(f)


@click.group()
def fabric():
    """An emulated leaf-spine fabric of namespaces (up, show, attach, fail, down)."""


@fabric.command()
@_name_arg
@click.option("--spines", "-k", type=int, default=4, show_default=True, help="Spines per plane.")
@click.option("--leaves", "-l", type=int, default=2, show_default=True, help="Leaves per plane.")
@click.option("--hosts-per-leaf", "-H", "hosts_per_leaf", type=int, default=1, show_default=True,
              help="Hosts under each leaf.")
@click.option("--planes", "-p", type=int, default=1, show_default=True,
              help="Independent leaf-spine planes; each host has one NIC (eth<p>) per plane.")
@click.option("--rate", default=fab_mod.DEFAULT_RATE, show_default=True,
              help="tbf rate on both directions of every leaf-spine link (none: unlimited).")
@click.option("--host-rate", default=None, help="tbf rate on host links (default: unlimited).")
@click.option("--encoding", type=click.Choice(fab_mod.ENCODINGS), default="srh", show_default=True,
              help="srh: spine End + host SID as two segments; usid: one NEXT-C-SID container; "
                   "ev: no SRv6 in the fabric (plain IPv6 switches, leaves hashing the flow "
                   "label): entropy paths.")
@click.option("--mtu", type=int, default=fab_mod.DEFAULT_MTU, show_default=True,
              help="MTU of every link, up to 9000 (above 3506 the hosts' XDP runs in generic "
                   "mode on veth).")
@click.option("--host-sysctl", "host_sysctls", multiple=True, metavar="net.KEY=VALUE",
              help="A sysctl for every host's namespace (repeatable), e.g. "
                   "net.ipv4.tcp_min_rtt_wlen=0 for TCP over sprayed paths.")
@click.option("--ecn-threshold", "ecn_threshold", metavar="TIME",
              help="Switches mark ECN: CE on an ECN-capable packet when more than TIME (at the link's "
                   "rate, e.g. 1ms) is queued in front of it on a leaf-spine link (needs --rate; "
                   "hosts need net.ipv4.tcp_ecn=1 to ask for ECN). Default: no marking.")
@click.option("--trim-threshold", "trim_threshold", metavar="TIME",
              help="Switches trim (Ultra Ethernet's packet trimming): an MRC packet that finds more "
                   "than TIME queued in front of it on a leaf-spine link is cut to its headers and "
                   "marked, and its receiver tells the sender at once (needs --rate; docs/lab.md). "
                   "Default: no trimming.")
@click.option("--hash", "ecmp_hash", default=fab_mod.DEFAULT_HASH, show_default=True, metavar="l4|flowlabel",
              help="How the leaves hash flows onto spines: l4, the 5-tuple (a flow stays on its "
                   "spine); flowlabel, the kernel's IPv6 default (addresses + flow label: Linux TCP "
                   "moves a connection by drawing a new label on an RTO).")
@click.option("--from", "from_file", metavar="FILE",
              help="Build the fabric a description file describes (shape, links, addresses, hosts' "
                   "attach options; see mrc_ebpf/lab/fabric/description.py); the options above are "
                   "its defaults and cannot be given with it.")
@click.option("--no-key", "no_key", is_flag=True,
              help="Make no fabric key: `fabric attach` then attaches the hosts without one, and "
                   "their feedback is unauthenticated (anyone on the fabric can forge or replay it: "
                   "docs/design/threat-model.md).")
@progress_option
@_json_opt
@click.pass_context
def up(ctx, name, spines, leaves, hosts_per_leaf, planes, rate, host_rate, encoding, mtu, host_sysctls,
       ecn_threshold, trim_threshold, ecmp_hash, from_file, no_key, progress, json_):
    """Build fabric NAME (default mrc, or the description's name), with a
    fresh key that `fabric attach` gives every host (unless --no-key)."""
    if from_file:
        from click.core import ParameterSource
        given = [f"--{p.replace('_', '-')}" for p in SHAPE_OPTIONS
                 if ctx.get_parameter_source(p) not in (ParameterSource.DEFAULT, None)]
        if given:
            raise MrcError(f"--from {from_file} describes the fabric: give {', '.join(given)} in the file, "
                           f"not as an option")
        if trim_threshold:
            raise MrcError("--trim-threshold cannot be given with --from (a description has no trimming yet)")
        from mrc_ebpf.lab.fabric import description
        desc = description.load(from_file)
        why = description.too_big_to_build(desc.spec)
        if why:
            raise MrcError(f"{from_file}: {why}")
        explicit = ctx.params.get("name") or ctx.params.get("name_opt")
        s = desc.spec
        with Progress("fabric up", progress) as shown:
            r = fab_mod.up(name if explicit else s["name"], s["spines"], s["leaves"], s["hosts_per_leaf"],
                           s["planes"], s["rate"], s["host_rate"], s["encoding"], s["mtu"],
                           list(s["host_sysctls"]), s["ecn_threshold"], s["hash"], progress=shown,
                           sid_block=s["sid_block"], data_block=s["data_block"], description=desc.to_dict(),
                           key=not no_key)
    else:
        with Progress("fabric up", progress) as shown:
            r = fab_mod.up(name, spines, leaves, hosts_per_leaf, planes, rate, host_rate, encoding, mtu,
                           list(host_sysctls), ecn_threshold, ecmp_hash, progress=shown, key=not no_key,
                           trim_threshold=trim_threshold)
    _emit(json_, r, lambda r: click.echo(
        f"fabric {r['name']} up: {r['planes']} plane(s) x {r['spines']} spines x {r['leaves']} leaves, "
        f"{r['hosts']} hosts, {r['namespaces']} namespaces, {r['links']} links, encoding "
        f"{r['encoding']}, leaf-spine rate {r['rate'] or 'unlimited'}, MTU {r['mtu']}, ECMP hash {r['hash']}"
        + (f", ECN marking above {r['ecn_threshold']}" if r.get("ecn_threshold") else "")
        + (f", trimming above {r['trim_threshold']}" if r.get("trim_threshold") else "")
        + (f", key {r['key_file']}" if r.get("key_file") else ", no key (feedback unauthenticated)")
        + f" ({r['build_s']} s)"))


# the shape options of `fabric up` that a description file (--from) gives instead
SHAPE_OPTIONS = ("spines", "leaves", "hosts_per_leaf", "planes", "rate", "host_rate", "encoding", "mtu",
                 "host_sysctls", "ecn_threshold", "ecmp_hash")


def _trims_text(lk: dict) -> str:
    """'s1>l1 3/120, l1>s1 0/98': packets trimmed / MRC packets, per direction."""
    return ", ".join(f"{e['trim']['direction']} {e['trim']['trimmed']}/{e['trim']['mrc']}"
                     for e in lk["ends"] if e.get("trim"))


def _marks_text(lk: dict) -> str:
    """'s1>l1 3/120, l1>s1 0/98': CE marks given / ECN-capable packets, per direction."""
    return ", ".join(f"{e['ecn']['direction']} {e['ecn']['marked']}/{e['ecn']['ect']}"
                     for e in lk["ends"] if e.get("ecn"))


@fabric.command()
@_name_arg
@_json_opt
def show(name, json_):
    """Namespaces, hosts, switches, links (rates, faults) and every host pair's paths."""
    d = fab_mod.describe(name)

    def human(d):
        click.echo(f"fabric {d['name']} ({d['status']}): {d['planes']} plane(s), {d['spines']} spines, "
                   f"{d['leaves']} leaves, {d['hosts_per_leaf']} host(s)/leaf, encoding {d['encoding']}, "
                   f"rate {d['rate'] or 'unlimited'}, host rate {d['host_rate'] or 'unlimited'}, "
                   f"MTU {d.get('mtu', fab_mod.DEFAULT_MTU)}, ECMP hash {d['hash']}"
                   + (f" (leaves: {_hash_text(d['hash_on_leaves'])})" if d.get("hash_on_leaves") else "")
                   + (f", ECN marking above {d['ecn_threshold']}" if d.get("ecn_threshold") else "")
                   + (f", trimming above {d['trim_threshold']}" if d.get("trim_threshold") else "")
                   + "".join(f", {kv}" for kv in d.get("host_sysctls", []))
                   + (f", key {d['key_file']}" if d.get("key_file") else ", no key"))
        click.echo("\nhosts")
        click.echo(tabulate([(h["name"], h["ns"], h["sid"], h["addr6"], h["addr4"],
                              " ".join(f"{n['dev']}->{n['leaf']}" for n in h["nics"]),
                              "yes" if h["attached"] else "") for h in d["hosts"]],
                            headers=["host", "namespace", "SID", "IPv6", "IPv4", "NICs", "attached"]))
        click.echo("\nswitches")
        click.echo(tabulate([(s["name"], s["kind"], s["plane"], s["ns"], s.get("sid", ""),
                              s.get("behavior", "")) for s in d["switches"]],
                            headers=["switch", "kind", "plane", "namespace", "SID", "behavior"]))
        click.echo("\nlinks (a-b; a>b is one direction)")
        marking, trimming = bool(d.get("ecn_threshold")), bool(d.get("trim_threshold"))
        click.echo(tabulate([(lk["name"], lk["plane"], f"{lk['ends'][0]['dev']}|{lk['ends'][1]['dev']}",
                              lk["rate"] or "unlimited",
                              *([_marks_text(lk)] if marking else []),
                              *([_trims_text(lk)] if trimming else []),
                              "; ".join(_fault_text(f) for f in lk["faults"])) for lk in d["links"]],
                            headers=["link", "plane", "devices", "rate",
                                     *(["ECN marked/ECT"] if marking else []),
                                     *(["trimmed/MRC"] if trimming else []), "faults"]))
        click.echo("\npaths (host pair: one per plane and spine; mrcctl path add args)")
        for pair in d["paths"]:
            click.echo(f"{pair['src']} -> {pair['dst']}: mrcctl {' '.join(pair['path_add'])}")
        click.echo("\nnames")
        click.echo(tabulate(sorted(d["naming"].items()), tablefmt="plain"))
    _emit(json_, d, human)


def _hash_text(h: dict) -> str:
    """What the leaves' sysctls say: the hash's name if all agree, else each leaf's policy."""
    if h["hash"]:
        return h["hash"]
    return ", ".join(f"{leaf} policy {v['ipv6_policy']} fields {v['ipv6_fields']}"
                     for leaf, v in h["leaves"].items())


def _fault_text(f: dict) -> str:
    if "direction" in f:
        t = f"{f['direction']} {f['mode']}" + (f" {f['loss']:g}" if f["mode"] == "loss" else "")
        if f.get("dropped") is not None:
            t += f" (dropped {f['dropped']}, passed {f['passed']})"
        return t
    return f"down ({f['down_end']} end)"


@fabric.command()
@click.argument("name", required=False)
@click.option("--all", "all_", is_flag=True, help="Every fabric.")
@_json_opt
def down(name, all_, json_):
    """Remove fabric NAME (default mrc): pins, faults, namespaces, state."""
    if all_ and name:
        raise MrcError("give a NAME or --all, not both")
    names = fab_mod.list_names() if all_ else [name or fab_mod.DEFAULT_NAME]
    results, errors = [], []
    for n in names:
        try:
            results.append(fab_mod.down(n))
        except MrcError as e:
            errors.append(str(e))
    if errors:
        raise MrcError("; ".join(errors))
    _emit(json_, results if all_ else results[0], lambda r: click.echo(
        "\n".join(f"fabric {x['name']} down: {x['removed']} namespaces removed" for x in
                  (r if all_ else [r])) or "no fabrics"))


@fabric.command("exec", cls=_DashDash,
                context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@_name_opt
@click.argument("node", shell_complete=complete_nodes)
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def exec_(ctx, name, node, cmd):
    """Run CMD in NODE's namespace (h1, s1, l2, p1s1 ...): mrcctl fabric exec h1 -- ping ..."""
    ns = fab_mod.node_ns(name, node)
    argv = list(ctx.meta.get("after") or []) or list(cmd)
    if not argv:
        raise MrcError("no command given: mrcctl fabric exec NODE -- CMD ...")
    os.execvp("ip", ["ip", "netns", "exec", ns, *argv])


@fabric.command(cls=_DashDash)
@_name_arg
@click.option("--hosts", help="Comma-separated hosts (h1,h3 or 1,3); default all.")
@click.option("--policy", type=click.Choice(POLICIES), help="Spray policy for every peer (default bytes).")
@click.option("--ipv4", is_flag=True,
              help="Also add the IPv4 /32s as peers (their own path ids and counters; the "
                   "peer's feedback then names one of the two prefixes).")
@click.option("--entropy", type=int, metavar="N",
              help=f"--encoding ev: entropy paths per peer (default {fab_mod.DEFAULT_ENTROPY}).")
@click.option("--ev-order/--no-ev-order", default=True, show_default=True,
              help="--encoding ev: trace which spine each EV crosses and order each host's spray "
                   "to rotate over the spines (mrcctl path trace --order).")
@click.option("--render", "rendered", is_flag=True,
              help="Attach each host from its rendered config (mrcctl render of the fabric's "
                   "description: the file of `fabric up --from`, or these defaults): its attach "
                   "options, policy and every chosen peer with all its paths.")
@progress_option
@_json_opt
@click.pass_context
def attach(ctx, name, hosts, policy, ipv4, entropy, ev_order, rendered, progress, json_):
    """Attach mrc-ebpf on the hosts' NICs (eth0.. one per plane, one datapath)
    and add every other chosen host's IPv6 prefix with all its paths.

    Options after `--` go to `mrcctl attach` (e.g. -- --granularity burst)."""
    if rendered:
        if policy or ipv4 or entropy is not None or ctx.meta.get("after"):
            raise MrcError("--render takes the policy, ipv4, entropy and attach options from the "
                           "fabric's description: give them there")
        r = fab_mod.attach_rendered(name, hosts)
        _emit(json_, r, lambda r: click.echo(
            f"attached {', '.join(r['hosts'])} from rendered configs: {r['paths_per_peer']} paths per peer, "
            f"{r['attach_s']} s"))
        return
    with Progress("fabric attach", progress) as shown:
        r = fab_mod.attach(name, hosts, policy, list(ctx.meta.get("after") or []), ipv4=ipv4,
                           entropy=entropy, progress=shown, ev_order=ev_order)
    _emit(json_, r, lambda r: click.echo(
        f"attached {', '.join(r['hosts'])} on {' '.join(r['devices'])}: {r['paths_per_peer']} paths "
        f"per peer, policy {r['policy']}"))


@fabric.command()
@_name_arg
@click.option("--hosts", help="Comma-separated hosts; default every attached host.")
@_json_opt
def detach(name, hosts, json_):
    """Undo fabric attach."""
    r = fab_mod.detach(name, hosts)
    _emit(json_, r, lambda r: click.echo(f"detached {', '.join(r['detached']) or 'nothing'}"))


@fabric.command()
@click.argument("targets", nargs=-1, required=True, shell_complete=complete_targets)
@click.option("--mode", default="down", show_default=True,
              help="down (link down: the sender sees it), blackhole, or loss=P (gray: it does not).")
@_name_opt
@_json_opt
def fail(targets, mode, name, json_):
    """Fail TARGETs: links (s1-l2, p1s1-p1l2, h1-l1), directions (s1>l2) or nodes (s1, l2)."""
    r = fab_mod.fail(name, list(targets), mode)
    _emit(json_, r, lambda r: click.echo(
        "\n".join(f"{f['target']}: {f['mode']} on {f['ns']}/{f['dev']}" for f in r["installed"])))


@fabric.command()
@click.argument("targets", nargs=-1, shell_complete=complete_faults)
@click.option("--all", "all_", is_flag=True, help="Heal every fault.")
@_name_opt
@_json_opt
def heal(targets, all_, name, json_):
    """Heal faults on TARGETs (links, directions, nodes), or --all."""
    if bool(targets) == all_:
        raise MrcError("give TARGETs or --all")
    r = fab_mod.heal(name, list(targets) if targets else None)
    _emit(json_, r, lambda r: click.echo(
        "\n".join(f"healed {f['mode']} on {f['ns']}/{f['dev']} ({f['target']})" for f in r["healed"])
        or "no faults matched"))


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


@fabric.command()
@click.option("--nics", type=int, required=True, help="NICs (hosts); each has one port in every plane.")
@click.option("--planes", type=int, default=1, show_default=True, help="Independent two-tier planes.")
@click.option("--radix", type=int, required=True, help="Ports per switch (leaf: half down, half up).")
@click.option("--cpus", type=int, help="CPUs of a host, for its per-CPU maps (default: this machine's).")
@click.option("--paths", "paths", type=int, help="Paths per peer (default: all, at most 256).")
@click.option("--encoding", type=click.Choice(["srh", "usid"]), default="srh", show_default=True,
              help="How the rendered config writes paths (its size).")
@click.option("--measure", is_flag=True,
              help="Measure apply time here (root: attaches in a namespace of its own, ~20 s) and "
                   "extrapolate it to the plan's peers and paths.")
@click.option("--measure-peers", type=int, default=64, show_default=True, help="Peers --measure applies.")
@click.option("--measure-paths", type=int, default=64, show_default=True, help="Paths per peer --measure applies.")
@_json_opt
def plan(nics, planes, radix, cpus, paths, encoding, measure, measure_peers, measure_paths, json_):
    """The two-tier shape of NICS NICs in PLANES planes of radix-R switches,
    and per host: config size, kernel memory (today's maps) and apply time."""
    from mrc_ebpf.lab.fabric import sizing
    if cpus is not None and not 1 <= cpus <= 8192:
        raise MrcError(f"--cpus {cpus}: 1..8192")
    if paths is not None and not 1 <= paths <= 256:
        raise MrcError(f"--paths {paths}: 1..256 (a peer's path ids are 0..255)")
    rate = sizing.measure_apply(measure_peers, measure_paths) if measure else None
    r = sizing.plan(nics, planes, radix, cpus or sizing.possible_cpus(), paths, encoding, rate)

    def human(r):
        click.echo(f"{r['nics']} NICs, {r['planes']} plane(s) of radix-{r['radix']} switches, two tiers:")
        click.echo(tabulate([("leaves per plane", r["leaves_per_plane"]),
                             ("spines per plane", r["spines_per_plane"]),
                             ("hosts per leaf", r["hosts_per_leaf"]),
                             ("switches", r["switches"]),
                             ("paths per peer", f"{r['paths_per_peer']} of {r['paths_available']} "
                                                f"(planes x spines)"),
                             ("path lists (templates, or peers with paths of their own)", r["path_lists"])],
                            tablefmt="plain"))
        if r.get("path_choice"):
            click.echo(f"paths: {r['path_choice']}")
        c, m = r["config"], r["memory"]
        click.echo("\nper host:")
        rows = [("config", f"{_size(c['bytes'])} ({c['form']} form): {c['peers']} peers, {c['paths']} paths"),
                ("kernel memory", f"{_size(m['bytes'])} on {m['cpus']} CPUs ({_size(m['fixed_bytes'])} + "
                                  f"{_size(m['per_cpu_bytes'])} a CPU), today's maps: {m['peers_held']} "
                                  f"of {c['peers']} peers held; {_size(m['kernel_bytes'])} as the kernel "
                                  f"counts it (slab objects, the trie's intermediate nodes)")]
        if "apply" in r:
            a = r["apply"]
            rows.append(("apply time", f"{a['seconds']} s onto an attachment (attach: {a['attach_s']} s, "
                                       f"the compile): {a['how']}"))
        else:
            rows.append(("apply time", "not measured (--measure)"))
        click.echo(tabulate(rows, tablefmt="plain"))
        click.echo(f"\nmemory: {m['how']}")
    _emit(json_, r, human)
