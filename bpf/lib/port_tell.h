/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Our port status told to every peer from the first packet in (issue 29;
 * MRC's Port Status Update).  When one of our planes' devices goes down
 * (config.ports_down, set by the kernel hooks of bpf/mrc_ports.c or by
 * `mrcctl ports watch`), each peer used to hear it in the feedback its
 * own next packet into us drew (lib/feedback.h, feedback_due): a wait of
 * up to a peer's gap between packets on a live plane (1-1.5 ms at 2000
 * packets a second over 2 planes, the bench's), which was most of the
 * time to the slowest peer.  Here the first packet from any peer after
 * the change (mrc_fb, TC ingress) sends a feedback-only packet to each
 * peer of port_hook.tell[] at once, on one of our paths to it through a
 * plane that is up: so every peer hears it after one packet's wait (a
 * quarter of it with 4 peers sending), without a user-space wake-up.
 *
 * tell[] learns the peers from their packets (a slot a peer, by its
 * peer_id: a peer whose slot another took is told as before, by its own
 * next packet): one compare a packet.  A clone is the packet itself with
 * its addresses set to ours -> the peer's, marked MRC_PROBE_COPY_MARK |
 * path (mrc_tx cuts it to its headers and sends it on that path, as it
 * sends the watcher's packets: control/ports.py); the packet's own bytes
 * are put back before it goes up.  Only peers of the packet's family (the
 * addresses are rewritten in place).  Event MRC_EV_PORT_TOLD each.
 */
#ifndef MRC_LIB_PORT_TELL_H
#define MRC_LIB_PORT_TELL_H

#include "lib/maps.h"
#include "lib/counters.h"
#include "lib/peer_state.h"
#include "lib/event_log.h"
#include "lib/feedback.h"

/* Our path to a peer of ROW through the first plane not in DOWN: its
 * lowest path that is up (of the first four of each word of 64), or -1. */
static __always_inline int port_tell_path(const struct mrc_config *cfg, __u32 row, __u32 down)
{
	struct mrc_peer_floor *f = mrc_peer_floor.lookup(&row);
	struct mrc_row_state *rs = row_state_get(row);
	__u32 n = cfg->n_devices, live, p, w, t, id;
	__u64 word;

	live = ~down & ((1U << (n < MRC_MAX_DEVICES ? n : MRC_MAX_DEVICES)) - 1);
	if (!f || !rs || !live)
		return -1;
	p = feedback_lowest_bit(live) & (MRC_MAX_DEVICES - 1);
#pragma unroll
	for (w = 0; w < MRC_MAX_PATHS / 64; w++) {
		word = f->plane_paths[p].ids[w];
#pragma clang loop unroll(disable)
		for (t = 0; t < 4; t++) {
			if (!word)
				break;
			id = (w * 64 + feedback_lowest_bit(word)) & (MRC_MAX_PATHS - 1);
			if (!row_path_live(rs, id)->down_ns)
				return id;
			word &= word - 1;
		}
	}
	return -1;
}

/* Each peer of tell[] (of the packet's family, V4) sent a feedback-only
 * packet: the packet's addresses (ALEN bytes each, from OFF) set to ours
 * (its destination) -> the peer's, cloned, then put back. */
static __always_inline void port_tell_all(struct __sk_buff *skb, const struct mrc_config *cfg,
					  struct mrc_port_hook *h, __u32 down, int v4)
{
	__u32 i, mark = skb->mark, off;
	__u8 orig[32], buf[32];
	struct mrc_port_tell *slot;
	int id;

	off = v4 ? ETH_HLEN + offsetof(struct iphdr, saddr) : ETH_HLEN + offsetof(struct ipv6hdr, saddr);
	/* constant sizes: both addresses, 8 or 32 bytes */
	if (v4 ? bpf_skb_load_bytes(skb, off, orig, 8) : bpf_skb_load_bytes(skb, off, orig, 32))
		return;
	__builtin_memcpy(buf, orig, 32);
	/* ours as the source: the packet's destination */
	if (v4)
		__builtin_memcpy(buf, &orig[4], 4);
	else
		__builtin_memcpy(buf, &orig[16], 16);
#pragma clang loop unroll(disable)
	for (i = 0; i < MRC_PORT_TELL; i++) {
		slot = &h->tell[i & (MRC_PORT_TELL - 1)];
		if (!slot->peer_id1)
			continue;
		/* IPv4-mapped ::ffff:a.b.c.d, or an IPv6 address */
		if (v4 != (*(__u64 *)slot->addr == 0 && *(__u32 *)&slot->addr[8] == bpf_htonl(0xffff)))
			continue;
		id = port_tell_path(cfg, slot->row, down);
		if (id < 0)
			continue;
		if (v4)
			__builtin_memcpy(&buf[4], &slot->addr[12], 4);
		else
			__builtin_memcpy(&buf[16], slot->addr, 16);
		if (v4 ? bpf_skb_store_bytes(skb, off, buf, 8, BPF_F_RECOMPUTE_CSUM) :
			 bpf_skb_store_bytes(skb, off, buf, 32, BPF_F_RECOMPUTE_CSUM))
			break;
		skb->mark = MRC_PROBE_COPY_MARK | id;
		if (bpf_clone_redirect(skb, skb->ifindex, 0) == 0) {
			count(MRC_FB_PORT_TELL);
			failover_event_log(slot->peer_id1 - 1, id, MRC_EV_PORT_TOLD, bpf_ktime_get_ns(), 0);
		}
	}
	skb->mark = mark;
	if (v4)
		bpf_skb_store_bytes(skb, off, orig, 8, BPF_F_RECOMPUTE_CSUM);
	else
		bpf_skb_store_bytes(skb, off, orig, 32, BPF_F_RECOMPUTE_CSUM);
}

/*
 * mrc_fb, per packet from a configured peer (PEER, its address KEY): its
 * slot learnt, and when our port status changed since every peer of
 * tell[] was last told, each told now (one packet does it: the one that
 * wins the compare-and-swap).
 */
static __always_inline void port_tell(struct __sk_buff *skb, const struct mrc_config *cfg,
				      const struct mrc_peer *peer, const struct mrc_peer_key *key, int v4)
{
	__u32 zero = 0;
	__u64 told, down = cfg->ports_down;
	struct mrc_port_hook *h = mrc_port_hook.lookup(&zero);
	struct mrc_port_tell *slot;

	if (!h)
		return;
	slot = &h->tell[peer->peer_id & (MRC_PORT_TELL - 1)];
	if (slot->peer_id1 != peer->peer_id + 1) {
		__builtin_memcpy(slot->addr, key->addr, 16);
		slot->row = peer->template_id;
		slot->peer_id1 = peer->peer_id + 1;
	}
	told = h->told;
	if (told == down || !__sync_bool_compare_and_swap(&h->told, told, down))
		return;
	port_tell_all(skb, cfg, h, (__u32)down, v4);
}

#endif
