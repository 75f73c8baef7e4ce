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

/*
 * Cuts the packet after its L3 header.  Not with bpf_skb_change_tail():
 * a received packet may still carry skb->encapsulation and a pending
 * checksum from its sender (both survive veths), and change_tail refuses
 * those; shrinking the room after the network header does not.
 * Returns 0, or -1.
 */
static __always_inline int control_cut(struct __sk_buff *skb, __u32 l3_end)
{
	if (skb->len <= l3_end)
		return skb->len == l3_end ? 0 : -1;
	return bpf_skb_adjust_room(skb, -(__s32)(skb->len - l3_end), BPF_ADJ_ROOM_NET, 0) ? -1 : 0;
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
