/* SPDX-License-Identifier: GPL-2.0 */
/* The SRv6 Segment Routing Header (RFC 8754): writing it and checking it. */
#ifndef MRC_LIB_SRH_H
#define MRC_LIB_SRH_H

#include "mrc_common.h"
#include "lib/compiler.h"
#include "lib/path_select.h"
#include "lib/feedback.h"

#define SRH_ROUTING_TYPE	4
#define SRH_TLV_PAD1		0

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
	struct mrc_tlv tlv = {};
	__u32 off = ETH_HLEN + sizeof(hdr), first;
	__u32 flowlabel = path->flowlabel;

	first = nseg - 1;	/* the first segment to visit is the last entry */
	barrier_var(first);	/* keep the bound check below on this register */
	if (first >= MRC_MAX_SEGMENTS)
		return -1;

	hdr.ip6.version = 6;
	hdr.ip6.priority = tos >> 4;
	hdr.ip6.flow_lbl[0] = ((tos & 0x0f) << 4) | ((flowlabel >> 16) & 0x0f);
	hdr.ip6.flow_lbl[1] = flowlabel >> 8;
	hdr.ip6.flow_lbl[2] = flowlabel;
	hdr.ip6.payload_len = bpf_htons(skb->len - ETH_HLEN - sizeof(struct ipv6hdr));
	hdr.ip6.nexthdr = IPPROTO_ROUTING;
	hdr.ip6.hop_limit = MRC_HOP_LIMIT;
	__builtin_memcpy(&hdr.ip6.saddr, cfg->sid, 16);
	__builtin_memcpy(&hdr.ip6.daddr, path->segments[first].addr, 16);

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

	tlv.type = MRC_TLV_TYPE;
	tlv.len = MRC_TLV_LEN;
	tlv.version = MRC_VERSION;
	tlv.path_id = bpf_htons(choice->path_id);
	tlv.path_seq = bpf_htonl((__u32)choice->path_seq);
	tlv.peer_seq = bpf_htonl((__u32)choice->peer_seq);
	tlv.tclass = choice->tclass;
	tlv.flags = (choice->probe ? MRC_F_PROBE : 0) | (choice->control ? MRC_F_CONTROL : 0);
	tlv.tx_ns = mrc_htonll(bpf_ktime_get_ns());
	feedback_fill(&tlv, &path->segments[0]);
	if (bpf_skb_store_bytes(skb, off, &tlv, sizeof(tlv), 0))
		return -1;

	if (inner_proto == IPPROTO_IPIP) {
		__be16 proto = bpf_htons(ETH_P_IPV6);

		if (bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_proto), &proto,
					sizeof(proto), 0))
			return -1;
	}
	return 0;
}

/*
 * Walks the TLVs between the segment list and the end of the SRH
 * (offsets relative to the SRH).  Returns 0 or the drop reason; on
 * success *mrc points at the MRC TLV, or is NULL when there is none.
 */
static __always_inline int srh_walk_tlvs(void *srh, void *data_end, __u32 off, __u32 srh_len,
					 struct mrc_tlv **mrc)
{
	__u32 i;

	*mrc = NULL;
	for (i = 0; i < MRC_MAX_TLVS; i++) {
		__u8 *tlv;
		__u32 len;

		if (off >= srh_len)
			return 0;
		off &= 0x7ff;	/* an SRH is at most 2048 bytes: tells the verifier */
		tlv = srh + off;
		if ((void *)(tlv + 1) > data_end)
			return MRC_RX_DROP_TRUNCATED;
		if (tlv[0] == SRH_TLV_PAD1) {
			off += 1;
			continue;
		}
		if ((void *)(tlv + 2) > data_end)
			return MRC_RX_DROP_TRUNCATED;
		len = 2 + tlv[1];
		if (off + len > srh_len)
			return MRC_RX_DROP_TLV;
		if (tlv[0] == MRC_TLV_TYPE) {
			struct mrc_tlv *m = (void *)tlv;

			if (len != MRC_TLV_SIZE || (void *)(m + 1) > data_end ||
			    m->version != MRC_VERSION)
				return MRC_RX_DROP_MRC_TLV;
			*mrc = m;
		}
		off += len;
	}
	/* more TLVs than we are willing to walk */
	return off >= srh_len ? 0 : MRC_RX_DROP_TLV;
}

#endif
