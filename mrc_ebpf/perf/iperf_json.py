"""mrc-perf's -J document in iperf3's layout, and a reader for both tools.

iperf3 -J (3.12) has `start` (connected[].socket, test_start, timestamp),
`intervals[]` (this end's streams and sum), `end` (streams[] with
sender/receiver, or udp, blocks; sum_sent, sum_received) and, on failure,
`error`.  mrc-perf writes the same keys with the same meanings, so a script
written for iperf3 reads it unchanged; what iperf3 has no word for (the
datapath's per-path view, one-way latency, the other end's intervals) is
under `mrc`: at the top, and in each interval.

`session` keeps its own records (both ends' intervals and summaries);
`document` turns one into this layout at output time.
"""
from __future__ import annotations

import email.utils
import os
import platform

MRC_KEY_VERSION = 1


def _version() -> str:
    try:
        from importlib.metadata import version
        return f"mrc-perf {version('mrc-ebpf')}"
    except Exception:
        return "mrc-perf"


def _system_info() -> str:
    u = os.uname()
    return f"{u.sysname} {u.nodename} {u.release} {u.version} {platform.machine()}"


def error_document(message: str, start: dict | None = None) -> dict:
    """What iperf3 -J prints when a test cannot run: the same keys, empty."""
    return {"start": {"connected": [], "version": _version(), "system_info": _system_info(),
                      **(start or {})},
            "intervals": [], "end": {}, "error": message}


def _stream(r: dict, t0: float, t1: float, seconds: float, kind: str, role: str,
            local_sender: bool, socket_id: int | None) -> dict:
    """One stream (or sum) report with iperf3's names."""
    out = {} if socket_id is None else {"socket": socket_id}
    out.update(start=t0, end=t1, seconds=seconds, bytes=r["bytes"],
               bits_per_second=r["bits_per_second"])
    if kind == "tcp" and role == "sender":
        out["retransmits"] = r.get("retransmits", 0)
        if socket_id is not None and "rtt_us" in r:
            out.update(snd_cwnd=r["snd_cwnd"], snd_wnd=r.get("snd_wnd", 0), rtt=r["rtt_us"],
                       rttvar=r.get("rttvar_us", 0), pmtu=r.get("pmtu", 0))
    elif kind == "udp" and role == "sender":
        out["packets"] = r["packets"]
    elif kind == "udp":
        # iperf3's receiver `packets` is the datagrams the sender sent
        # (received + lost), and lost_percent is taken of that
        out.update(jitter_ms=r["jitter_ms"], lost_packets=r["lost"],
                   packets=r["packets"] + r["lost"], lost_percent=r["lost_percent"])
    out["sender"] = local_sender
    return out


def _interval(rec: dict, kind: str, role: str, local_sender: bool) -> dict:
    t0, t1, sec = rec["start"], rec["end"], rec["seconds"]
    omitted = bool(rec.get("omitted", False))
    streams = [dict(_stream(s, t0, t1, sec, kind, role, local_sender, s["id"]), omitted=omitted)
               for s in rec["streams"]]
    total = dict(_stream(rec["sum"], t0, t1, sec, kind, role, local_sender, None), omitted=omitted)
    return {"streams": streams, "sum": total, "mrc": _mrc_figures(rec)}


def _mrc_figures(rec: dict | None) -> dict | None:
    """MRC's own figures of a report: the per-path view of the datapath
    (null without one) and UDP's one-way latency (receiver only)."""
    if rec is None:
        return None
    return {"paths": rec.get("mrc"), "latency_us": rec["sum"].get("latency_us")}


def _rtt_stats(intervals: list[dict], index: int) -> dict:
    rtts = [i["streams"][index].get("rtt_us", 0) for i in intervals if index < len(i["streams"])]
    rtts = [r for r in rtts if r] or [0]
    cwnds = [i["streams"][index].get("snd_cwnd", 0) for i in intervals if index < len(i["streams"])] or [0]
    wnds = [i["streams"][index].get("snd_wnd", 0) for i in intervals if index < len(i["streams"])] or [0]
    return {"max_snd_cwnd": max(cwnds), "max_snd_wnd": max(wnds), "max_rtt": max(rtts),
            "min_rtt": min(rtts), "mean_rtt": int(sum(rtts) / len(rtts))}


def _end(doc: dict, kind: str, local_sender: bool) -> dict:
    sender, receiver = doc["end"]["sender"], doc["end"]["receiver"]
    sender_intervals = doc["local" if local_sender else "remote"]["intervals"]

    def conv(rep, role, r, socket_id):
        return _stream(r, rep["start"], rep["end"], rep["seconds"], kind, role, local_sender, socket_id)

    end: dict = {"streams": []}
    for i, (s, r) in enumerate(zip(sender["streams"], receiver["streams"])):
        if kind == "tcp":
            sent = conv(sender, "sender", s, s["id"])
            sent.pop("snd_cwnd", None)
            sent.pop("rtt", None)
            sent.update(_rtt_stats(sender_intervals, i))
            sent["sender"] = local_sender
            end["streams"].append({"sender": sent, "receiver": conv(receiver, "receiver", r, r["id"])})
        else:
            udp = conv(receiver, "receiver", r, r["id"])
            udp["out_of_order"] = r["out_of_order"]
            udp["sender"] = local_sender
            end["streams"].append({"udp": udp})
    sum_sent = conv(sender, "sender", sender["sum"], None)
    sum_received = conv(receiver, "receiver", receiver["sum"], None)
    if kind == "udp":
        sum_sent.update(jitter_ms=0, lost_packets=0, lost_percent=0)
        sum_sent["sender"], sum_received["sender"] = True, False
        end["sum"] = dict(sum_received, sender=local_sender)
    end["sum_sent"], end["sum_received"] = sum_sent, sum_received
    end["cpu_utilization_percent"] = _cpu(doc)
    if kind == "tcp":
        cc = {doc[k]["role"]: doc[k]["tcp_congestion"] for k in ("local", "remote")}
        end["sender_tcp_congestion"] = cc["sender"]
        end["receiver_tcp_congestion"] = cc["receiver"]
    return end


def _cpu(doc: dict) -> dict:
    """iperf3's end.cpu_utilization_percent: each end's process, user and
    system time over the test's wall time (getrusage), in percent."""
    out = {}
    for who, side in (("host", "local"), ("remote", "remote")):
        cpu = doc[side].get("cpu") or {"total": 0.0, "user": 0.0, "system": 0.0}
        out.update({f"{who}_total": cpu["total"], f"{who}_user": cpu["user"],
                    f"{who}_system": cpu["system"]})
    return out


def document(doc: dict) -> dict:
    """session's record of a finished test -> iperf3's -J layout."""
    start = doc["start"]
    test = start["test"]
    kind = test["protocol"]
    local_sender = doc["local"]["role"] == "sender"
    out_start = {
        "connected": [{"socket": c["id"], "local_host": c["local_host"], "local_port": c["local_port"],
                       "remote_host": c["remote_host"], "remote_port": c["remote_port"]}
                      for c in start["connected"]],
        "version": _version(), "system_info": _system_info(),
        "timestamp": {"time": email.utils.formatdate(start["timestamp"], usegmt=True),
                      "timesecs": int(start["timestamp"])},
    }
    if start["role"] == "client":
        out_start["connecting_to"] = {"host": start["remote_host"], "port": start["remote_port"]}
    else:
        out_start["accepted_connection"] = {"host": start["remote_host"], "port": start["remote_port"]}
    for key in ("cookie", "tcp_mss_default"):
        if key in start:
            out_start[key] = start[key]
    out_start["target_bitrate"] = test["bitrate"]
    for key in ("sock_bufsize", "sndbuf_actual", "rcvbuf_actual"):
        if key in start:
            out_start[key] = start[key]
    out_start["test_start"] = {"protocol": kind.upper(), "num_streams": test["streams"],
                               "blksize": test["length"], "omit": _num(test.get("omit", 0)),
                               # -n: iperf3 writes duration 0
                               "duration": 0 if test.get("bytes") else _num(test["duration"]),
                               "bytes": test.get("bytes", 0),
                               "blocks": 0, "reverse": int(test["reverse"]), "tos": 0,
                               "target_bitrate": test["bitrate"]}
    local_role, remote_role = doc["local"]["role"], doc["remote"]["role"]
    out = {
        "start": out_start,
        "intervals": [_interval(i, kind, local_role, local_sender) for i in doc["local"]["intervals"]],
        "end": _end(doc, kind, local_sender),
        "mrc": {
            "version": MRC_KEY_VERSION, "role": start["role"], "test": test,
            "peer": doc.get("peer", "mrc-perf"),
            "control": {k: start[k] for k in ("local_host", "local_port", "remote_host", "remote_port")},
            "local": {"role": local_role, "datapath": doc["local"]["mrc"],
                      "tcp_congestion": doc["local"]["tcp_congestion"],
                      "mptcp_subflows": doc["local"].get("mptcp_subflows")},
            "remote": {"role": remote_role, "datapath": doc["remote"]["mrc"],
                       "tcp_congestion": doc["remote"]["tcp_congestion"],
                       "intervals": [_interval(i, kind, remote_role, not local_sender)
                                     for i in doc["remote"]["intervals"]]},
            "end": {"sender": _mrc_figures(doc["end"]["sender"]),
                    "receiver": _mrc_figures(doc["end"]["receiver"])},
        },
    }
    if "bidir_reverse" in doc:
        _add_reverse_half(out, doc, kind, local_sender)
    server_output = doc.get("server_output") or {}
    if "json" in server_output:           # iperf3 --get-server-output
        out["server_output_json"] = server_output["json"]
    if "text" in server_output:
        out["server_output_text"] = server_output["text"]
    if doc.get("error"):
        out["error"] = doc["error"]
    return out


def _add_reverse_half(out: dict, doc: dict, kind: str, local_sender: bool) -> None:
    """--bidir in iperf3's layout: each interval's streams are both halves'
    (the reverse half's with the other `sender`), its `sum` the client's
    sending half and `sum_bidir_reverse` the server's; end.streams both
    halves', then sum_sent / sum_received and their *_bidir_reverse."""
    back = {**doc, **doc["bidir_reverse"]}
    role = back["local"]["role"]
    rev = [_interval(i, kind, role, not local_sender) for i in back["local"]["intervals"]]
    for i, r in zip(out["intervals"], rev):
        i["streams"].extend(r["streams"])
        i["sum_bidir_reverse"] = r["sum"]
    end = _end(back, kind, not local_sender)
    out["end"]["streams"].extend(end["streams"])
    if "sum" in end:
        out["end"]["sum_bidir_reverse"] = end["sum"]
    out["end"]["sum_sent_bidir_reverse"] = end["sum_sent"]
    out["end"]["sum_received_bidir_reverse"] = end["sum_received"]
    mrc = out["mrc"]
    mrc["bidir_reverse"] = {
        "local": {"role": role, "intervals": rev},
        "remote": {"role": back["remote"]["role"],
                   "intervals": [_interval(i, kind, back["remote"]["role"], local_sender)
                                 for i in back["remote"]["intervals"]]},
        "end": {"sender": _mrc_figures(back["end"]["sender"]),
                "receiver": _mrc_figures(back["end"]["receiver"])}}


def _num(x):
    """A whole number as iperf3 writes it (10, not 10.0)."""
    return int(x) if float(x).is_integer() else x


def read_result(doc: dict) -> dict:
    """The figures a script wants from iperf3's -J or mrc-perf's -J (the
    same code for both): protocol, streams, what was sent and received,
    TCP retransmits, UDP loss and jitter, per-stream bytes, intervals.
    Raises ValueError with the tool's message on an error document."""
    if doc.get("error"):
        raise ValueError(doc["error"])
    ts = doc["start"]["test_start"]
    end = doc["end"]
    sent, received = end["sum_sent"], end["sum_received"]
    udp = ts["protocol"] == "UDP"
    result = {
        "protocol": ts["protocol"].lower(), "num_streams": ts["num_streams"],
        "reverse": bool(ts["reverse"]), "duration": ts["duration"],
        "sent_bytes": sent["bytes"], "sent_bps": sent["bits_per_second"],
        "received_bytes": received["bytes"], "received_bps": received["bits_per_second"],
        "retransmits": None if udp else sent.get("retransmits"),
        "packets": received["packets"] if udp else None,
        "lost_packets": received["lost_packets"] if udp else None,
        "lost_percent": received["lost_percent"] if udp else None,
        "jitter_ms": received["jitter_ms"] if udp else None,
        "sender_tcp_congestion": end.get("sender_tcp_congestion"),
        "receiver_tcp_congestion": end.get("receiver_tcp_congestion"),
        "sockets": [c["socket"] for c in doc["start"]["connected"]],
        "stream_bytes": ([s["udp"]["bytes"] for s in end["streams"]] if udp else
                         [(s["sender"]["bytes"], s["receiver"]["bytes"]) for s in end["streams"]]),
        "intervals": [{"start": i["sum"]["start"], "end": i["sum"]["end"], "bytes": i["sum"]["bytes"],
                       "bits_per_second": i["sum"]["bits_per_second"]} for i in doc["intervals"]],
    }
    return result
