/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Choosing the path of one packet.  The cost is the same for 1 or 256
 * paths: one atomic add and one modulo, no walk over the set.
 */
#ifndef MRC_LIB_PATH_SELECT_H
#define MRC_LIB_PATH_SELECT_H

#include "lib/maps.h"

struct path_choice {
	__u32	path_index;	/* key into paths/path_tx/path_stats */
	__u16	path_id;	/* index within the peer's set, sent in the TLV */
	__u64	peer_seq;
	__u64	path_seq;
};

static __always_inline int choose_path(const struct mrc_peer *peer, struct path_choice *choice)
{
	__u32 peer_id = peer->peer_id;
	__u32 n_paths = peer->n_paths;
	struct mrc_peer_tx *ptx;

	if (n_paths == 0 || n_paths > MRC_MAX_PATHS || peer_id >= MRC_MAX_PEERS)
		return -1;
	ptx = peer_tx.lookup(&peer_id);
	if (!ptx)
		return -1;
	/* A per-peer number across all paths: the receiver reads
	 * reordering from it.  It is not used for loss, so a number taken
	 * by a packet that is dropped later does no harm. */
	choice->peer_seq = __sync_fetch_and_add(&ptx->seq, 1);
	choice->path_id = choice->peer_seq % n_paths;	/* MRC_POLICY_RR */
	choice->path_index = peer_id * MRC_MAX_PATHS + choice->path_id;
	return 0;
}

#endif
