/* SPDX-License-Identifier: GPL-2.0 */
/*
 * RX, at XDP: a packet whose active segment is our SID is checked as a
 * whole (RFC 8754 section 4.3, and stricter than the kernel's End.DT6,
 * which takes an invalid SRH for no SRH and decapsulates anyway), then
 * stripped of its outer IPv6 + SRH, or + Destination Options for a uSID
 * path, and passed up as the inner packet, a fabric queue's ECN mark
 * carried onto it (lib/ecn.h).  What fails a check is dropped and
 * counted by reason.  Packets for anyone else pass untouched, and what
 * passes goes on to the device's earlier XDP program if attach found one
 * there (lib/xdp_chain.h).
 *
 * Every packet is counted in MRC_RX_SEEN and in exactly one outcome.
 *
 * The rules, in the order they are checked (the first that fails is the
 * drop reason; docs/design/rx-validation.md gives each one's RFC):
 *   ours?  Ethernet type IPv6, whole fixed header, destination == our
 *          SID, next header Routing or Destination Options; else PASS
 *   1 outer_header    version 6, source not multicast (RFC 8200, 4291)
 *   2 payload_len     40 + payload length == the frame's L3 bytes
 *   SRH:  3 truncated, 4 routing_type (4), 5 srh_len (fits the packet,
 *         holds last_entry + 1 segments), 6 segments_left (0, and not
 *         above last_entry), 7 active_segment (destination == list[0]),
 *         8 tlv (each TLV inside the SRH, at most MRC_MAX_TLVS),
 *         9 mrc_tlv (length, version)
 *   DOH:  3 truncated, 10 option (hdr_ext_len, then exactly MRC option
 *         + PadN), 9 mrc_tlv
 *   11 inner_proto    next header IPv6 or IPv4
 *   12 inner_header   version, lengths agree with what is left
 *   then: MRC_F_CONTROL -> consumed (rx_control); 13 ecn (RFC 6040)
 * A packet failing 12 alone, marked trimmed by a fabric switch, is a
 * trim (lib/trim.h): filed, counted (rx_trimmed), answered at once.
 */
#include "lib/counters.h"
#include "lib/addr.h"
#include "lib/srh.h"
#include "lib/usid.h"
#include "lib/rx_track.h"
#include "lib/feedback.h"
#include "lib/ecn.h"
#include "lib/auth.h"
#include "lib/trim.h"
#include "lib/xdp_chain.h"
#include "lib/roce.h"

static __always_inline int rx_pass(void)
{
	count(MRC_RX_PASS);
	return XDP_PASS;
}

/* Not ours: on to the device's earlier XDP program, if any (lib/xdp_chain.h) */
static __always_inline int rx_pass_on(struct xdp_md *ctx, struct mrc_config *cfg)
{
	count(MRC_RX_PASS);
	return xdp_pass_on(ctx, cfg);
}

static __always_inline int rx_drop(__u32 reason)
{
	count(reason);
	return XDP_DROP;
}

/* Checks the inner header against what is left of the frame; returns
 * the inner ethertype, or 0 and the drop reason in *reason. */
static __always_inline __u16 rx_check_inner(__u8 nexthdr, void *inner, void *data_end,
					    __u32 inner_len, __u32 *reason)
{
	if (nexthdr == IPPROTO_IPV6) {
		struct ipv6hdr *ip6 = inner;

		if ((void *)(ip6 + 1) > data_end || ip6->version != 6 ||
		    bpf_ntohs(ip6->payload_len) + sizeof(*ip6) != inner_len)
			goto bad;
		return ETH_P_IPV6;
	}
	if (nexthdr == IPPROTO_IPIP) {
		struct iphdr *ip4 = inner;

		if ((void *)(ip4 + 1) > data_end || ip4->version != 4 || ip4->ihl < 5 ||
		    bpf_ntohs(ip4->tot_len) != inner_len || ip4->ihl * 4 > inner_len)
			goto bad;
		return ETH_P_IP;
	}
	*reason = MRC_RX_DROP_INNER_PROTO;
	return 0;
bad:
	*reason = MRC_RX_DROP_INNER_HEADER;
	return 0;
}

/* What the check of the header after the outer IPv6 one found. */
struct rx_ext {
	__u32	len;		/* of the extension header */
	__u8	nexthdr;	/* the inner packet's protocol */
};

/*
 * Checks the SRH after the outer IPv6 header (`l3_len`: the outer
 * packet's length).  Returns 0 or the drop reason; on success the MRC
 * TLV, or NULL when there is none (the kernel's own encapsulation).
 */
static __always_inline int rx_check_srh(struct ipv6hdr *ip6, void *data_end, __u32 l3_len,
					struct rx_ext *ext, struct mrc_tlv **mrc)
{
	struct srh_fixed *srh = (void *)(ip6 + 1);
	__u8 *segment0;

	if ((void *)(srh + 1) > data_end)
		return MRC_RX_DROP_TRUNCATED;
	if (srh->type != SRH_ROUTING_TYPE)
		return MRC_RX_DROP_ROUTING_TYPE;
	ext->len = (srh->hdrlen + 1) * 8;
	ext->nexthdr = srh->nexthdr;
	if (sizeof(*ip6) + ext->len > l3_len ||
	    sizeof(*srh) + (srh->last_entry + 1) * 16 > ext->len)
		return MRC_RX_DROP_SRH_LEN;
	if (srh->segments_left > srh->last_entry || srh->segments_left != 0)
		return MRC_RX_DROP_SEGMENTS_LEFT;

	/* Segments left is 0: the active segment is list[0] and the
	 * destination address must be it. */
	segment0 = (void *)(srh + 1);
	if ((void *)(segment0 + 16) > data_end)
		return MRC_RX_DROP_TRUNCATED;
	if (!addr_equal(segment0, ip6->daddr.s6_addr))
		return MRC_RX_DROP_ACTIVE_SEGMENT;

	return tlv_find_mrc(srh, data_end, sizeof(*srh) + (srh->last_entry + 1) * 16,
			    ext->len, MRC_TLV_TYPE, MRC_RX_DROP_TLV, mrc);
}

/*
 * The Destination Options header of a uSID path (lib/usid.h).  Only MRC
 * peers send to our SID with one, and nothing en route may change it
 * (RFC 8200 section 4.6), so it must be exactly what usid_write_encap()
 * writes: the MRC option, then PadN.  Anything else is dropped; that
 * also keeps this check free of loops.
 */
static __always_inline int rx_check_doh(struct ipv6hdr *ip6, void *data_end, __u32 l3_len,
					struct rx_ext *ext, struct mrc_tlv **mrc)
{
	struct doh_mrc *doh = (void *)(ip6 + 1);

	/* the length first: a shorter header (valid, just not ours) before
	 * a short inner packet is the wrong option layout, not truncated */
	if ((void *)&doh->mrc > data_end)
		return MRC_RX_DROP_TRUNCATED;
	if (doh->hdrlen != MRC_DOH_LEN / 8 - 1)
		return MRC_RX_DROP_OPTION;
	if ((void *)(doh + 1) > data_end)
		return MRC_RX_DROP_TRUNCATED;
	if (doh->padn_type != MRC_OPT_PADN ||
	    doh->padn_len != sizeof(doh->padn) || doh->mrc.type != MRC_OPT_TYPE ||
	    doh->mrc.len != MRC_TLV_LEN)
		return MRC_RX_DROP_OPTION;
	if (doh->mrc.version != MRC_VERSION)
		return MRC_RX_DROP_MRC_TLV;
	ext->len = MRC_DOH_LEN;
	ext->nexthdr = doh->nexthdr;
	*mrc = &doh->mrc;
	return 0;
}

/*
 * Rules 1-12 for a packet whose destination is our SID and whose next
 * header is Routing or Destination Options, from its outer header on.
 * Returns 0 (valid: the outer and inner lengths, the inner ethertype and
 * the MRC TLV or NULL are filled) or the drop reason.  Shared by mrc_rx
 * and by mrc_fb (TC ingress), which checks the control packets that XDP
 * never saw (rx_tc_control).
 */
static __always_inline __u32 rx_check(struct ipv6hdr *ip6, void *data_end, struct rx_ext *ext,
				      struct mrc_tlv **mrc, __u32 *outer_len, __u32 *inner_len,
				      __u16 *inner_proto)
{
	__u32 l3_len, reason = 0;
	int rc;

	if (ip6->version != 6 || ip6->saddr.s6_addr[0] == 0xff)
		return MRC_RX_DROP_OUTER_HEADER;
	l3_len = data_end - (void *)ip6;
	if (bpf_ntohs(ip6->payload_len) + sizeof(*ip6) != l3_len)
		return MRC_RX_DROP_PAYLOAD_LEN;
	if (ip6->nexthdr == IPPROTO_ROUTING)
		rc = rx_check_srh(ip6, data_end, l3_len, ext, mrc);
	else
		rc = rx_check_doh(ip6, data_end, l3_len, ext, mrc);
	if (rc)
		return rc;

	*outer_len = sizeof(*ip6) + ext->len;
	*inner_len = l3_len - *outer_len;
	*inner_proto = rx_check_inner(ext->nexthdr, (void *)ip6 + (*outer_len & 0xfff),
				      data_end, *inner_len, &reason);
	return *inner_proto ? 0 : reason;
}

/*
 * A valid packet's MRC TLV: measured and its feedback filed, when it is
 * authentic and fresh (with a key, lib/auth.h).  Returns 0 when filed,
 * else the counter saying why not (already counted).  *SENDER: the
 * sender's receive state, when there is one (for feedback_due).
 */
static __always_inline __u32 rx_file(const struct ipv6hdr *ip6, const struct mrc_tlv *mrc,
				     __u32 inner_len, __u64 now, struct mrc_rx_peer **sender)
{
	__u32 unfiled;
	int keyed;

	*sender = NULL;
	count(MRC_RX_MRC_TLV);
	unfiled = auth_verify(ip6, mrc, &keyed);
	if (!unfiled)
		unfiled = rx_track(ip6->saddr.s6_addr, mrc, inner_len, now, keyed,
				   ecn_of_ip6(ip6) == ECN_CE, sender);
	if (unfiled)
		count(unfiled);
	else
		feedback_file(ip6->saddr.s6_addr, mrc, now);
	return unfiled;
}

/* A packet a fabric switch trimmed (lib/trim.h): filed, its trim noted
 * for the sender, and handed to mrc_fb to be answered at once. */
static __always_inline int rx_trimmed(struct xdp_md *ctx, const struct ipv6hdr *ip6,
				      const struct mrc_tlv *mrc, const struct rx_ext *ext, __u32 outer_len)
{
	struct mrc_rx_peer *sender;
	int filed = !rx_file(ip6, mrc, 0, bpf_ktime_get_ns(), &sender);

	if (filed)
		trim_note(ip6->saddr.s6_addr, mrc);
	return trim_hand_on(ctx, outer_len, ext->nexthdr, filed);
}

int mrc_rx(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data, eth_copy;
	struct ipv6hdr *ip6;
	struct mrc_tlv *mrc = NULL;
	struct mrc_config *cfg;
	struct rx_ext ext = {};
	__u32 zero = 0, outer_len = 0, inner_len = 0, reason;
	__u16 inner_proto = 0;

	count(MRC_RX_SEEN);

	cfg = mrc_config.lookup(&zero);
	if (!cfg)
		return rx_pass();
	if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IPV6))
		return rx_pass_on(ctx, cfg);
	ip6 = (void *)(eth + 1);
	if ((void *)(ip6 + 1) > data_end)
		return rx_pass_on(ctx, cfg);
	/* An SRH path, or a uSID path whose last ID made the destination
	 * our SID; anything else to our SID is the kernel's business. */
	if (!addr_equal(ip6->daddr.s6_addr, cfg->sid) ||
	    (ip6->nexthdr != IPPROTO_ROUTING && ip6->nexthdr != IPPROTO_DSTOPTS))
		return rx_pass_on(ctx, cfg);

	/* From here on the packet claims to be ours: whatever is wrong
	 * with it is dropped, never decapsulated. */
	reason = rx_check(ip6, data_end, &ext, &mrc, &outer_len, &inner_len, &inner_proto);
	if (reason && trim_marked(ip6, data_end, reason, mrc, ext.nexthdr, outer_len, inner_len))
		return rx_trimmed(ctx, ip6, mrc, &ext, outer_len);
	if (reason)
		return rx_drop(reason);
	if (mrc) {
		__u64 now = bpf_ktime_get_ns();
		struct mrc_rx_peer *sender;
		__u32 unfiled = rx_file(ip6, mrc, inner_len, now, &sender);

		if (mrc->flags & MRC_F_CONTROL) {
			count(MRC_RX_CONTROL);	/* it carried feedback only */
			return XDP_DROP;
		}
		if (!unfiled)
			feedback_due(ip6->saddr.s6_addr, sender, cfg, now);
		/* RoCEv2 inside: ACKs, NAKs, PSN gaps (lib/roce.h); a later
		 * segment of a burst is an inner packet of its own */
		if (!unfiled || unfiled == MRC_RX_SEGMENT)
			roce_rx(ip6->saddr.s6_addr, (void *)ip6 + (outer_len & 0xfff), data_end,
				inner_proto, bpf_ntohs(mrc->path_id));
	}
	reason = ecn_decap(ip6, inner_proto, (void *)ip6 + (outer_len & 0xfff), data_end);
	if (reason)
		return rx_drop(reason);

	/* Strip the outer headers; the Ethernet header moves up to the inner. */
	__builtin_memcpy(&eth_copy, eth, sizeof(eth_copy));
	if (bpf_xdp_adjust_head(ctx, outer_len))
		return rx_drop(MRC_RX_DROP_DECAP_FAIL);
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	eth = data;
	if ((void *)(eth + 1) > data_end)
		return rx_drop(MRC_RX_DROP_DECAP_FAIL);
	__builtin_memcpy(eth->h_dest, eth_copy.h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_source, eth_copy.h_source, ETH_ALEN);
	eth->h_proto = bpf_htons(inner_proto);

	count(MRC_RX_DECAP);
	count_add(MRC_RX_DECAP_BYTES, inner_len);
	return xdp_pass_on(ctx, cfg);
}
