"""Aggregate TCP goodput between two hosts under different leaves, over K
equal rate-limited spines (tbf on both directions of every leaf-spine
link; the hosts' own links unlimited), as a fraction of the fabric's
capacity K x rate.

Modes, all on one fabric (h1 under l1 sends to h2 under l2):
  ecmp      no MRC attached: the leaves hash each flow's 5-tuple over the
            spines (kernel ECMP, fib_multipath_hash_policy 3);
  rr        MRC attached on both hosts, every packet sprayed round-robin
            over the K spine paths (gso_max_segs 1);
  adaptive  the same with the `adaptive` policy (power of two choices on
            the peer's delay/loss feedback);
  single    MRC with one path (paths 1..K-1 deleted on both hosts).
Goodput is mrc-perf's receiver-side byte count over the test (-J, one
interval), for 1..16 parallel TCP flows (-P).  The ACK direction is
sprayed the same way.  Linux TCP's default reordering tolerance is left
as it is (net.ipv4.tcp_reordering 3, RACK on).

Headers bound every mode below 1: the ceiling is the TCP payload of a
full-size segment over the bytes it takes on a link (tbf counts the
Ethernet header), (advmss - 12 for timestamps) / (link MTU + 14), from
the routes h1 uses: the plain one for ECMP, MRC's (MTU reduced by the
SRv6 encapsulation) for the others.  `of_ceiling` is fraction / ceiling.
"""
from __future__ import annotations

import json

from .runner import fmt3, log, mmm

TITLE = "TCP goodput, fraction of K x rate: MRC spraying vs kernel ECMP vs one path"
MODES = ("ecmp", "rr", "adaptive", "single")


def params(short: bool) -> dict:
    return {"spines": 4, "rate": "50mbit" if short else "100mbit", "host_rate": None,
            "flows": [1, 4] if short else [1, 2, 4, 16], "seconds": 1.5 if short else 8.0,
            "repeat": 1 if short else 3, "modes": list(MODES), "src": "h1", "dst": "h2",
            "tool": "mrc-perf -P FLOWS -t SECONDS -i 0 (TCP, 128 KiB writes)",
            "capacity": "spines x rate (one direction)"}


def _both(env, fab, *args_for):
    for ns, args in args_for:
        env.mrcctl(ns, *args)


def _configure(env, fab, mode: str, K: int) -> None:
    h1, h2 = fab.ns("h1"), fab.ns("h2")
    if mode in ("rr", "adaptive"):
        _both(env, fab, (h1, ["path", "policy", fab.prefix6(2), mode]),
              (h2, ["path", "policy", fab.prefix6(1), mode]))
    elif mode == "single":
        _both(env, fab, (h1, ["path", "policy", fab.prefix6(2), "rr"]),
              (h2, ["path", "policy", fab.prefix6(1), "rr"]))
        for i in range(1, K):
            _both(env, fab, (h1, ["path", "del", fab.prefix6(2), "--id", str(i)]),
                  (h2, ["path", "del", fab.prefix6(1), "--id", str(i)]))


def _ceilings(env, fab, modes) -> dict:
    """mode -> the goodput fraction headers leave when every link is busy
    (the MRC modes' route exists only while MRC is attached)."""
    h1 = fab.ns("h1")
    link_mtu = json.loads(env.run(h1, ["ip", "-j", "link", "show", "eth0"]).stdout)[0]["mtu"]
    route = json.loads(env.run(h1, ["ip", "-j", "-6", "route", "show", fab.prefix6(2)]).stdout)
    metrics = {k: v for m in (route[0].get("metrics", []) if route else []) for k, v in m.items()}
    mrc_mss = metrics.get("advmss", metrics.get("mtu", link_mtu) - 60)
    payload = {"ecmp": link_mtu - 60 - 12, "mrc": mrc_mss - 12}
    return {m: round(payload["ecmp" if m == "ecmp" else "mrc"] / (link_mtu + 14), 4) for m in modes}


def run(p: dict, env) -> dict:
    from .. import fabric as fab_mod
    from .runner import fabric
    from ..fabric import parse_rate
    capacity = p["spines"] * parse_rate(p["rate"])
    raw = {m: {str(n): [] for n in p["flows"]} for m in p["modes"]}
    port = 5400
    with fabric("sve", spines=p["spines"], leaves=2, hosts_per_leaf=1, rate=p["rate"],
                host_rate=p["host_rate"]) as fab:
        attached = False
        for mode in p["modes"]:
            if mode != "ecmp" and not attached:
                log("spray-vs-ecmp: attaching MRC on h1, h2")
                fab_mod.attach(fab.name, "h1,h2", None, [])
                attached = True
            _configure(env, fab, mode, p["spines"])
            for rep in range(p["repeat"]):
                for n in p["flows"]:
                    port += 1
                    log(f"spray-vs-ecmp: {mode}, {n} flow(s), run {rep + 1}/{p['repeat']}")
                    doc = env.perf(fab.ns("h1"), fab.ns("h2"), fab.addr6(2), port,
                                   ["-t", str(p["seconds"]), "-P", str(n)], p["seconds"])
                    rx = doc["end"]["receiver"]["sum"]["bits_per_second"]
                    tx = doc["end"]["sender"]["sum"]
                    raw[mode][str(n)].append({"goodput_bps": rx, "fraction": rx / capacity,
                                              "retransmits": tx.get("retransmits"),
                                              "sender_bps": tx["bits_per_second"]})
        ceiling = _ceilings(env, fab, p["modes"])
    summary = {m: {n: {"fraction": mmm([r["fraction"] for r in runs]),
                       "of_ceiling": (mmm([r["fraction"] / ceiling[m] for r in runs])
                                      if ceiling.get(m) else None),
                       "goodput_bps": mmm([r["goodput_bps"] for r in runs]),
                       "retransmits": mmm([r["retransmits"] for r in runs]),
                       "runs": runs} for n, runs in by_n.items()} for m, by_n in raw.items()}
    notes = []
    one = str(p["flows"][0])
    if all(one in summary[m] for m in p["modes"]):
        notes.append(f"{one} flow: " + ", ".join(f"{m} {summary[m][one]['fraction']['median']:.2f}"
                                                 for m in p["modes"]) + " of capacity (median)")
    notes.append("header ceiling (full-size segments, every link busy): "
                 + ", ".join(f"{m} {c:.3f}" for m, c in ceiling.items() if c))
    return {"capacity_bps": capacity, "ceiling": ceiling, "modes": summary, "notes": notes}


def table(results: dict):
    modes = list(results["modes"])
    flows = list(next(iter(results["modes"].values())))
    headers = ["flows", *[f"{m} fraction" for m in modes], *[f"{m} retrans" for m in modes]]
    rows = []
    for n in flows:
        rows.append([n, *[fmt3(results["modes"][m][n]["fraction"]) for m in modes],
                     *[fmt3(results["modes"][m][n]["retransmits"]) for m in modes]])
    ceiling = results.get("ceiling", {})
    rows.append(["header ceiling", *[f"{ceiling[m]:.3f}" if ceiling.get(m) else "" for m in modes],
                 *["" for _ in modes]])
    return headers, rows


def plot(results: dict, plt):
    fig, ax = plt.subplots(figsize=(7, 4))
    # in run order also when re-plotted from the JSON (written with sorted keys)
    modes = sorted(results["modes"], key=lambda m: MODES.index(m) if m in MODES else len(MODES))
    flows = sorted(next(iter(results["modes"].values())), key=int)
    width = 0.8 / len(modes)
    for i, m in enumerate(modes):
        med = [results["modes"][m][n]["fraction"]["median"] for n in flows]
        lo = [x - results["modes"][m][n]["fraction"]["min"] for x, n in zip(med, flows)]
        hi = [results["modes"][m][n]["fraction"]["max"] - x for x, n in zip(med, flows)]
        ax.bar([j + i * width for j in range(len(flows))], med, width, yerr=[lo, hi], label=m)
    ax.set_xticks([j + width * (len(modes) - 1) / 2 for j in range(len(flows))])
    ax.set_xticklabels([f"{n} flow(s)" for n in flows])
    ax.set_ylabel("goodput / (K x rate)")
    ax.set_ylim(0, 1.2)
    ax.axhline(1.0, color="grey", lw=0.5)
    for c in sorted({c for c in results.get("ceiling", {}).values() if c}):
        ax.axhline(c, color="grey", lw=0.5, ls="--")
        ax.annotate(f"header ceiling {c:.2f}", (len(flows) - 0.4, c), fontsize=6, va="bottom", ha="right")
    ax.legend(fontsize=8, ncol=len(modes), loc="upper left")
    return fig
