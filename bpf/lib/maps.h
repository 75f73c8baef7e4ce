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

#endif
