/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Feedback-only packets, for one-way traffic.  mrc_fb (TC ingress) clones
 * a packet received from a peer that is owed feedback, marked
 * MRC_FB_MARK, to this device's egress; here the clone is turned into an
 * empty packet back to its sender (addresses swapped, next header 59 "no
 * next header", payload cut), and mrc_tx then encapsulates it like any
 * packet for that peer, with MRC_F_CONTROL: the peer files the feedback
 * and drops it.  XDP cannot clone; TC can.
 */
#ifndef MRC_LIB_CONTROL_H
#define MRC_LIB_CONTROL_H

#include "lib/parse.h"

#define IPPROTO_NONE_	59	/* IPv6-NoNxt, also valid as an IPv4 protocol */

static __always_inline __u16 control_ipv4_csum(const __u16 *words)
{
	__u32 sum = 0, i;

#pragma unroll
	for (i = 0; i < 10; i++)
		sum += words[i];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return ~sum;
}

/* bpf_skb_adjust_room() moves at most 0xfff bytes a call */
#define CONTROL_CUT_STEP	0xfff
/* enough calls for 64 KB (a GSO super-packet is trimmed first, below) */
#define CONTROL_CUT_STEPS	17
/* what trimming a GSO super-packet keeps after its L3 header: above any
 * pending checksum's field, which bpf_skb_change_tail() will not cut */
#define CONTROL_TRIM_KEEP	2048

/*
 * Cuts the packet after its L3 header.  Not with bpf_skb_change_tail()
 * alone: a received packet may still carry skb->encapsulation and a
 * pending checksum from its sender (both survive veths), and change_tail
 * refuses those (and will not cut a pending checksum's field); shrinking
 * the room after the network header does not, CONTROL_CUT_STEP bytes a
 * call (a 9000-byte packet failed in one).  A GSO super-packet (the TX
 * program sees up to 64 KB: a probe copy of a burst) is first trimmed by
 * change_tail, which also makes it one packet again (its GSO state
 * reset): cut alone it would stay GSO, and a super-packet of our own
 * stack carries no skb->encapsulation.  Every probe copy of a burst
 * failed before (tx_drop_encap_fail), so a down path was never probed.
 * Returns 0, or -1.
 */
static __always_inline int control_cut(struct __sk_buff *skb, __u32 l3_end)
{
	__u32 i, left;

	if (skb->gso_size &&
	    bpf_skb_change_tail(skb, skb->len < l3_end + CONTROL_TRIM_KEEP ? skb->len : l3_end + CONTROL_TRIM_KEEP,
				0))
		return -1;
#pragma unroll
	for (i = 0; i < CONTROL_CUT_STEPS; i++) {
		if (skb->len <= l3_end)
			break;
		left = skb->len - l3_end;
		if (left > CONTROL_CUT_STEP)
			left = CONTROL_CUT_STEP;
		if (bpf_skb_adjust_room(skb, -(__s32)left, BPF_ADJ_ROOM_NET, 0))
			return -1;
	}
	return skb->len == l3_end ? 0 : -1;
}

/*
 * The clone becomes an empty packet: back to its sender (`reply`: the
 * feedback mrc_fb asked for), or on to its destination (a probe copy).
 */
static __always_inline int control_from_clone(struct __sk_buff *skb, int reply)
{
	__u16 family;
	void *l3;

	skb->mark = 0;
	l3 = parse_ip(skb, &family);
	if (!l3)
		return -1;
	if (family == ETH_P_IPV6) {
		struct ipv6hdr *in = l3, out = {};

		out.version = 6;
		out.nexthdr = IPPROTO_NONE_;
		out.hop_limit = MRC_HOP_LIMIT;
		out.saddr = reply ? in->daddr : in->saddr;
		out.daddr = reply ? in->saddr : in->daddr;
		if (control_cut(skb, ETH_HLEN + sizeof(out)) ||
		    bpf_skb_store_bytes(skb, ETH_HLEN, &out, sizeof(out), 0))
			return -1;
		return 0;
	}
	struct iphdr *in = l3, out = {};

	out.version = 4;
	out.ihl = 5;
	out.frag_off = bpf_htons(0x4000);	/* DF */
	out.ttl = MRC_HOP_LIMIT;
	out.protocol = IPPROTO_NONE_;
	out.saddr = reply ? in->daddr : in->saddr;
	out.daddr = reply ? in->saddr : in->daddr;
	out.tot_len = bpf_htons(sizeof(out));
	out.check = control_ipv4_csum((const __u16 *)&out);
	if (control_cut(skb, ETH_HLEN + sizeof(out)) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN, &out, sizeof(out), 0))
		return -1;
	return 0;
}

#endif
