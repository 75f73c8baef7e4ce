/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The datapath's maps.  The TX (TC) and RX (XDP) programs are compiled in
 * one object (bpf/mrc.c), so they share these; the loader pins each under
 * the attachment's bpffs directory by the name given here.
 */
#ifndef MRC_LIB_MAPS_H
#define MRC_LIB_MAPS_H

#include "mrc_common.h"

BPF_ARRAY(config, struct mrc_config, 1);
BPF_LPM_TRIE(peers, struct mrc_peer_key, struct mrc_peer, MRC_MAX_PEERS);
BPF_ARRAY(paths, struct mrc_path, MRC_MAX_PEERS * MRC_MAX_PATHS);
BPF_ARRAY(peer_tx, struct mrc_peer_tx, MRC_MAX_PEERS);
BPF_ARRAY(path_tx, struct mrc_path_tx, MRC_MAX_PEERS * MRC_MAX_PATHS);
BPF_PERCPU_ARRAY(path_stats, struct mrc_path_stats, MRC_MAX_PEERS * MRC_MAX_PATHS);
BPF_PERCPU_ARRAY(counters, __u64, MRC_COUNTER_MAX);
BPF_ARRAY(spray, struct mrc_spray, MRC_MAX_PEERS * MRC_MAX_CLASSES);
BPF_ARRAY(dscp_class, __u32, 64);
BPF_ARRAY(class_names, struct mrc_class_name, MRC_MAX_CLASSES);
BPF_ARRAY(path_health, struct mrc_path_health, MRC_MAX_PEERS * MRC_MAX_PATHS);
BPF_F_TABLE("hash", struct mrc_sid, __u32, peer_by_sid, MRC_MAX_PEER_SIDS, BPF_F_NO_PREALLOC);
BPF_TABLE("lru_hash", struct mrc_rx_key, struct mrc_rx_path, rx_paths, MRC_RX_MAX_PATHS);
BPF_TABLE("lru_hash", struct mrc_sid, struct mrc_rx_peer, rx_peers, MRC_MAX_PEERS);
BPF_ARRAY(rx_peer_zero, struct mrc_rx_peer, 1);	/* all zero, never written */
BPF_ARRAY(path_live, struct mrc_path_live, MRC_MAX_PEERS * MRC_MAX_PATHS);
BPF_ARRAY(events, struct mrc_event, MRC_EVENTS);
BPF_ARRAY(event_seq, __u64, 1);
/* the same events as they happen, for `mrcctl monitor` (pinned apart
 * from the maps above: a ring buffer has no keys to read) */
BPF_RINGBUF_OUTPUT(mrc_event_ring, MRC_EVENT_RING_PAGES);
BPF_ARRAY(fb_due, __u64, MRC_MAX_PEERS);
BPF_ARRAY(peer_acks, struct mrc_peer_acks, MRC_MAX_PEERS);
BPF_ARRAY(tx_flows, struct mrc_tx_flow, MRC_TX_FLOWS);
BPF_ARRAY(peer_floor, struct mrc_peer_floor, MRC_MAX_PEERS);
BPF_ARRAY(auth, struct mrc_auth, 1);	/* epoch and MAC keys (lib/auth.h) */
BPF_PERCPU_ARRAY(tx_scratch, struct mrc_tx_scratch, 1);
/* slot i: the XDP program that was on config.devices[i] before us, which
 * mrc_rx hands on to (lib/xdp_chain.h); pinned apart from the maps above */
BPF_PROG_ARRAY(mrc_xdp_chain, MRC_MAX_DEVICES);
BPF_ARRAY(hops, struct mrc_hop, MRC_MAX_HOPS);	/* shared fate (lib/shared_fate.h) */
BPF_ARRAY(path_fate, struct mrc_path_fate, MRC_MAX_PEERS * MRC_MAX_PATHS);

#endif
