"""Issue 28, the receive side (docs/design/scale.md): a receiver of K
senders in turn over P paths each (PROG_TEST_RUN through the real mrc_rx,
then mrc_tx packets to each sender, one a block of 64 paths: a report
acknowledges one block): how many senders our feedback acknowledges for
every path, and how many got none.

Usage (root; TREE: a checkout with tests/datapath/test_rx_senders.py):
  PYTHONPATH=TREE .venv/bin/python scripts/rx_senders_ack.py TREE 1024x64 16384x4
"""
import json
import os
import sys
import time

tree = sys.argv[1]
sys.path[:0] = [tree, os.path.join(tree, "tests")]
from datapath import test_rx_senders as T  # noqa: E402
from datapath.harness import Datapath  # noqa: E402
from datapath.test_lru_misses import _template  # noqa: E402

os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})     # the LRUs' free lists are per CPU
dp = Datapath()
try:
    for k, p in [(int(a), int(b)) for a, b in (x.split("x") for x in sys.argv[2:])]:
        dp.configure()
        _template(dp, k)
        t0 = time.monotonic()
        sent = T.receive(dp, T.Sender(), range(k), p)
        acked = {h: set() for h in range(k)}
        none = set(range(k))
        for _ in range(-(-p // 64)):
            reports = T.feedback(dp, range(k))
            for h in range(k):
                acked[h] |= T.acknowledged(reports[h], sent[h])
                if reports[h] is not None:
                    none.discard(h)
        print(json.dumps({"senders": k, "paths": p, "all_paths_acked": sum(len(a) == p for a in acked.values()),
                          "no_feedback": len(none), "pairs_acked": sum(len(a) for a in acked.values()),
                          "pairs": k * p, "rx_peers_held": dp.att.maps["rx_peers"].dump()[2],
                          "rx_peers_max": dp.att.maps["rx_peers"].max_entries,
                          "seconds": round(time.monotonic() - t0, 1)}), flush=True)
finally:
    dp.close()
