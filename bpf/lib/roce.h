/* SPDX-License-Identifier: GPL-2.0 */
/*
 * RoCEv2 over MRC's paths (docs/design/roce.md).
 *
 * A reliably connected (RC) queue pair's responder drops every request
 * whose PSN is above the one it expects and answers with one NAK
 * (sequence error); the requester goes back N.  Sprayed per packet, each
 * reordering between paths costs a go-back-N.  So TX reads each RoCE
 * packet's BTH (destination QP, PSN) and, under the roce policy, keeps a
 * QP on one path: the QPs are spread over the peer's paths by turns, and
 * a QP moves only when nothing of it is in flight (the responder's ACK
 * acknowledged the last PSN sent) or, at once, when failover takes its
 * path out.  RX reads the AETH of the ACKs (the acknowledged PSN, NAKs)
 * and, as a responder, the PSN gaps of the requests per path.
 *
 * Kept apart from mrc_tx's path choice: TX is near the verifier's limit,
 * so the policy's only hook there is the list position it hands in.
 */
#ifndef MRC_LIB_ROCE_H
#define MRC_LIB_ROCE_H

#include "lib/maps.h"
#include "lib/counters.h"
#include "lib/compiler.h"
#include "lib/parse.h"

#define ROCE_OP_RC_MASK		0xe0	/* the transport bits: 0 is RC */
#define ROCE_OP_READ_RESP_FIRST	0x0d
#define ROCE_OP_READ_RESP_LAST	0x0f
#define ROCE_OP_READ_RESP_ONLY	0x10
#define ROCE_OP_ACK		0x11
#define ROCE_OP_ATOMIC_ACK	0x12
#define ROCE_AETH_NAK		3	/* syndrome's top 3 bits */
#define ROCE_NAK_PSN_SEQ	0	/* NAK code: PSN sequence error */

/* UDP header + BTH (InfiniBand Architecture vol. 1, 9.2) + AETH (9.3.5) */
struct roce_hdr {
	__be16	sport;
	__be16	dport;
	__be16	ulen;
	__sum16	ucheck;
	__u8	opcode;
	__u8	bth_flags;
	__be16	pkey;
	__be32	dqpn;		/* reserved byte, destination QP (24 bits) */
	__be32	psn;		/* AckReq bit, reserved, PSN (24 bits) */
	__u8	syndrome;	/* AETH: meaningful only after an ACK/response */
	__u8	msn[3];
};

/* RC requests: send, write, read request (0x00-0x0c), atomics (0x13-0x14) */
static __always_inline int roce_is_request(__u8 op)
{
	return op <= 0x0c || op == 0x13 || op == 0x14;
}

static __always_inline int roce_has_aeth(__u8 op)
{
	return op == ROCE_OP_ACK || op == ROCE_OP_ATOMIC_ACK || op == ROCE_OP_READ_RESP_FIRST ||
	       op == ROCE_OP_READ_RESP_LAST || op == ROCE_OP_READ_RESP_ONLY;
}

/* PSNs are 24 bits: a - b as a signed distance */
static __always_inline __s32 roce_psn_diff(__u32 a, __u32 b)
{
	return (__s32)((a - b) << 8) >> 8;
}

/*
 * An RC RoCEv2 packet behind the IP header at l3 (family ETH_P_IPV6 or
 * ETH_P_IP, its fixed part already checked): 1 and *pkt filled, else 0.
 * IPv6 extension headers and IPv4 fragments are not read (not RoCE here).
 */
static __always_inline int roce_parse(void *l3, void *data_end, __u16 family, struct mrc_roce_pkt *pkt)
{
	struct roce_hdr *h;

	if (family == ETH_P_IPV6) {
		struct ipv6hdr *ip6 = l3;

		if (ip6->nexthdr != IPPROTO_UDP)
			return 0;
		h = (void *)(ip6 + 1);
	} else {
		struct iphdr *ip4 = l3;
		__u32 ihl = (ip4->ihl * 4) & 0x3c;

		if (ip4->protocol != IPPROTO_UDP || ihl < sizeof(*ip4) ||
		    (ip4->frag_off & bpf_htons(0x3fff)))
			return 0;
		h = l3 + ihl;
	}
	/* the AETH's 4 bytes too: a BTH-only request is at least its
	 * ICRC (4) longer, so the check costs no RoCE packet */
	if ((void *)(h + 1) > data_end || h->dport != bpf_htons(MRC_ROCE_PORT) ||
	    (h->opcode & ROCE_OP_RC_MASK))
		return 0;
	pkt->opcode = h->opcode;
	pkt->sport = bpf_ntohs(h->sport);
	pkt->dqpn = bpf_ntohl(h->dqpn) & MRC_ROCE_PSN_MASK;
	pkt->psn = bpf_ntohl(h->psn) & MRC_ROCE_PSN_MASK;
	pkt->syndrome = h->syndrome;
	return 1;
}

static __always_inline struct mrc_roce_qp *roce_qp(__u32 peer_id, __u16 sport, int create)
{
	struct mrc_roce_key key = { .peer_id = peer_id, .sport = sport };
	struct mrc_roce_qp *qp = mrc_roce_qps.lookup(&key);

	__u32 zero = 0;
	struct mrc_roce_qp *fresh;

	if (qp || !create)
		return qp;
	/* zeros from a map: the stack has no room for them in mrc_tx */
	fresh = mrc_roce_zero.lookup(&zero);
	if (!fresh)
		return NULL;
	mrc_roce_qps.insert(&key, fresh);	/* a racing CPU's is as good */
	return mrc_roce_qps.lookup(&key);
}

static __always_inline struct mrc_roce_path *roce_path(__u32 peer_id, __u16 path_id, __u16 side)
{
	struct mrc_roce_path_key key = { .peer_id = peer_id, .path_id = path_id, .side = side };
	struct mrc_roce_path *p = mrc_roce_paths.lookup(&key);

	__u32 zero = 0;
	void *fresh;

	if (p)
		return p;
	fresh = mrc_roce_zero.lookup(&zero);	/* larger than a path's row: zeros enough */
	if (!fresh)
		return NULL;
	mrc_roce_paths.insert(&key, (struct mrc_roce_path *)fresh);
	return mrc_roce_paths.lookup(&key);
}

/* ---- TX ------------------------------------------------------------- */

/*
 * Before the path choice: a RoCE packet's BTH kept in `pkt` for
 * roce_tx_sent, its QP made, and under the roce policy the spray-list
 * position it is to take (pkt->seq_mul 0, pkt->pos): its own while
 * anything of it is in flight, its turn's (turn mod the list's length)
 * when nothing is or it has none yet.  The caller reset pkt for any
 * packet (round robin, not RoCE).
 */
static __always_inline void roce_tx_classify(struct __sk_buff *skb, const struct mrc_peer *peer,
					     __u8 tclass, struct mrc_roce_pkt *pkt)
{
	void *data_end = (void *)(long)skb->data_end;
	struct mrc_roce_qp *qp;
	struct mrc_spray *list;
	__u32 list_index, n, home, at, slot;
	__u64 *turns;
	__u16 family;
	void *l3;

	l3 = parse_ip(skb, &family);
	if (!l3 || !roce_parse(l3, data_end, family, pkt))
		return;
	qp = roce_qp(peer->peer_id, pkt->sport, 1);
	if (!qp)
		return;
	pkt->valid = 1;
	if (peer->policy != MRC_POLICY_ROCE || peer->template_id >= MRC_MAX_PEERS ||
	    tclass >= MRC_MAX_CLASSES)
		return;
	list_index = peer->template_id * MRC_MAX_CLASSES + tclass;
	list = mrc_spray.lookup(&list_index);
	if (!list)
		return;
	n = list->n;
	if (n == 0 || n > MRC_SPRAY_SLOTS)
		return;
	if (!(qp->flags & MRC_ROCE_F_PLACED)) {
		/* the next turn of the peer's QPs: QPs spread evenly */
		slot = peer->peer_id & (MRC_ROCE_TURNS - 1);
		turns = mrc_roce_turns.lookup(&slot);
		qp->turn = turns ? __sync_fetch_and_add(turns, 1) : 0;
		qp->pos = qp->turn % n;
		qp->flags |= MRC_ROCE_F_PLACED;
	}
	home = qp->turn % n;
	at = qp->pos < n ? qp->pos : home;
	/* nothing in flight: the responder acknowledged the last PSN sent
	 * (or it sent none): back to its turn's path, no reordering */
	if (at != home && (!(qp->flags & MRC_ROCE_F_SENT) ||
			   ((qp->flags & MRC_ROCE_F_ACKED) && qp->acked_psn == qp->last_psn)))
		at = home;
	pkt->seq_mul = 0;
	pkt->pos = at;
}

/*
 * After the packet was encapsulated on path_id (at list position pos):
 * the QP's path and PSN,
 * retransmissions and moves counted.
 */
static __always_inline void roce_tx_sent(struct mrc_roce_pkt *pkt, __u32 peer_id, __u16 path_id,
					 __u16 pos)
{
	struct mrc_roce_qp *qp;
	struct mrc_roce_path *p;
	int retrans = 0;

	if (!pkt->valid)
		return;
	qp = roce_qp(peer_id, pkt->sport, 0);
	if (!qp)
		return;
	count(MRC_TX_ROCE);
	if (roce_is_request(pkt->opcode)) {
		if ((qp->flags & MRC_ROCE_F_SENT) && roce_psn_diff(pkt->psn, qp->last_psn) <= 0) {
			retrans = 1;
			count(MRC_TX_ROCE_RETRANS);
			__sync_fetch_and_add(&qp->tx_retrans, 1);
		} else {
			qp->last_psn = pkt->psn;
			qp->flags |= MRC_ROCE_F_SENT;
		}
	}
	if (!pkt->seq_mul) {
		if (qp->tx_packets && qp->path_id != path_id) {
			count(MRC_TX_ROCE_MOVE);
			qp->moves++;
		}
		qp->pos = pos;
	}
	qp->path_id = path_id;
	qp->dqpn = pkt->dqpn;
	__sync_fetch_and_add(&qp->tx_packets, 1);
	p = roce_path(peer_id, path_id, 0);
	if (!p)
		return;
	__sync_fetch_and_add(&p->tx_packets, 1);
	if (retrans)
		__sync_fetch_and_add(&p->tx_retrans, 1);
}

/* ---- RX ------------------------------------------------------------- */

/*
 * A decapsulated packet from `src_sid` (its inner IP header at l3) on
 * the sender's path `path_id`: an ACK or NAK for a QP we send on, or a
 * request of a QP we answer.  Only a configured peer's (we keep no state
 * for strangers).
 */
static __always_inline void roce_rx(const __u8 *src_sid, void *l3, void *data_end, __u16 family,
				    __u16 path_id)
{
	struct mrc_roce_pkt pkt = {};
	struct mrc_roce_qp *qp;
	struct mrc_roce_path *p;
	struct mrc_sid sid;
	__u32 *peer_id, acked;
	__s32 d;

	if (family == ETH_P_IPV6) {
		if (l3 + sizeof(struct ipv6hdr) > data_end)
			return;
	} else if (l3 + sizeof(struct iphdr) > data_end) {
		return;
	}
	if (!roce_parse(l3, data_end, family, &pkt))
		return;
	count(MRC_RX_ROCE);
	__builtin_memcpy(sid.addr, src_sid, 16);
	peer_id = mrc_peer_by_sid.lookup(&sid);
	if (!peer_id)
		return;
	if (roce_has_aeth(pkt.opcode)) {
		/* about a QP we are the requester of: its TX state */
		qp = roce_qp(*peer_id, pkt.sport, 0);
		if (!qp)
			return;
		__sync_fetch_and_add(&qp->acks, 1);
		acked = pkt.psn;
		if ((pkt.syndrome >> 5) == ROCE_AETH_NAK) {
			if ((pkt.syndrome & 0x1f) != ROCE_NAK_PSN_SEQ)
				return;
			/* the PSN it expects: all before it arrived */
			acked = (pkt.psn - 1) & MRC_ROCE_PSN_MASK;
			count(MRC_RX_ROCE_NAK_SEQ);
			__sync_fetch_and_add(&qp->naks_seq, 1);
			p = roce_path(*peer_id, qp->path_id, 0);
			if (p)
				__sync_fetch_and_add(&p->naks_seq, 1);
		} else if (pkt.syndrome >> 5) {
			return;		/* RNR NAK: acknowledges nothing new */
		}
		if (!(qp->flags & MRC_ROCE_F_ACKED) || roce_psn_diff(acked, qp->acked_psn) > 0) {
			qp->acked_psn = acked;
			qp->flags |= MRC_ROCE_F_ACKED;
		}
		return;
	}
	if (!roce_is_request(pkt.opcode))
		return;
	/* a request to us: the PSN we expect next, as the responder does */
	qp = roce_qp(*peer_id, pkt.sport, 1);
	p = roce_path(*peer_id, path_id, 1);
	if (!qp)
		return;
	qp->dqpn = pkt.dqpn;
	__sync_fetch_and_add(&qp->rx_packets, 1);
	if (p)
		__sync_fetch_and_add(&p->rx_packets, 1);
	d = (qp->flags & MRC_ROCE_F_RX) ? roce_psn_diff(pkt.psn, qp->rx_next_psn) : 0;
	if (d == 0) {
		qp->rx_next_psn = (pkt.psn + 1) & MRC_ROCE_PSN_MASK;
		qp->flags |= MRC_ROCE_F_RX;
	} else if (d > 0) {
		count(MRC_RX_ROCE_AHEAD);
		__sync_fetch_and_add(&qp->rx_ahead, 1);
		if (p)
			__sync_fetch_and_add(&p->rx_ahead, 1);
	} else {
		__sync_fetch_and_add(&qp->rx_behind, 1);
		if (p)
			__sync_fetch_and_add(&p->rx_behind, 1);
	}
}

#endif
