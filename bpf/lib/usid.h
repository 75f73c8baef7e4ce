/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Compressed SRv6 (uSID): the path is the outer destination address
 * itself (block + one 16-bit ID per hop, see mrc_common.h), shifted by
 * each switch's End next-csid; no SRH.  The MRC TLV travels as an option
 * of a Destination Options header, which only the final destination
 * reads: that is us, at our SID, once the last ID is shifted into place
 * (mrc_rx.c checks it there).
 */
#ifndef MRC_LIB_USID_H
#define MRC_LIB_USID_H

#include "mrc_common.h"
#include "lib/outer.h"

struct doh_mrc {
	__u8		nexthdr;
	__u8		hdrlen;		/* 8-octet units, not counting the first 8 */
	struct mrc_tlv	mrc;		/* type MRC_OPT_TYPE */
	__u8		padn_type;	/* MRC_OPT_PADN */
	__u8		padn_len;
	__u8		padn[4];
} __attribute__((packed));

_Static_assert(sizeof(struct doh_mrc) == MRC_DOH_LEN, "MRC_DOH_LEN is the header we write");
_Static_assert(MRC_DOH_LEN % 8 == 0, "extension headers are 8-byte multiples");

struct usid_outer {
	struct ipv6hdr	ip6;
	struct doh_mrc	doh;
} __attribute__((packed));

#define USID_SCRATCH_OFF	6

/* Writes outer IPv6 (to the path's container) + Destination Options into
 * the room bpf_skb_adjust_room() made after the Ethernet header. */
static __always_inline int usid_write_encap(struct __sk_buff *skb, const struct mrc_config *cfg,
					    const struct mrc_path *path, __u8 inner_proto, __u8 tos,
					    const struct path_choice *choice)
{
	/* placed so that the TLV, 42 bytes in, is 8-byte aligned: clang then
	 * writes its fields whole (lib/auth.h reads them as words) */
	void *room = outer_scratch();
	struct usid_outer *hdr = room + USID_SCRATCH_OFF;

	_Static_assert((USID_SCRATCH_OFF + offsetof(struct usid_outer, doh.mrc)) % 8 == 0, "the TLV is aligned");
	_Static_assert(USID_SCRATCH_OFF + sizeof(*hdr) <= sizeof(struct mrc_tx_scratch),
		       "the headers fit the scratch room");
	if (!room)
		return -1;
	outer_ip6_init(&hdr->ip6, cfg, path->segments[0].addr, tos, path->flowlabel,
		       skb->len - ETH_HLEN - sizeof(struct ipv6hdr), IPPROTO_DSTOPTS);
	hdr->doh.nexthdr = inner_proto;
	hdr->doh.hdrlen = MRC_DOH_LEN / 8 - 1;
	outer_tlv_init(&hdr->doh.mrc, MRC_OPT_TYPE, cfg, path, choice);
	hdr->doh.padn_type = MRC_OPT_PADN;
	hdr->doh.padn_len = sizeof(hdr->doh.padn);
	if (bpf_skb_store_bytes(skb, ETH_HLEN, hdr, sizeof(*hdr), 0))
		return -1;
	return outer_set_ethertype(skb, inner_proto);
}

#endif
