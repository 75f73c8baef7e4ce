"""Operations verbs: `mrcctl exporter` (Prometheus metrics) and
`mrcctl decode` (a capture's MRC view)."""
from __future__ import annotations

import ipaddress
import json
import signal
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
def exporter(listen, once):
    """Serve the datapath's counters, histograms, path states and events
    as Prometheus metrics (every attachment in this network namespace)."""
    from prometheus_client import generate_latest
    from prometheus_client.exposition import start_http_server
    from mrc_ebpf.control import metrics
    from mrc_ebpf.datapath import loader, pins
    host, port = parse_listen(listen)
    loader.require_root()
    pins.ensure_bpffs()
    registry = metrics.registry()
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
