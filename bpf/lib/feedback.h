/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Feedback between two hosts that both run mrc-ebpf, piggybacked on the
 * MRC TLV of the packets they send each other anyway (TCP's ACKs, the
 * reverse half of a request/response):
 *   the receiver measures each of the sender's paths (rx_paths) and, in
 *   each packet it sends back, reports on the path the sender's latest
 *   packet came over; the sender files that in path_health, which the
 *   adaptive policy reads.
 * Reporting the latest arrival's path reports each path as often as it is
 * used, with no per-packet walk.
 */
#ifndef MRC_LIB_FEEDBACK_H
#define MRC_LIB_FEEDBACK_H

#include "lib/counters.h"

/* TX: fill fb_* with what we saw from the peer whose SID is `peer_sid`. */
static __always_inline void feedback_fill(struct mrc_tlv *tlv, const struct mrc_sid *peer_sid)
{
	struct mrc_rx_key key = {};
	struct mrc_rx_peer *peer;
	struct mrc_rx_path *path;

	peer = rx_peers.lookup((struct mrc_sid *)peer_sid);
	if (!peer)
		return;
	__builtin_memcpy(key.sid, peer_sid->addr, 16);
	key.path_id = peer->last_path_id;
	path = rx_paths.lookup(&key);
	if (!path)
		return;
	tlv->flags |= MRC_F_FEEDBACK;
	tlv->fb_path_id = bpf_htons(key.path_id);
	tlv->fb_qdelay_us = bpf_htons(path->qdelay_us > 0xffff ? 0xffff : path->qdelay_us);
	tlv->fb_lost = bpf_htonl((__u32)path->lost);
}

/* RX: file the feedback a peer sent us about one of our paths to it. */
static __always_inline void feedback_file(const __u8 *src_sid, const struct mrc_tlv *tlv, __u64 now)
{
	struct mrc_path_health *health;
	struct mrc_sid sid;
	__u32 *peer_id, index, lost;
	__u16 path_id;

	if (!(tlv->flags & MRC_F_FEEDBACK))
		return;
	__builtin_memcpy(sid.addr, src_sid, 16);
	peer_id = peer_by_sid.lookup(&sid);
	path_id = bpf_ntohs(tlv->fb_path_id);
	if (!peer_id || *peer_id >= MRC_MAX_PEERS || path_id >= MRC_MAX_PATHS)
		return;
	index = *peer_id * MRC_MAX_PATHS + path_id;
	health = path_health.lookup(&index);
	if (!health)
		return;
	lost = bpf_ntohl(tlv->fb_lost);
	if (lost != health->lost)
		health->loss_ns = now;
	health->lost = lost;
	health->qdelay_us = bpf_ntohs(tlv->fb_qdelay_us);
	health->updated_ns = now;
	count(MRC_RX_FEEDBACK);
}

#endif
