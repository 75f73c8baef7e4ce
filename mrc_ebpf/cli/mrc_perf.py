"""mrc-perf: iperf3-like TCP/UDP benchmark that also reports the MRC
datapath's per-path view (throughput, loss, reordering, queueing delay)
on both ends.

    mrc-perf -s [-p PORT] [-1] [-B ADDR] [-m] [-4|-6]
    mrc-perf -c HOST [-p PORT] [-t SECS | -n BYTES] [-O SECS] [-P N] [-u] [-b RATE] [-l LEN] [-w SIZE]
                     [-i SECS] [-R] [-C ALGO] [-m] [-4|-6] [-J] [--get-server-output]
    common: [-f kmgtKMGT] [-V] [--logfile FILE] [--version]

It speaks iperf3's control protocol too: `mrc-perf -c` runs against
`iperf3 -s`, and `iperf3 -c` against `mrc-perf -s` (perf/iperf3_proto.py).

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


_LOG = None         # --logfile: where output goes instead of stdout


def _echo(text: str) -> None:
    click.echo(text, file=_LOG)
    if _LOG is not None:
        _LOG.flush()


def _fail(message: str, code: int = EXIT_ERROR, json_mode: bool = False):
    if json_mode:       # iperf3 -J prints its error as a document on stdout
        from mrc_ebpf.perf.iperf_json import error_document
        _echo(json.dumps(error_document(message), indent=2))
    elif _LOG is not None:
        _echo(f"mrc-perf: error: {message}")
    click.echo(f"mrc-perf: error: {message}", err=True)
    sys.exit(code)


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("mrc-ebpf")
    except Exception:
        return "unknown"


def _print_version(ctx, _param, value):
    if not value or ctx.resilient_parsing:
        return
    click.echo(f"mrc-perf {_version()} (speaks iperf3 3.x's control protocol)")
    u = os.uname()
    click.echo(f"{u.sysname} {u.nodename} {u.release} {u.version} {u.machine}")
    ctx.exit(0)


class _OneLineErrors(click.Command):
    """Bad arguments as one line on stderr (exit 2), not click's usage block."""

    def main(self, *args, **kwargs):
        kwargs["standalone_mode"] = False
        try:
            code = super().main(*args, **kwargs)
        except click.ClickException as e:
            click.echo(f"mrc-perf: error: {e.format_message()} (mrc-perf --help)", err=True)
            sys.exit(e.exit_code)
        except click.exceptions.Abort:
            sys.exit(EXIT_ERROR)
        sys.exit(code if isinstance(code, int) else 0)


@click.command(cls=_OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
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
@click.option("-O", "--omit", type=float, default=0.0, metavar="SECS",
              help="Leave out the first SECS seconds (TCP slow start): reported as omitted, "
                   "not counted in the summary.")
@click.option("-n", "--bytes", "nbytes", metavar="BYTES",
              help="Bytes to send in all (K/M/G powers of 1024), instead of -t.")
@click.option("-w", "--window", metavar="SIZE",
              help="Socket buffer size (SO_SNDBUF and SO_RCVBUF) of the data sockets, both ends.")
@click.option("-f", "--format", "unit", metavar="[kmgtKMGT]",
              help="Rate unit: k/m/g/t bits, K/M/G/T bytes per second (default adaptive bits).")
@click.option("-4", "--version4", "only4", is_flag=True, help="IPv4 only.")
@click.option("-6", "--version6", "only6", is_flag=True, help="IPv6 only.")
@click.option("--bidir", is_flag=True, help="Both directions at once: -P streams each way.")
@click.option("--get-server-output", is_flag=True,
              help="Print the server's report too (its JSON under server_output_json with -J "
                   "when the server runs -J, else its text).")
@click.option("--logfile", type=click.Path(dir_okay=False), metavar="FILE",
              help="Append the output to FILE instead of stdout.")
@click.option("-V", "--verbose", is_flag=True, help="More detail (cookie, CPU utilisation).")
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Print the version and exit.")
@click.option("--mrc-dev", metavar="DEV", help="The attached device to read (default: the only one).")
@click.option("--no-mrc", is_flag=True, help="Do not read the MRC datapath's maps.")
def main(server, host, port, one_off, bind, duration, streams, udp, bitrate, length, interval,
         reverse, congestion, mptcp, json_mode, omit, nbytes, window, unit, only4, only6, bidir,
         get_server_output, logfile, verbose, mrc_dev, no_mrc):
    """iperf3-like benchmark with the MRC datapath's per-path view."""
    global _LOG
    try:
        if logfile:
            try:
                _LOG = open(logfile, "a")
            except OSError as e:
                raise MrcError(f"cannot open log file {logfile}: {e.strerror or e}")
        extra = dict(omit=omit, nbytes=nbytes, window=window, unit=unit, only4=only4, only6=only6,
                     bidir=bidir, get_server_output=get_server_output, verbose=verbose)
        sys.exit(_run(server, host, port, one_off, bind, duration, streams, udp, bitrate, length,
                      interval, reverse, congestion, json_mode, mrc_dev, no_mrc, mptcp, **extra))
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
         reverse, congestion, json_mode, mrc_dev, no_mrc, mptcp=False, omit=0.0, nbytes=None,
         window=None, unit=None, only4=False, only6=False, bidir=False, get_server_output=False,
         verbose=False) -> int:
    import socket

    from mrc_ebpf.perf import session as perf
    from mrc_ebpf.perf.iperf_json import document, error_document
    from mrc_ebpf.perf.control import UDP_RATE
    from mrc_ebpf.perf.units import parse_rate, parse_size

    if server == bool(host):
        raise MrcError("give -s (server) or -c HOST (client)")
    if only4 and only6:
        raise MrcError("give -4 or -6, not both")
    if unit is not None and (len(unit) != 1 or unit not in "kmgtKMGT"):
        raise MrcError(f"bad format {unit!r}: one of k m g t K M G T")
    family = socket.AF_INET if only4 else socket.AF_INET6 if only6 else 0
    out = perf.Output(json_mode, stream=_LOG, verbose=verbose, unit=unit)
    if server:
        for flag, given in (("-C", congestion), ("-O", omit), ("-n", nbytes), ("-w", window),
                            ("--get-server-output", get_server_output), ("--bidir", bidir)):
            if given:
                raise MrcError(f"{flag} is a client option: the client asks for it")
        out.detail(f"mrc-perf {_version()}")

        def on_doc(doc):
            if json_mode:
                _echo(json.dumps(document(doc), indent=2))

        def on_error(message):
            if json_mode:
                _echo(json.dumps(error_document(message), indent=2))
            click.echo(f"mrc-perf: error: {message}", err=True)
        return perf.serve(port, out, bind=bind, one_off=one_off, mrc_device=mrc_dev,
                          use_mrc=not no_mrc, on_doc=on_doc, on_error=on_error, mptcp=mptcp,
                          family=family)
    rate = parse_rate(bitrate) if bitrate is not None else (UDP_RATE if udp else 0)
    params = perf.Params(protocol="udp" if udp else "tcp", streams=streams, duration=duration,
                         bitrate=rate, length=parse_size(length) if length else 0,
                         interval=interval, reverse=reverse, congestion=congestion,
                         mptcp=mptcp, omit=omit, bytes=parse_size(nbytes, "number of bytes") if nbytes else 0,
                         window=parse_size(window, "window") if window else 0,
                         get_server_output=get_server_output, bidir=bidir).check()
    out.detail(f"mrc-perf {_version()}")
    doc = perf.run_client(host, port, params, out, bind=bind, mrc_device=mrc_dev, use_mrc=not no_mrc,
                          family=family)
    if json_mode:
        _echo(json.dumps(document(doc), indent=2))
    return 1 if doc["error"] else 0


if __name__ == "__main__":
    main()
