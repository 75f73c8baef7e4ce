/* SPDX-License-Identifier: GPL-2.0 */
/*
 * ECN through the tunnel, RFC 6040's normal mode.  TX copies the inner
 * traffic class, ECN bits included, to the outer header (lib/outer.h), so
 * the fabric's queues can mark the packets they carry.  A mark lands on
 * the outer header, which RX strips: unless it is carried to the inner
 * one, the receiver's TCP never hears of the congestion (ECN, DCTCP and
 * every datacenter congestion control built on them break).  At decap:
 *
 *   outer CE,    inner ECT(0/1)  -> inner CE
 *   outer CE,    inner Not-ECT   -> drop (nothing could carry the mark on;
 *                                   a marking queue would have dropped a
 *                                   Not-ECT packet itself)
 *   outer ECT(1), inner ECT(0)   -> inner ECT(1)
 *   anything else                -> inner unchanged
 */
#ifndef MRC_LIB_ECN_H
#define MRC_LIB_ECN_H

#define ECN_NOT_ECT	0
#define ECN_ECT1	1
#define ECN_ECT0	2
#define ECN_CE		3

/* The ECN field of an IPv6 header: the low 2 bits of the traffic class,
 * which straddles the priority nibble and the flow label's first byte. */
static __always_inline __u8 ecn_of_ip6(const struct ipv6hdr *ip6)
{
	return (ip6->flow_lbl[0] >> 4) & 3;
}

/* Applies the outer header's ECN to the inner header (the table above).
 * Returns 0, or MRC_RX_DROP_ECN for a packet to drop.  The inner header
 * was checked by rx_check_inner. */
static __always_inline __u32 ecn_decap(const struct ipv6hdr *outer, __u16 inner_proto,
				       void *inner, void *data_end)
{
	__u8 out = ecn_of_ip6(outer), in, set;

	if (out == ECN_NOT_ECT || out == ECN_ECT0)
		return 0;
	if (inner_proto == ETH_P_IPV6) {
		struct ipv6hdr *ip6 = inner;

		if ((void *)(ip6 + 1) > data_end)
			return MRC_RX_DROP_INNER_HEADER;
		in = ecn_of_ip6(ip6);
	} else {
		struct iphdr *ip4 = inner;

		if ((void *)(ip4 + 1) > data_end)
			return MRC_RX_DROP_INNER_HEADER;
		in = ip4->tos & 3;
	}
	if (out == ECN_CE) {
		if (in == ECN_NOT_ECT)
			return MRC_RX_DROP_ECN;
		set = ECN_CE;
	} else {			/* outer ECT(1) */
		if (in != ECN_ECT0)
			return 0;
		set = ECN_ECT1;
	}
	if (in == set)
		return 0;
	if (set == ECN_CE)
		count(MRC_RX_CE);
	if (inner_proto == ETH_P_IPV6) {
		struct ipv6hdr *ip6 = inner;

		ip6->flow_lbl[0] = (ip6->flow_lbl[0] & 0xcf) | (set << 4);
	} else {
		struct iphdr *ip4 = inner;
		__u16 old = *(__u16 *)ip4, new;
		__u32 sum;

		ip4->tos = (ip4->tos & 0xfc) | set;
		new = *(__u16 *)ip4;
		/* RFC 1624: HC' = ~(~HC + ~m + m') for the 16-bit word
		 * (version/IHL, TOS) that changed. */
		sum = (__u16)~ip4->check + (__u16)~old + new;
		sum = (sum & 0xffff) + (sum >> 16);
		sum = (sum & 0xffff) + (sum >> 16);
		ip4->check = ~sum;
	}
	return 0;
}

#endif
