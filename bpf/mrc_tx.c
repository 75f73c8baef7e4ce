/* SPDX-License-Identifier: GPL-2.0 */
/*
 * TX, at TC egress: a packet for a configured peer prefix leaves wrapped
 * in outer IPv6 that carries the chosen path and the MRC TLV: as an SRH
 * (RFC 8754) with the path's segment list, or for a uSID path as a
 * compressed destination with a Destination Options header.  Everything
 * else leaves untouched.
 *
 * The journey: classify -> find the peer -> choose a path for the
 * packet's traffic class -> check it fits -> make room -> write outer
 * IPv6 and the path's header with the TLV (with feedback for the peer)
 * -> send it towards the path's first hop, on the path's own device.
 */
#include "lib/counters.h"
#include "lib/addr.h"
#include "lib/parse.h"
#include "lib/srh.h"
#include "lib/usid.h"
#include "lib/path_select.h"
#include "lib/nexthop.h"
#include "lib/control.h"
#include "lib/tcp_steer.h"
#include "lib/template.h"
#include "lib/peer_cache.h"
#include "lib/roce.h"

static __always_inline int tx_pass(void)
{
	count(MRC_TX_PASS);
	return TC_ACT_OK;
}

static __always_inline int tx_drop(__u32 reason)
{
	count(reason);
	return TC_ACT_SHOT;
}

/* What the classifier learnt of the inner packet. */
struct tx_inner {
	__u8	proto;		/* IPPROTO_IPV6 or IPPROTO_IPIP: the SRH's next header */
	__u8	tos;		/* copied to the outer header's traffic class */
};

/*
 * Fills the peer lookup key from the destination; returns 0 when the
 * packet may be a peer's, -1 when it must pass untouched.
 */
static __always_inline int tx_classify(struct __sk_buff *skb, const struct mrc_config *cfg,
				       struct mrc_peer_key *key, struct tx_inner *inner)
{
	__u16 family;
	void *l3 = parse_ip(skb, &family);

	if (!l3)
		return -1;
	if (family == ETH_P_IPV6) {
		struct ipv6hdr *ip6 = l3;

		/* ND, link-local and multicast stay on the link; a packet
		 * sourced from our SID is one we already encapsulated and
		 * redirected back through this hook. */
		if (addr_is_link_scoped(ip6->daddr.s6_addr) ||
		    addr_equal(ip6->saddr.s6_addr, cfg->sid))
			return -1;
		__builtin_memcpy(key->addr, ip6->daddr.s6_addr, 16);
		inner->proto = IPPROTO_IPV6;
		inner->tos = (ip6->priority << 4) | (ip6->flow_lbl[0] >> 4);
		return 0;
	}
	struct iphdr *ip4 = l3;

	/* IPv4-mapped: ::ffff:a.b.c.d */
	key->addr[10] = 0xff;
	key->addr[11] = 0xff;
	__builtin_memcpy(&key->addr[12], &ip4->daddr, 4);
	inner->proto = IPPROTO_IPIP;
	inner->tos = ip4->tos;
	return 0;
}

/* The traffic class of a packet, from its DSCP. */
static __always_inline __u8 tx_class(__u8 tos)
{
	__u32 dscp = tos >> 2;
	__u32 *tclass = mrc_dscp_class.lookup(&dscp);

	return tclass && *tclass < MRC_MAX_CLASSES ? *tclass : 0;
}

int mrc_tx(struct __sk_buff *skb)
{
	struct mrc_peer_key key = { .prefixlen = 128 };
	struct tx_inner inner = {};
	struct mrc_config *cfg;
	struct mrc_peer *peer;
	struct mrc_path *path;
	struct path_choice choice;
	struct mrc_roce_pkt *roce;
	__u32 zero = 0, nseg, encap_len, mark = skb->mark, copy_mark, l4 = 0, l4_len = 0, flow_key = 0;
	__u8 control = 0, usid, retrans = 0, tclass;

	count(MRC_TX_SEEN);

	cfg = mrc_config.lookup(&zero);
	if (!cfg)
		return tx_pass();
	if (mark == MRC_FB_MARK ||
	    (mark & MRC_PROBE_MARK_MASK) == MRC_PROBE_COPY_MARK) {
		/* a clone mrc_fb made of a received packet: becomes feedback;
		 * or one made below of a data packet: becomes a probe copy */
		if (control_from_clone(skb, mark == MRC_FB_MARK))
			return tx_drop(MRC_TX_DROP_ENCAP_FAIL);
		control = 1;
	}
	if (tx_classify(skb, cfg, &key, &inner))
		return tx_pass();

	peer = peer_lookup(&key);
	if (!peer)
		return tx_pass();
	if (!control && !(mark & MRC_PROBE_MARK_MASK) && cfg->retrans_steer &&
	    tcp_steer_locate(skb, &l4, &l4_len, &flow_key))
		retrans = tcp_steer_is_retrans(skb, l4, l4_len, flow_key);
	tclass = tx_class(inner.tos);
	roce = mrc_roce_pkt.lookup(&zero);
	if (!roce)
		return tx_pass();
	roce->valid = 0;
	roce->seq_mul = 1;
	roce->pos = 0;
	if (!control && !(mark & MRC_PROBE_MARK_MASK))
		roce_tx_classify(skb, peer, tclass, roce);

	if ((mark & MRC_PROBE_MARK_MASK) == MRC_PROBE_MARK ?
	    path_select_pinned(peer, mark, cfg, MRC_TX_PINNED_PROBE, &choice) :
	    (mark & MRC_PROBE_MARK_MASK) == MRC_PROBE_COPY_MARK ?
	    path_select_pinned(peer, mark, cfg, MRC_TX_PROBE_COPY, &choice) :
	    path_select(skb, peer, tclass, cfg, !control, roce, &choice))
		return tx_drop(MRC_TX_DROP_NO_PATH);
	if (choice.probe_copy) {
		/* the copy comes back through this hook (marked), is cut to
		 * its headers and leaves on the path it tests */
		copy_mark = MRC_PROBE_COPY_MARK | ((choice.probe_copy - 1) & ~MRC_PROBE_MARK_MASK);
		skb->mark = copy_mark;
		bpf_clone_redirect(skb, skb->ifindex, 0);
		skb->mark = mark;
	}
	if (retrans)
		tcp_steer_pick(peer, cfg, &choice);
	choice.control = control;
	path = mrc_paths.lookup(&choice.path_index);
	if (!path || path->state != MRC_PATH_UP)
		return tx_drop(MRC_TX_DROP_NO_PATH);
	path = template_path(peer, path);
	if (!path)
		return tx_drop(MRC_TX_DROP_NO_PATH);
	nseg = path->n_segments;
	if (nseg == 0 || nseg > MRC_MAX_SEGMENTS)
		return tx_drop(MRC_TX_DROP_NO_PATH);
	usid = path->flags & MRC_PATH_F_USID;

	/* The route MTU that `path add` installs already leaves room for
	 * what we add, so a single packet fits and a GSO packet's segment
	 * size stays as TCP chose it (FIXED_GSO: without it the kernel would
	 * shrink the segments by our overhead a second time). */
	encap_len = usid ? MRC_USID_ENCAP_LEN : MRC_ENCAP_LEN(nseg);
	if (skb->gso_size == 0 && skb->len - ETH_HLEN + encap_len > cfg->mtu)
		return tx_drop(MRC_TX_DROP_TOO_BIG);

	/* A control packet is a clone of a received one, whose
	 * skb->encapsulation may still be set: the ENCAP flags (needed only
	 * for GSO) would be refused for it, and it is never GSO. */
	if (bpf_skb_adjust_room(skb, encap_len, BPF_ADJ_ROOM_MAC,
				control ? 0 : BPF_F_ADJ_ROOM_ENCAP_L3_IPV6 | BPF_F_ADJ_ROOM_FIXED_GSO))
		return tx_drop(MRC_TX_DROP_ENCAP_FAIL);

	/* Taken only now, so a packet that was never sent leaves no gap
	 * in the path's sequence (a gap is how the receiver sees loss).  Its
	 * send time is path_select's clock read (choice.tx_ns). */
	if (!choice.st)
		return tx_drop(MRC_TX_DROP_NO_PATH);
	choice.path_seq = peer_path_seq_take(choice.st, choice.path_id);

	if (usid ? usid_write_encap(skb, cfg, path, inner.proto, inner.tos, &choice)
		 : srh_write_encap(skb, cfg, path, nseg, inner.proto, inner.tos, &choice))
		return tx_drop(MRC_TX_DROP_ENCAP_FAIL);

	/* before failover_path_sent(), which overwrites the last send */
	shared_fate_sent(cfg, choice.path_index, choice.st, choice.rs, peer->peer_id, choice.path_id, choice.probe,
			 choice.live->last_sent_ns, choice.tx_ns);
	failover_path_sent(choice.live, peer_path_clock(choice.st, choice.path_id), choice.st, choice.tx_ns);
	if (cfg->retrans_steer && !control)
		tcp_steer_heard(choice.st, choice.path_id);
	if (control)
		count(MRC_TX_CONTROL);
	else
		roce_tx_sent(roce, peer->peer_id, choice.path_id, choice.pos);
	/* shared by CPUs, next to the sequence number just taken */
	__sync_fetch_and_add(&row_path(choice.rs, choice.path_id)->tx_packets, 1);
	__sync_fetch_and_add(&row_path(choice.rs, choice.path_id)->tx_bytes, skb->len);
	count(MRC_TX_ENCAP);
	count_add(MRC_TX_ENCAP_BYTES, skb->len);

	return nexthop_send(path, control);
}
