"""Operations verbs: `mrcctl exporter` (Prometheus metrics) and
`mrcctl decode` (a capture's MRC view)."""
from __future__ import annotations

import ipaddress
import json
import signal
import sys
import threading

import click

from mrc_ebpf.errors import MrcError

DEFAULT_LISTEN = "127.0.0.1:9840"


def parse_listen(text: str) -> tuple[str, int]:
    """ADDR:PORT, [V6ADDR]:PORT or :PORT (loopback)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise MrcError(f"bad --listen {text!r}: expected ADDR:PORT, e.g. {DEFAULT_LISTEN} or [::1]:9840")
    host = host.strip("[]") or "127.0.0.1"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise MrcError(f"bad --listen {text!r}: {host!r} is not an IP address")
    return host, int(port)


@click.command()
@click.option("--listen", default=DEFAULT_LISTEN, show_default=True, metavar="ADDR:PORT",
              help="Where to serve /metrics (loopback unless told otherwise).")
@click.option("--once", is_flag=True,
              help="Print the page once and exit (e.g. for node_exporter's textfile collector).")
@click.option("--per-path", is_flag=True,
              help="Also one series per path (about 8 per path sent on, 21 per path received "
                   "on); default: per peer and per sender only.")
def exporter(listen, once, per_path):
    """Serve the datapath's counters, histograms, path states and events
    as Prometheus metrics (every attachment in this network namespace)."""
    from prometheus_client import generate_latest
    from prometheus_client.exposition import start_http_server
    from mrc_ebpf.control import metrics
    from mrc_ebpf.datapath import loader, pins
    host, port = parse_listen(listen)
    loader.require_root()
    pins.ensure_bpffs()
    registry = metrics.registry(per_path)
    if once:
        click.echo(generate_latest(registry).decode(), nl=False)
        return
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        raise MrcError(f"cannot listen on {listen}: {e.strerror or e}")
    click.echo(f"serving metrics on http://{'[' + host + ']' if ':' in host else host}:{port}/metrics",
               err=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        done.wait()
    except KeyboardInterrupt:
        pass
    server.shutdown()


@click.command()
@click.argument("pcap", type=click.Path(dir_okay=False))
@click.option("-j", "--json", "json_", is_flag=True, help="One JSON object per packet, one per line.")
@click.option("--all", "all_", is_flag=True, help="Also list packets without an MRC TLV.")
@click.pass_context
def decode(ctx, pcap, json_, all_):
    """Each packet's MRC view in a capture (tcpdump -w): path, sequences,
    send time, feedback; then packets per sender and path."""
    from scapy.error import Scapy_Exception
    from scapy.utils import PcapReader
    from mrc_ebpf.datapath import wire
    as_json = json_ or ctx.obj.get("json")
    counts: dict[tuple[str, int], int] = {}
    try:
        reader = PcapReader(pcap)
    except (OSError, Scapy_Exception) as e:
        raise MrcError(f"cannot read {pcap}: {getattr(e, 'strerror', None) or e}")
    with reader:
        for number, packet in enumerate(reader, start=1):
            view = wire.describe(packet)
            if view is None and not all_:
                continue
            row = {"packet": number, "time": float(packet.time), "mrc": view}
            if view is not None:
                key = (view["src"], view["path_id"])
                counts[key] = counts.get(key, 0) + 1
            if as_json:
                click.echo(json.dumps(row, separators=(",", ":")))
            elif view is None:
                click.echo(f"{number:>6} {row['time']:.6f} -")
            else:
                fb = view["feedback"]
                click.echo(f"{number:>6} {row['time']:.6f} {view['src']} > {','.join(view['segments'])} "
                           f"path {view['path_id']} seq {view['path_seq']} peer_seq {view['peer_seq']} "
                           f"tx_ns {view['tx_ns']}{' ' + '+'.join(view['flags']) if view['flags'] else ''}"
                           + (f" fb path {fb['path_id']} qdelay {fb['qdelay_us']} us lost {fb['lost']}"
                              if fb else ""))
    summary = [{"src": src, "path_id": pid, "packets": n} for (src, pid), n in sorted(counts.items())]
    if as_json:
        click.echo(json.dumps({"summary": summary}, separators=(",", ":")))
    else:
        click.echo("packets per sender and path: " + (", ".join(
            f"{s['src']} path {s['path_id']}: {s['packets']}" for s in summary) or "none"))


@click.command()
@click.option("--dev", "device", help="Device (default: the only one attached).")
@click.option("-j", "--json", "json_", is_flag=True, help="One JSON object per event, one per line.")
@click.option("--count", type=click.IntRange(1), help="Exit after this many events.")
@click.option("--timeout", type=click.FloatRange(0.1), help="Exit after this many seconds.")
@click.pass_context
def monitor(ctx, device, json_, count, timeout):
    """Path events (down, up, fail-open, late, ...) as the datapath files
    them. Every reader gets every event: each reads the datapath's event
    log at its own position, woken by its ring buffer; one that falls more
    than the log's length behind prints a `lost` line saying which events
    it missed. `ns` is the kernel's CLOCK_MONOTONIC time of the event,
    `read_ns` when this command read it."""
    import ctypes
    import time
    from mrc_ebpf.control import events, paths
    from mrc_ebpf.datapath import layout, loader, ringbuf
    as_json = json_ or ctx.obj.get("json")
    device = loader.resolve_device(device)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with loader.Attachment.open(device) as att, \
            ringbuf.Doorbell(str(att.dir / loader.EVENT_RING), ctypes.sizeof(layout.Event)) as bell:
        prefixes = {p["peer_id"]: p["prefix"] for p in paths.peers(att)}
        cursor = events.Cursor(att)
        seen = lost = 0

        def show(kind, item):
            now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            if kind == "lost":
                first, last = item
                row = {"type": "lost", "lost": last - first + 1, "first_seq": first, "last_seq": last,
                       "read_ns": now, "device": device}
                text = (f"{'':>20} lost      {row['lost']} events (seq {first}-{last}): this reader "
                        f"fell more than {cursor.size} events behind")
            else:
                ev = item
                if ev.peer_id not in prefixes:
                    prefixes.update({p["peer_id"]: p["prefix"] for p in paths.peers(att)})
                row = {"seq": ev.seq, "ns": ev.ns, "read_ns": now, "device": device,
                       "type": events.TYPES.get(ev.type, str(ev.type)), "peer_id": ev.peer_id,
                       "prefix": prefixes.get(ev.peer_id), "path_id": ev.path_id,
                       "since_ns": ev.since_ns or None,
                       "after_us": round((ev.ns - ev.since_ns) / 1e3, 1) if ev.since_ns else None}
                text = (f"{row['ns']:>20} {row['type']:<9} {row['prefix'] or '-'} path {row['path_id']}"
                        + (f" ({row['after_us']} us after an unacknowledged send)"
                           if row["after_us"] is not None else ""))
            click.echo(json.dumps(row, separators=(",", ":")) if as_json else text)

        give_up = time.monotonic() + timeout if timeout else None
        click.echo(f"monitoring path events on {device} (from seq {cursor.next})", err=True)
        try:
            while not stop.is_set():
                for kind, item in cursor.read():
                    show(kind, item)
                    if kind == "lost":
                        lost += item[1] - item[0] + 1
                    else:
                        seen += 1
                        if count and seen >= count:
                            return
                left = give_up - time.monotonic() if give_up else 0.2
                if left <= 0:
                    break
                # woken by the ring; the timeout only bounds the wait for
                # stop/--timeout and covers a datapath that does not ring
                bell.wait(min(left, 0.2))
        except KeyboardInterrupt:
            pass
        finally:
            if lost:
                click.echo(f"monitor: {seen} events shown, {lost} lost (read too slowly)", err=True)


def _top_frame(device: str, a: dict | None, b: dict, seconds: float) -> str:
    """One screen: per path sent and received, rates over the last period."""
    from tabulate import tabulate
    from mrc_ebpf.control import stats
    from mrc_ebpf.perf.units import fmt_rate

    def delta(table, key, field):
        if a is None:
            return 0
        before = a[table].get(key)
        return b[table][key][field] - (before[field] if before else 0)

    sent = []
    for key, r in sorted(b["sent"].items()):
        dp, db = delta("sent", key, "tx_packets"), delta("sent", key, "tx_bytes")
        fb = r["feedback"] or {}
        sent.append((r["prefix"], r["path_id"], r["state"], f"{dp / seconds:.0f}",
                     fmt_rate(db * 8 / seconds), r["tx_packets"], fb.get("qdelay_us", "-"),
                     fb.get("lost", "-")))
    received = []
    for key, r in sorted(b["received"].items()):
        dp, db = delta("received", key, "rx_packets"), delta("received", key, "rx_bytes")
        old = a["received"].get(key) if a else None
        hist = [y - (x if old else 0) for x, y in zip(old["qdelay_hist"] if old else r["qdelay_hist"],
                                                       r["qdelay_hist"])] if a else r["qdelay_hist"]
        p50, p99 = stats.percentile(hist, 0.5), stats.percentile(hist, 0.99)
        received.append((r["from"], r["path_id"], f"{dp / seconds:.0f}", fmt_rate(db * 8 / seconds),
                         r["rx_packets"], delta("received", key, "lost"), delta("received", key, "late"),
                         "-" if p50 is None else f"<={p50}", "-" if p99 is None else f"<={p99}"))
    reorder = [f"reordered from {peer}: {r['reordered'] - (a['reorder'].get(peer, {}).get('reordered', 0) if a else 0)}"
               f" of {r['packets'] - (a['reorder'].get(peer, {}).get('packets', 0) if a else 0)}"
               for peer, r in sorted(b["reorder"].items())]
    lines = [f"mrcctl top: {device}, every {seconds:.1f} s (rates over the last period; Ctrl-C quits)",
             "", "sent",
             tabulate(sent, headers=["peer", "path", "state", "pkt/s", "rate", "tx pkts",
                                     "fb qdelay us", "fb lost"]) if sent else "  no paths",
             "", "received",
             tabulate(received, headers=["from", "path", "pkt/s", "rate", "rx pkts", "lost", "late",
                                         "qdelay p50 us", "p99 us"]) if received else "  nothing received",
             "", *reorder]
    return "\n".join(lines)


@click.command()
@click.option("--dev", "device", help="Device (default: the only one attached).")
@click.option("-d", "--interval", type=click.FloatRange(0.1), default=1.0, show_default=True,
              help="Seconds between refreshes.")
@click.option("-n", "--iterations", type=click.IntRange(1), help="Exit after this many refreshes.")
def top(device, interval, iterations):
    """A live per-path view: rates, loss, reordering, queueing delay and
    state, refreshed in place (on a terminal; otherwise one frame after
    another)."""
    import sys
    import time
    from mrc_ebpf.control import paths, stats
    from mrc_ebpf.datapath import loader
    device = loader.resolve_device(device)
    tty = sys.stdout.isatty()

    def snapshot(att):
        return {"t": time.monotonic(),
                "sent": {(r["prefix"], r["path_id"]): r for r in paths.list_paths(att)},
                "received": {(r["from"], r["path_id"]): r for r in stats.received(att)},
                "reorder": {r["from"]: r for r in stats.reorder(att)}}

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with loader.Attachment.open(device) as att:
        prev, shown = None, 0
        try:
            while not stop.is_set():
                snap = snapshot(att)
                frame = _top_frame(device, prev, snap, snap["t"] - prev["t"] if prev else interval)
                click.echo(("\x1b[H\x1b[2J" if tty else ("\n" if shown else "")) + frame)
                shown += 1
                if iterations and shown >= iterations:
                    return
                prev = snap
                stop.wait(interval)
        except KeyboardInterrupt:
            pass


@click.group(invoke_without_command=True)
@click.option("--dev", "device", help="Device (default: the only one attached).")
@click.option("-j", "--json", "json_", is_flag=True, help="JSON output.")
@click.pass_context
def ports(ctx, device, json_):
    """Port status: the attachment's devices (planes), which are down, and
    what every TLV tells the peers (docs/design/failover.md, "Port status")."""
    if ctx.invoked_subcommand:
        ctx.obj = dict(ctx.obj or {}, ports_device=device, json=json_ or (ctx.obj or {}).get("json"))
        return
    from mrc_ebpf.control import ports as ports_mod
    from mrc_ebpf.datapath import loader
    from mrc_ebpf.datapath import port_hook
    with loader.Attachment.open(loader.resolve_device(device)) as att:
        mask, told = ports_mod.current_mask(att), ports_mod.published(att)
        rows = [dict(d, down=bool(mask >> d["plane"] & 1), told_down=bool(told >> d["plane"] & 1))
                for d in ports_mod.devices(att)]
        found = port_hook.state(att)
    if json_ or (ctx.obj or {}).get("json"):
        click.echo(json.dumps({"devices": rows, "mask": mask, "published": told, "port_status": found}))
    else:
        click.echo(f"found by: {'kernel hooks on ' + ', '.join(found['hooks']) if found['detector'] == 'kernel' else '`mrcctl ports watch` (netlink)'}")
        for r in rows:
            click.echo(f"plane {r['plane']} {r['dev']}: {'down' if r['down'] else 'up'}"
                       f"{' (peers told down)' if r['told_down'] else ''}")


@ports.command("hook")
@click.argument("state", type=click.Choice(["on", "off"]))
@click.pass_context
def ports_hook(ctx, state):
    """Put the kernel hooks that find the port status (fentry on the
    kernel's carrier and flags changes, bpf/mrc_ports.c) on or off; off,
    `mrcctl ports watch` finds the changes from netlink instead.  `attach`
    puts them on where the kernel lets it."""
    from mrc_ebpf.control import ports
    from mrc_ebpf.datapath import loader, port_hook
    loader.require_root()
    with loader.Attachment.open(loader.resolve_device(ctx.obj.get("ports_device"))) as att:
        on = state == "on"
        out = port_hook.set_hooks(att, on, loader.datapath_build() if on else None, loader.EVENT_RING)
        if state == "on":   # the hooks see changes from now on: the state they start from
            ports.publish(att, ports.current_mask(att))
        out["detector"] = port_hook.state(att)["detector"]
    if ctx.obj.get("json"):
        click.echo(json.dumps(out))
    else:
        click.echo(f"port status found by {out['detector']}"
                   + (f" (hooks on {', '.join(out['hooked'])})" if out["hooked"] else ""))
        for f, why in out["errors"].items():
            click.echo(f"  {f}: {why}")
    if state == "on" and out["detector"] != "kernel":
        ctx.exit(1)


@ports.command("watch")
@click.option("--count", type=click.IntRange(1), help="Exit after this many changes.")
@click.option("--timeout", type=click.FloatRange(0.1), help="Exit after this many seconds.")
@click.pass_context
def ports_watch(ctx, count, timeout):
    """Follow the kernel's link events for the attachment's devices: when
    one goes down (carrier or admin) or comes back, every TLV sent says so
    from then on and each peer with learnt state gets one feedback-only
    packet at once, so it stops using (or probes again) its paths through
    that plane. Runs until stopped (SIGTERM), or --count/--timeout; one
    line per change (`ns`: CLOCK_MONOTONIC when the event was read).
    With the kernel hooks on (`mrcctl ports`), the kernel already set the
    status: this only sends the packets, woken by the hook's event."""
    from mrc_ebpf.control import ports as ports_mod
    from mrc_ebpf.datapath import loader
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with loader.Attachment.open(loader.resolve_device(ctx.obj.get("ports_device"))) as att:
        from mrc_ebpf.datapath import port_hook
        click.echo(json.dumps({"watching": [d["dev"] for d in ports_mod.devices(att)],
                               "detector": port_hook.state(att)["detector"]}), nl=True)
        sys.stdout.flush()
        for change in ports_mod.watch(att, count, timeout, stop):
            if ctx.obj.get("json"):
                click.echo(json.dumps(change))
            else:
                click.echo(f"ports down {change['mask']:#x} (was {change['was']:#x}): told "
                           f"{len(change['told'])} peer(s) in {(change['done_ns'] - change['ns']) / 1e3:.0f} us")
            sys.stdout.flush()
