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
#include "lib/compiler.h"
#include "lib/failover.h"

/*
 * RX: a sender we have not answered for fb_interval is owed feedback; if
 * no packet of ours goes its way soon, mrc_fb makes one (one-way traffic).
 */
static __always_inline void feedback_due(const __u8 *src_sid, const struct mrc_config *cfg,
					 __u64 now)
{
	struct mrc_sid sid;
	struct mrc_rx_peer *peer;
	__u32 *peer_id;
	__u64 *due;

	__builtin_memcpy(sid.addr, src_sid, 16);
	peer = rx_peers.lookup(&sid);
	if (!peer || now - peer->fb_sent_ns < (__u64)cfg->fb_interval_us * 1000)
		return;
	peer_id = peer_by_sid.lookup(&sid);
	if (!peer_id)
		return;		/* not a configured peer: we have no path to answer on */
	due = fb_due.lookup(peer_id);
	if (due && !*due)
		*due = 1;
}

/* The earliest of the latest send times of the paths in `heard`. */
static __always_inline __u64 heard_since(const struct mrc_rx_peer *peer, __u32 block, __u64 heard)
{
	__u64 since = ~0ULL, tx;
	__u32 bit, base = (block & (MRC_MAX_PATHS / 64 - 1)) * 64;

#pragma unroll
	for (bit = 0; bit < 64; bit++) {
		tx = peer->latest_tx[(base + bit) & (MRC_MAX_PATHS - 1)];
		if ((heard & (1ULL << bit)) && tx < since)
			since = tx;
	}
	return since;
}

/* TX: report the next block of path ids with news (rotating), and clear it. */
static __always_inline void feedback_fill_heard(struct mrc_tlv *tlv, struct mrc_rx_peer *peer)
{
	__u32 i, block;

#pragma unroll
	for (i = 0; i < MRC_MAX_PATHS / 64; i++) {
		block = (peer->fb_block + i) & (MRC_MAX_PATHS / 64 - 1);
		if (peer->heard[block]) {
			tlv->fb_block = block;
			tlv->fb_heard = mrc_htonll(peer->heard[block]);
			tlv->fb_since_ns32 = bpf_htonl((__u32)heard_since(peer, block, peer->heard[block]));
			peer->heard[block] = 0;
			peer->fb_block = block + 1;
			return;
		}
	}
}

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
	feedback_fill_heard(tlv, peer);
	peer->fb_sent_ns = bpf_ktime_get_ns();
	tlv->fb_path_id = bpf_htons(key.path_id);
	tlv->fb_path_tx32 = bpf_htonl((__u32)peer->latest_tx[key.path_id & (MRC_MAX_PATHS - 1)]);
	tlv->fb_qdelay_us = bpf_htons(path->qdelay_us > 0xffff ? 0xffff : path->qdelay_us);
	tlv->fb_lost = bpf_htonl((__u32)path->lost);
}

/*
 * RX: the peer heard, on each path of `heard`, a packet we sent at or
 * after `since32` (the low 32 bits of our clock): file that per path.
 */
/* Our clock, from its low 32 bits echoed back (less than 4.29 s old). */
static __always_inline __u64 widen_ns(__u32 low, __u64 now)
{
	return now - (__u32)((__u32)now - low);
}

static __always_inline void feedback_ack(__u32 peer_id, __u32 block, __u64 heard, __u32 since32,
					 __u16 path_id, __u32 path_tx32, __u64 now)
{
	struct mrc_peer_acks *acks = peer_acks.lookup(&peer_id);
	__u32 base = (block & (MRC_MAX_PATHS / 64 - 1)) * 64, bit;
	__u64 since = widen_ns(since32, now), exact = widen_ns(path_tx32, now);
	__u64 *ns;

	if (!acks)
		return;
	acks->last_ns = now;
	/* the named path, exactly (the block's figure is a lower bound) */
	ns = &acks->ns[path_id & (MRC_MAX_PATHS - 1)];
	if (path_tx32 && *ns < exact)
		*ns = exact;
	if (exact > acks->max_ns && path_tx32)
		acks->max_ns = exact;
	if (!heard)
		return;
	if (since > acks->max_ns)
		acks->max_ns = since;
#pragma unroll
	for (bit = 0; bit < 64; bit++) {
		ns = &acks->ns[(base + bit) & (MRC_MAX_PATHS - 1)];
		if ((heard & (1ULL << bit)) && *ns < since)
			*ns = since;
	}
}

/* RX: file the feedback a peer sent us about our paths to it. */
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
	feedback_ack(*peer_id, tlv->fb_block, mrc_ntohll(tlv->fb_heard),
		     bpf_ntohl(tlv->fb_since_ns32), path_id, bpf_ntohl(tlv->fb_path_tx32), now);
	count(MRC_RX_FEEDBACK);
}

#endif
