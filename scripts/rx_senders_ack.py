"""Issue 28, the receive side (docs/design/scale.md): a receiver of K senders in turn over P paths each (PROG_TEST_RUN through
the real mrc_rx, then one mrc_tx packet to each): how many senders our
feedback acknowledges for every path, for some, or not at all (one
report each: paths beyond 64 need more, a report acknowledges one block).

Usage (root; TREE: a checkout whose bpf/ is compiled, with
tests/datapath/test_rx_senders.py in it):
  PYTHONPATH=TREE .venv/bin/python scripts/rx_senders_ack.py TREE 1024x64 16384x4"""
import json, os, sys, time
tree = sys.argv[1]
sys.path[:0] = [tree, os.path.join(tree, "tests")]
from datapath.harness import Datapath
from datapath import test_rx_senders as T
from datapath.test_lru_misses import _template

os.sched_setaffinity(0, {0})
dp = Datapath()
try:
    for k, p in [(int(a), int(b)) for a, b in (x.split("x") for x in sys.argv[2:])]:
        dp.configure()
        _template(dp, k)
        t0 = time.monotonic()
        sent = T.receive(dp, T.Sender(), range(k), p)
        reports = T.feedback(dp, range(k))
        acked = {h: T.acknowledged(reports[h], sent[h]) for h in range(k)}
        full = sum(1 for h in range(k) if len(acked[h]) == p)
        none = sum(1 for h in range(k) if reports[h] is None)
        pairs = sum(len(a) for a in acked.values())
        held = dp.att.maps["rx_peers"].dump()[2]
        print(json.dumps({"senders": k, "paths": p, "all_paths_acked": full, "no_feedback": none,
                          "pairs_acked": pairs, "pairs": k * p, "rx_peers_held": held,
                          "rx_peers_max": dp.att.maps["rx_peers"].max_entries,
                          "seconds": round(time.monotonic() - t0, 1)}), flush=True)
finally:
    dp.close()
