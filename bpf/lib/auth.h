/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Authenticated TLVs (docs/design/threat-model.md).  Feedback moves path
 * state: acknowledgements keep paths up or take them down, reported delay
 * and loss steer the adaptive policy.  Without a key anyone who can put a
 * packet on the fabric with a peer's SID as its source can forge it.
 * With one, the sender appends to every TLV a SipHash-2-4 MAC over
 *   final outer destination (16) | outer source (16)
 *   | TLV bytes 48..55 (epoch, key id, reserved)
 *   | TLV bytes 8..23 (sequence numbers, tx_ns)
 *   | TLV bytes 24..47 (the fb_* fields), only if flags has MRC_F_FEEDBACK
 *   | TLV bytes 3..7 (flags, path id, traffic class, fb_block)
 * (the final destination is the peer's SID, which is what the receiver
 * sees once the last segment is reached), and the receiver files a TLV
 * only when the MAC verifies under one of its two keys and the packet is
 * fresh (lib/rx_track.h: a newer epoch, a path_seq not seen before).
 *
 * The order is for speed.  The constant words come first, so that
 * neither side hashes them per packet: both keep SipHash's state after
 * the first five (both SIDs and the epoch word), the sender per path, the
 * receiver per sender (once its MAC verified).  The last 5 bytes
 * share SipHash's final block with the length (type, length and version,
 * bytes 0..2, are left out: the receiver takes only the exact values).
 * The feedback words are left out when there is no feedback: the
 * receiver reads them only when the (covered) flags say so, and the
 * message length differs.  Per packet: 2 words (5 with feedback) and the
 * finalization.
 */
#ifndef MRC_LIB_AUTH_H
#define MRC_LIB_AUTH_H

#include "lib/maps.h"
#include "lib/siphash.h"

_Static_assert(MRC_TLV_MAC_OFF == MRC_TLV_EPOCH_OFF + 8, "the epoch word is the last before the MAC");
_Static_assert(MRC_TLV_FB_OFF == 3 * 8 && MRC_TLV_EPOCH_OFF == 6 * 8, "the MAC takes the TLV by words");
_Static_assert(MRC_AUTH_KEYS == 2, "auth_verify looks in two slots");

/* bytes the MAC covers: the two SIDs, the epoch word, TLV bytes 3..23,
 * with feedback the fb_* words too */
#define AUTH_MAC_LEN		(16 + 16 + 8 + MRC_TLV_FB_OFF - 3)
#define AUTH_MAC_LEN_FB		(AUTH_MAC_LEN + MRC_TLV_EPOCH_OFF - MRC_TLV_FB_OFF)

static __always_inline __u64 auth_prefix_check(__u64 k0, __u64 k1, __u64 w0, __u64 w1, __u64 w2,
					       const struct siphash_state *s)
{
	return k0 ^ k1 ^ w0 ^ w1 ^ w2 ^ s->v0 ^ s->v1 ^ s->v2 ^ s->v3;
}

/* The state kept in `c` when it was made with this key after these
 * words: 0 and *s; else -1. */
static __always_inline int auth_prefix_get(const struct mrc_mac_prefix *c, const struct mrc_auth_key *key,
					   __u64 w0, __u64 w1, __u64 w2, struct siphash_state *s)
{
	__u64 k0 = c->k0, k1 = c->k1, c0 = c->words[0], c1 = c->words[1], c2 = c->words[2];

	s->v0 = c->v[0];
	s->v1 = c->v[1];
	s->v2 = c->v[2];
	s->v3 = c->v[3];
	if (k0 != key->k0 || k1 != key->k1 || c0 != w0 || c1 != w1 || c2 != w2)
		return -1;
	/* the words read may come from two writers (another key being made
	 * on another CPU): then they do not add up */
	return auth_prefix_check(k0, k1, c0, c1, c2, s) == c->check ? 0 : -1;
}

static __always_inline void auth_prefix_put(struct mrc_mac_prefix *c, const struct mrc_auth_key *key,
					    __u64 w0, __u64 w1, __u64 w2, const struct siphash_state *s)
{
	c->k0 = key->k0;
	c->k1 = key->k1;
	c->words[0] = w0;
	c->words[1] = w1;
	c->words[2] = w2;
	c->v[0] = s->v0;
	c->v[1] = s->v1;
	c->v[2] = s->v2;
	c->v[3] = s->v3;
	c->check = auth_prefix_check(key->k0, key->k1, w0, w1, w2, s);
}

/* The MAC, from the state after the epoch word: the TLV's own words. */
static __always_inline __u64 auth_mac_tlv(struct siphash_state *s, const struct mrc_tlv *tlv)
{
	const void *w = tlv;
	__u64 first = siphash_load(w) >> 24;	/* bytes 3..7, little-endian */

	siphash_word(s, siphash_load(w + 8));
	siphash_word(s, siphash_load(w + 16));
	if (!(tlv->flags & MRC_F_FEEDBACK))
		return siphash_final(s, AUTH_MAC_LEN, first);
	siphash_word(s, siphash_load(w + MRC_TLV_FB_OFF));
	siphash_word(s, siphash_load(w + MRC_TLV_FB_OFF + 8));
	siphash_word(s, siphash_load(w + MRC_TLV_FB_OFF + 16));
	return siphash_final(s, AUTH_MAC_LEN_FB, first);
}

/* TX: our epoch, and the MAC when we have a key.  Last, after every
 * other field of the TLV is written.  `dst` is the path's peer SID;
 * `cache` keeps the MAC's state for that peer (its learnt state). */
static __always_inline void auth_sign(struct mrc_tlv *tlv, const __u8 *src, const __u8 *dst,
				      struct mrc_mac_prefix *cache)
{
	const struct mrc_auth_key *key;
	struct siphash_state s;
	struct mrc_auth *a;
	__u32 zero = 0, slot;
	__u64 d0, d1, epoch_word, mac;

	a = mrc_auth.lookup(&zero);
	if (!a)
		return;
	tlv->epoch = bpf_htonl(a->epoch);
	slot = a->tx_slot;
	if (slot == 0 || slot > MRC_AUTH_KEYS)
		return;
	key = &a->keys[(slot - 1) & 1];
	if (!key->id)
		return;
	tlv->key_id = key->id;
	if (!cache)
		return;		/* no MAC: the peer does not file it */
	d0 = siphash_load(dst);
	d1 = siphash_load(dst + 8);
	epoch_word = siphash_load((void *)tlv + MRC_TLV_EPOCH_OFF);
	if (auth_prefix_get(cache, key, d0, d1, epoch_word, &s)) {
		siphash_init(&s, key->k0, key->k1);
		siphash_word(&s, d0);
		siphash_word(&s, d1);
		siphash_word(&s, siphash_load(src));
		siphash_word(&s, siphash_load(src + 8));
		siphash_word(&s, epoch_word);
		auth_prefix_put(cache, key, d0, d1, epoch_word, &s);
	}
	mac = auth_mac_tlv(&s, tlv);
	__builtin_memcpy(tlv->mac, &mac, sizeof(mac));
}

/* The receiver's slot for a sender: Fibonacci hashing of its SID (the
 * top bits of the product: only they depend on every bit of the SID) */
#define AUTH_RX_SLOT_BITS	10
_Static_assert(MRC_AUTH_RX_SENDERS == 1 << AUTH_RX_SLOT_BITS, "the slot is the product's top bits");

static __always_inline __u32 auth_rx_slot(__u64 s0, __u64 s1)
{
	return (__u32)(((s0 ^ s1) * 0x9E3779B97F4A7C15ULL) >> (64 - AUTH_RX_SLOT_BITS)) &
	       (MRC_AUTH_RX_SENDERS - 1);
}

/*
 * RX: may this TLV be filed?  0 when it may (or when we have no key:
 * *keyed says which), else the MRC_RX_AUTH_* counter saying why not.
 */
static __always_inline __u32 auth_verify(const struct ipv6hdr *ip6, const struct mrc_tlv *tlv,
					 int *keyed)
{
	const struct mrc_auth_key *key;
	struct mrc_mac_prefix *cache;
	struct siphash_state s, prefix;
	struct mrc_auth *a;
	__u32 zero = 0, slot;
	__u64 s0, s1, epoch_word;
	int made = 0;
	__u8 id;

	*keyed = 0;
	a = mrc_auth.lookup(&zero);
	if (!a || (!a->keys[0].id && !a->keys[1].id))
		return 0;
	*keyed = 1;
	id = tlv->key_id;
	if (!id)
		return MRC_RX_AUTH_NO_MAC;
	if (id == a->keys[0].id)
		key = &a->keys[0];
	else if (id == a->keys[1].id)
		key = &a->keys[1];
	else
		return MRC_RX_AUTH_UNKNOWN_KEY;
	s0 = siphash_load(ip6->saddr.s6_addr);
	s1 = siphash_load(ip6->saddr.s6_addr + 8);
	epoch_word = siphash_load((void *)tlv + MRC_TLV_EPOCH_OFF);
	slot = auth_rx_slot(s0, s1);
	cache = mrc_auth_rx_prefix.lookup(&slot);
	if (!cache)
		return MRC_RX_AUTH_BAD_MAC;
	if (auth_prefix_get(cache, key, s0, s1, epoch_word, &s)) {
		siphash_init(&s, key->k0, key->k1);
		siphash_word(&s, siphash_load(ip6->daddr.s6_addr));
		siphash_word(&s, siphash_load(ip6->daddr.s6_addr + 8));
		siphash_word(&s, s0);
		siphash_word(&s, s1);
		siphash_word(&s, epoch_word);
		prefix = s;
		made = 1;
	}
	if (auth_mac_tlv(&s, tlv) != siphash_load(tlv->mac))
		return MRC_RX_AUTH_BAD_MAC;
	/* kept only for a sender that proved itself: forgeries from made-up
	 * sources do not push real senders out */
	if (made)
		auth_prefix_put(cache, key, s0, s1, epoch_word, &prefix);
	return 0;
}

#endif
