"""mrc-perf: iperf3-like TCP/UDP benchmark that also reports the MRC
datapath's per-path view (throughput, loss, reordering, queueing delay)
on both ends.

    mrc-perf -s [-p PORT] [-1] [-B ADDR] [-m]
    mrc-perf -c HOST [-p PORT] [-t SECS] [-P N] [-u] [-b RATE] [-l LEN] [-i SECS] [-R] [-C ALGO] [-m] [-J]

Errors are one line on stderr and exit status 1; with -J also iperf3's
{"error": ...} document on stdout.  -J is iperf3's layout (perf/iperf_json.py).
"""
from __future__ import annotations

import json
import os
import sys

import click

from mrc_ebpf.errors import MrcError

EXIT_ERROR = 1


def _fail(message: str, code: int = EXIT_ERROR, json_mode: bool = False):
    if json_mode:       # iperf3 -J prints its error as a document on stdout
        from mrc_ebpf.perf.iperf_json import error_document
        click.echo(json.dumps(error_document(message), indent=2))
    click.echo(f"mrc-perf: error: {message}", err=True)
    sys.exit(code)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-s", "--server", is_flag=True, help="Run as a server.")
@click.option("-c", "--client", "host", metavar="HOST", help="Run as a client, testing to HOST.")
@click.option("-p", "--port", type=click.IntRange(1, 65535), default=5201, show_default=True,
              help="Server port (TCP control and data; UDP data).")
@click.option("-1", "--one-off", is_flag=True, help="Server: handle one test, then exit.")
@click.option("-B", "--bind", metavar="ADDR", help="Bind to this local address.")
@click.option("-t", "--time", "duration", type=float, default=10.0, show_default=True,
              help="Seconds to transmit.")
@click.option("-P", "--parallel", "streams", type=int, default=1, show_default=True,
              help="Parallel streams.")
@click.option("-u", "--udp", is_flag=True, help="UDP instead of TCP.")
@click.option("-b", "--bitrate", metavar="RATE",
              help="Target bitrate per stream, e.g. 100M (bit/s; K/M/G are powers of 1000); "
                   "0 = unlimited.  UDP default 1M, TCP default unlimited.")
@click.option("-l", "--length", metavar="LEN",
              help="Write size (TCP, default 128K) or datagram size (UDP, default: the path's MSS).")
@click.option("-i", "--interval", type=float, default=1.0, show_default=True,
              help="Seconds between interval reports; 0 = one report for the whole test.")
@click.option("-R", "--reverse", is_flag=True, help="The server sends, the client receives.")
@click.option("-C", "--congestion", metavar="ALGO",
              help="TCP congestion control of the data streams, on both ends (default: each end's own).")
@click.option("-m", "--mptcp", is_flag=True,
              help="MPTCP (iperf3's flag): client, every data stream an MPTCP connection (its subflows "
                   "come from the kernel's path manager, `ip mptcp`); server, listen with MPTCP so "
                   "clients may ask for it.")
@click.option("-J", "--json", "json_mode", is_flag=True, help="Print one JSON document at the end.")
@click.option("--mrc-dev", metavar="DEV", help="The attached device to read (default: the only one).")
@click.option("--no-mrc", is_flag=True, help="Do not read the MRC datapath's maps.")
def main(server, host, port, one_off, bind, duration, streams, udp, bitrate, length, interval,
         reverse, congestion, mptcp, json_mode, mrc_dev, no_mrc):
    """iperf3-like benchmark with the MRC datapath's per-path view."""
    try:
        sys.exit(_run(server, host, port, one_off, bind, duration, streams, udp, bitrate, length,
                      interval, reverse, congestion, json_mode, mrc_dev, no_mrc, mptcp))
    except MrcError as e:
        _fail(str(e), json_mode=json_mode)
    except KeyboardInterrupt:
        _fail("interrupted", 130, json_mode=json_mode)
    except (click.ClickException, click.exceptions.Exit, SystemExit):
        raise
    except BrokenPipeError:
        sys.exit(EXIT_ERROR)
    except Exception as e:  # a bug: one line; MRC_DEBUG=1 shows where
        if os.environ.get("MRC_DEBUG"):
            raise
        _fail(f"internal error: {type(e).__name__}: {e} (MRC_DEBUG=1 for a traceback)",
              json_mode=json_mode)


def _run(server, host, port, one_off, bind, duration, streams, udp, bitrate, length, interval,
         reverse, congestion, json_mode, mrc_dev, no_mrc, mptcp=False) -> int:
    from mrc_ebpf.perf import session as perf
    from mrc_ebpf.perf.iperf_json import document, error_document
    from mrc_ebpf.perf.control import UDP_RATE
    from mrc_ebpf.perf.units import parse_rate, parse_size

    if server == bool(host):
        raise MrcError("give -s (server) or -c HOST (client)")
    out = perf.Output(json_mode)
    if server and congestion:
        raise MrcError("-C is a client option: the client asks for it and both ends apply it")
    if server:
        def on_doc(doc):
            if json_mode:
                click.echo(json.dumps(document(doc), indent=2))

        def on_error(message):
            if json_mode:
                click.echo(json.dumps(error_document(message), indent=2))
            click.echo(f"mrc-perf: error: {message}", err=True)
        return perf.serve(port, out, bind=bind, one_off=one_off, mrc_device=mrc_dev,
                          use_mrc=not no_mrc, on_doc=on_doc, on_error=on_error, mptcp=mptcp)
    rate = parse_rate(bitrate) if bitrate is not None else (UDP_RATE if udp else 0)
    params = perf.Params(protocol="udp" if udp else "tcp", streams=streams, duration=duration,
                         bitrate=rate, length=parse_size(length) if length else 0,
                         interval=interval, reverse=reverse, congestion=congestion,
                         mptcp=mptcp).check()
    doc = perf.run_client(host, port, params, out, bind=bind, mrc_device=mrc_dev, use_mrc=not no_mrc)
    if json_mode:
        click.echo(json.dumps(document(doc), indent=2))
    return 1 if doc["error"] else 0


if __name__ == "__main__":
    main()
