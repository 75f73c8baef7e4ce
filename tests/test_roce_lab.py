"""The RoCE lab's parsing of perftest's report and of a capture
(mrc_ebpf/lab/roce.py), on text ib_write_bw printed in the VM (6.1, rxe)."""
from __future__ import annotations

from mrc_ebpf.lab import roce

OK = """---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 4096       3200             0.00               4.16   \t\t   0.001066
---------------------------------------------------------------------------------------
"""
FAILED = """ Completion with error at client
 Failed status 9: wr_id 1 syndrom 0x0
scnt=303, ccnt=48
 Failed to complete run_iter_bw function successfully
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
"""


def test_write_bw_report_parsed():
    r = roce.parse_write_bw(OK)
    assert r == {"ok": True, "error": None, "bytes": 4096, "iterations": 3200, "bw_peak_mb_s": 0.0,
                 "bw_avg_mb_s": 4.16, "msg_rate_mpps": 0.001066}


def test_write_bw_completion_error_is_a_failure():
    r = roce.parse_write_bw(FAILED)
    assert not r["ok"] and r["error"] == "Completion with error at client"


def test_ack_gaps_per_qp_edges_included():
    packets = [(10.0, 1, 0x11, 5), (10.2, 1, 0x11, 6), (10.9, 1, 0x11, 7),   # QP 1: ACKs
               (10.1, 2, 0x11, 1), (10.05, 2, 0x0a, 9),                        # QP 2; a request
               (12.0, 1, 0x11, 8)]                                             # outside the window
    gaps = roce.ack_gaps(packets, 10.0, 11.0)
    assert {k: round(v, 3) for k, v in gaps.items()} == {1: 0.7, 2: 0.9}


def test_ack_resume_across_the_failure():
    packets = [(9.0, 1, 0x11, 5), (9.8, 1, 0x11, 6), (11.3, 1, 0x11, 7), (10.4, 1, 0x11, 8),  # QP 1
               (9.9, 2, 0x11, 1),                                                             # QP 2: none after
               (10.5, 3, 0x11, 1),                                                            # QP 3: none before
               (9.5, 4, 0x0a, 1), (10.1, 4, 0x11, 2), (9.7, 4, 0x11, 1)]                     # QP 4; a request
    got = roce.ack_resume(packets, 10.0)
    assert {k: (round(v, 3) if v is not None else None) for k, v in got.items()} == {1: 0.6, 2: None, 4: 0.4}


def test_qp_timeout_is_rxe_s():
    assert round(roce.qp_timeout_s(17), 4) == 0.5369 and round(roce.qp_timeout_s(14), 4) == 0.0671
