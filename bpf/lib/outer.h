/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What every encapsulation writes the same way, SRH or uSID: the outer
 * IPv6 header and the MRC TLV.  Only where the path goes differs.
 */
#ifndef MRC_LIB_OUTER_H
#define MRC_LIB_OUTER_H

#include "mrc_common.h"
#include "lib/compiler.h"
#include "lib/path_select.h"
#include "lib/feedback.h"
#include "lib/auth.h"

/* Outer IPv6 from us (our SID) to `dst`.  The inner packet's traffic
 * class is copied out, so switches queue it by class; the flow label is
 * the path's own entropy. */
static __always_inline void outer_ip6_init(struct ipv6hdr *ip6, const struct mrc_config *cfg,
					   const __u8 *dst, __u8 tos, __u32 flowlabel,
					   __u32 payload_len, __u8 nexthdr)
{
	ip6->version = 6;
	ip6->priority = tos >> 4;
	ip6->flow_lbl[0] = ((tos & 0x0f) << 4) | ((flowlabel >> 16) & 0x0f);
	ip6->flow_lbl[1] = flowlabel >> 8;
	ip6->flow_lbl[2] = flowlabel;
	ip6->payload_len = bpf_htons(payload_len);
	ip6->nexthdr = nexthdr;
	ip6->hop_limit = MRC_HOP_LIMIT;
	__builtin_memcpy(&ip6->saddr, cfg->sid, 16);
	__builtin_memcpy(&ip6->daddr, dst, 16);
}

/* The MRC TLV of this packet; `type` is MRC_TLV_TYPE in an SRH,
 * MRC_OPT_TYPE in a Destination Options header (same layout). */
static __always_inline void outer_tlv_init(struct mrc_tlv *tlv, __u8 type, const struct mrc_config *cfg,
					 const struct mrc_path *path, const struct path_choice *choice)
{
	tlv->type = type;
	tlv->len = MRC_TLV_LEN;
	tlv->version = MRC_VERSION;
	tlv->path_id = bpf_htons(choice->path_id);
	tlv->path_seq = bpf_htonl((__u32)choice->path_seq);
	tlv->peer_seq = bpf_htonl((__u32)choice->peer_seq);
	tlv->tclass = choice->tclass;
	tlv->flags = (choice->probe ? MRC_F_PROBE : 0) | (choice->control ? MRC_F_CONTROL : 0);
	tlv->tx_ns = mrc_htonll(choice->tx_ns);
	tlv->ports_down = cfg->ports_down;	/* port status: lib/ports.h */
	feedback_fill(tlv, &path->peer_sid, choice->keep_news, choice->tx_ns);
	/* signed as it leaves us and arrives at the peer's SID */
	auth_sign(tlv, cfg->sid, path->peer_sid.addr, choice->st ? &choice->st->tx_mac : NULL);
}

/* This CPU's zeroed scratch room for headers being built (mrc_common.h),
 * or NULL. */
static __always_inline void *outer_scratch(void)
{
	__u32 zero = 0;
	struct mrc_tx_scratch *room = mrc_tx_scratch.lookup(&zero);

	if (room)
		__builtin_memset(room, 0, sizeof(*room));
	return room;
}

/* An IPv4 inner packet leaves as IPv6: the Ethernet type follows. */
static __always_inline int outer_set_ethertype(struct __sk_buff *skb, __u8 inner_proto)
{
	__be16 proto = bpf_htons(ETH_P_IPV6);

	if (inner_proto != IPPROTO_IPIP)
		return 0;
	return bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_proto), &proto, sizeof(proto), 0);
}

#endif
