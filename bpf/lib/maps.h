/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The datapath's maps.  The TX (TC) and RX (XDP) programs are compiled in
 * one object (bpf/mrc.c), so they share these; the loader pins each under
 * the attachment's bpffs directory by the name given here.
 */
#ifndef MRC_LIB_MAPS_H
#define MRC_LIB_MAPS_H

#include "mrc_common.h"

BPF_ARRAY(mrc_config, struct mrc_config, 1);
BPF_LPM_TRIE(mrc_peers, struct mrc_peer_key, struct mrc_peer, MRC_MAX_PEER_PREFIXES);
BPF_ARRAY(mrc_paths, struct mrc_path, MRC_MAX_PEERS * MRC_MAX_PATHS);
BPF_TABLE("lru_hash", __u32, struct mrc_peer_state, mrc_peer_state, MRC_MAX_ACTIVE_PEERS);
BPF_ARRAY(mrc_peer_state_zero, struct mrc_peer_state, 1);	/* all zero, never written */
BPF_ARRAY(mrc_row_state, struct mrc_row_state, MRC_MAX_PEERS);
/* how often each peer's state started: its first turn when new (lib/peer_state.h) */
BPF_ARRAY(mrc_peer_starts, __u64, MRC_PEER_STARTS / 4);
/* destination -> peer, before the trie (lib/peer_cache.h) */
BPF_TABLE("lru_hash", struct mrc_sid, struct mrc_peer_cached, mrc_peer_cache, MRC_PEER_CACHE);
BPF_ARRAY(mrc_peers_gen, __u32, 1);
BPF_PERCPU_ARRAY(mrc_peer_buf, struct mrc_peer_cached, 1);
BPF_PERCPU_ARRAY(mrc_counters, __u64, MRC_COUNTER_MAX);
BPF_ARRAY(mrc_spray, struct mrc_spray, MRC_MAX_PEERS * MRC_MAX_CLASSES);
BPF_ARRAY(mrc_dscp_class, __u32, 64);
BPF_ARRAY(mrc_class_names, struct mrc_class_name, MRC_MAX_CLASSES);
BPF_F_TABLE("hash", struct mrc_sid, __u32, mrc_peer_by_sid, MRC_MAX_PEER_SIDS, BPF_F_NO_PREALLOC);
BPF_TABLE("lru_hash", struct mrc_rx_key, struct mrc_rx_path, mrc_rx_paths, MRC_RX_MAX_PATHS);
BPF_TABLE("lru_hash", struct mrc_sid, struct mrc_rx_peer, mrc_rx_peers, MRC_RX_MAX_SENDERS);
BPF_ARRAY(mrc_rx_peer_zero, struct mrc_rx_peer, 1);	/* all zero, never written */
BPF_ARRAY(mrc_events, struct mrc_event, MRC_EVENTS);
BPF_ARRAY(mrc_event_seq, __u64, 1);
/* wakes `mrcctl monitor` readers when an event is logged (pinned apart
 * from the maps above: a ring buffer has no keys to read) */
BPF_RINGBUF_OUTPUT(mrc_event_ring, MRC_EVENT_RING_PAGES);
BPF_ARRAY(mrc_tx_flows, struct mrc_tx_flow, MRC_TX_FLOWS);
BPF_ARRAY(mrc_peer_floor, struct mrc_peer_floor, MRC_MAX_PEERS);
/* spare EVs: the rows that have any (lib/path_select.h) */
BPF_F_TABLE("hash", __u32, struct mrc_spares, mrc_spares, MRC_MAX_PEERS, BPF_F_NO_PREALLOC);
BPF_ARRAY(mrc_auth, struct mrc_auth, 1);	/* epoch and MAC keys (lib/auth.h) */
BPF_PERCPU_ARRAY(mrc_tx_scratch, struct mrc_tx_scratch, 1);
/* slot i: the XDP program that was on config.devices[i] before us, which
 * mrc_rx hands on to (lib/xdp_chain.h); pinned apart from the maps above */
BPF_PROG_ARRAY(mrc_xdp_chain, MRC_MAX_DEVICES);
BPF_ARRAY(mrc_hops, struct mrc_hop, MRC_MAX_HOPS);	/* shared fate (lib/shared_fate.h) */
BPF_ARRAY(mrc_path_fate, struct mrc_path_fate, MRC_MAX_PEERS * MRC_MAX_PATHS);
/* a template's path with the peer's last hop in it (lib/template.h) */
BPF_PERCPU_ARRAY(mrc_tx_path, struct mrc_path, 1);
/* the loader's names of path templates -> their row (the datapath never
 * reads it: a peer entry carries its template's row) */
BPF_F_TABLE("hash", struct mrc_template_name, struct mrc_peer, mrc_templates, MRC_MAX_PEERS, BPF_F_NO_PREALLOC);
BPF_ARRAY(mrc_auth_rx_prefix, struct mrc_mac_prefix, MRC_AUTH_RX_SENDERS);
/* RoCEv2 queue pairs and per-path RoCE counters (lib/roce.h) */
BPF_TABLE("lru_hash", struct mrc_roce_key, struct mrc_roce_qp, mrc_roce_qps, MRC_ROCE_QPS);
BPF_TABLE("lru_hash", struct mrc_roce_path_key, struct mrc_roce_path, mrc_roce_paths, MRC_ROCE_PATHS);
BPF_ARRAY(mrc_roce_turns, __u64, MRC_ROCE_TURNS);	/* the next turn of a peer's new QP */
BPF_ARRAY(mrc_roce_zero, struct mrc_roce_qp, 1);	/* all zero, never written */
BPF_PERCPU_ARRAY(mrc_roce_pkt, struct mrc_roce_pkt, 1);

/* the kernel hooks that find our port status (bpf/mrc_ports.c) */
BPF_ARRAY(mrc_port_hook, struct mrc_port_hook, 1);

#endif
