/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Authenticated TLVs (docs/design/threat-model.md).  Feedback moves path
 * state: acknowledgements keep paths up or take them down, reported delay
 * and loss steer the adaptive policy.  Without a key anyone who can put a
 * packet on the fabric with a peer's SID as its source can forge it.
 * With one, the sender appends to every TLV a SipHash-2-4 MAC over
 *   outer source (16) | final outer destination (16) | TLV before mac[]
 * (the final destination is the peer's SID, which is what the receiver
 * sees once the last segment is reached), and the receiver files a TLV
 * only when the MAC verifies under one of its two keys and the packet is
 * fresh (lib/rx_track.h: a newer epoch, a path_seq not seen before).
 */
#ifndef MRC_LIB_AUTH_H
#define MRC_LIB_AUTH_H

#include "lib/maps.h"
#include "lib/siphash.h"

_Static_assert(MRC_TLV_MAC_OFF % 8 == 0, "the MAC covers whole words of the TLV");
_Static_assert(MRC_AUTH_KEYS == 2, "auth_verify looks in two slots");

#define AUTH_MAC_LEN	(16 + 16 + MRC_TLV_MAC_OFF)	/* bytes the MAC covers */

static __always_inline __u64 auth_mac(const struct mrc_auth_key *key, const __u8 *src,
				      const __u8 *dst, const void *tlv)
{
	struct siphash_state s;
	__u32 i;

	siphash_init(&s, key->k0, key->k1);
	siphash_word(&s, siphash_load(src));
	siphash_word(&s, siphash_load(src + 8));
	siphash_word(&s, siphash_load(dst));
	siphash_word(&s, siphash_load(dst + 8));
#pragma unroll
	for (i = 0; i < MRC_TLV_MAC_OFF / 8; i++)
		siphash_word(&s, siphash_load(tlv + 8 * i));
	return siphash_final(&s, AUTH_MAC_LEN);
}

/* TX: our epoch, and the MAC when we have a key.  Last, after every
 * other field of the TLV is written. */
static __always_inline void auth_sign(struct mrc_tlv *tlv, const __u8 *src, const __u8 *dst)
{
	const struct mrc_auth_key *key;
	struct mrc_auth *a;
	__u32 zero = 0, slot;
	__u64 mac;

	a = auth.lookup(&zero);
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
	mac = auth_mac(key, src, dst, tlv);
	__builtin_memcpy(tlv->mac, &mac, sizeof(mac));
}

/*
 * RX: may this TLV be filed?  0 when it may (or when we have no key:
 * *keyed says which), else the MRC_RX_AUTH_* counter saying why not.
 */
static __always_inline __u32 auth_verify(const struct ipv6hdr *ip6, const struct mrc_tlv *tlv,
					 int *keyed)
{
	const struct mrc_auth_key *key;
	struct mrc_auth *a;
	__u32 zero = 0;
	__u8 id;

	*keyed = 0;
	a = auth.lookup(&zero);
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
	if (auth_mac(key, ip6->saddr.s6_addr, ip6->daddr.s6_addr, tlv) != siphash_load(tlv->mac))
		return MRC_RX_AUTH_BAD_MAC;
	return 0;
}

#endif
