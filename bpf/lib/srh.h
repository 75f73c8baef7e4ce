/* SPDX-License-Identifier: GPL-2.0 */
/* The SRv6 Segment Routing Header (RFC 8754): writing it and checking it. */
#ifndef MRC_LIB_SRH_H
#define MRC_LIB_SRH_H

#include "mrc_common.h"
#include "lib/compiler.h"
#include "lib/outer.h"
#include "lib/tlv.h"

#define SRH_ROUTING_TYPE	4

/* RFC 8754 section 2; uapi's ipv6_sr_hdr ends in a flexible array,
 * which cannot sit inside another struct. */
struct srh_fixed {
	__u8	nexthdr;
	__u8	hdrlen;		/* 8-octet units, not counting the first 8 */
	__u8	type;		/* SRH_ROUTING_TYPE */
	__u8	segments_left;
	__u8	last_entry;	/* index of the last entry of the segment list */
	__u8	flags;
	__be16	tag;
} __attribute__((packed));

struct srh_outer {
	struct ipv6hdr		ip6;
	struct srh_fixed	srh;
} __attribute__((packed));

/*
 * Writes outer IPv6 + SRH + segments + MRC TLV into the room that
 * bpf_skb_adjust_room() made after the Ethernet header.
 */
static __always_inline int srh_write_encap(struct __sk_buff *skb, const struct mrc_config *cfg,
					   const struct mrc_path *path, __u32 nseg,
					   __u8 inner_proto, __u8 tos,
					   const struct path_choice *choice)
{
	struct srh_outer hdr = {};
	struct mrc_tlv *tlv = outer_scratch();
	__u32 off = ETH_HLEN + sizeof(hdr), first;

	_Static_assert(sizeof(*tlv) <= sizeof(struct mrc_tx_scratch), "the TLV fits the scratch room");
	if (!tlv)
		return -1;

	first = nseg - 1;	/* the first segment to visit is the last entry */
	barrier_var(first);	/* keep the bound check below on this register */
	if (first >= MRC_MAX_SEGMENTS)
		return -1;

	outer_ip6_init(&hdr.ip6, cfg, path->segments[first].addr, tos, path->flowlabel,
		       skb->len - ETH_HLEN - sizeof(struct ipv6hdr), IPPROTO_ROUTING);
	hdr.srh.nexthdr = inner_proto;
	hdr.srh.hdrlen = MRC_SRH_LEN(nseg) / 8 - 1;
	hdr.srh.type = SRH_ROUTING_TYPE;
	hdr.srh.segments_left = first;
	hdr.srh.last_entry = first;

	if (bpf_skb_store_bytes(skb, ETH_HLEN, &hdr, sizeof(hdr), 0))
		return -1;
	/* The segment list is stored in wire order.  One constant-size copy
	 * per segment: a single variable-size copy verifies on 6.18 but
	 * not on 6.1, whose verifier loses the length's lower bound. */
#define STORE_SEGMENT(i)							\
	if (nseg > (i) && bpf_skb_store_bytes(skb, off + 16 * (i),		\
					      (void *)path->segments[i].addr, 16, 0)) \
		return -1;
	_Static_assert(MRC_MAX_SEGMENTS == 6, "STORE_SEGMENT below covers 6 segments");
	STORE_SEGMENT(0)
	STORE_SEGMENT(1)
	STORE_SEGMENT(2)
	STORE_SEGMENT(3)
	STORE_SEGMENT(4)
	STORE_SEGMENT(5)
#undef STORE_SEGMENT
	off += nseg * 16;

	outer_tlv_init(tlv, MRC_TLV_TYPE, cfg, path, choice);
	if (bpf_skb_store_bytes(skb, off, tlv, sizeof(*tlv), 0))
		return -1;
	return outer_set_ethertype(skb, inner_proto);
}

#endif
