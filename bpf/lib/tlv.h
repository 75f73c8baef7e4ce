/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Finding the MRC TLV among the TLVs of an SRH (RFC 8754 section 2.1).
 * Unknown TLVs are skipped, as the RFC asks of a node that does not
 * process them.
 */
#ifndef MRC_LIB_TLV_H
#define MRC_LIB_TLV_H

#include "mrc_common.h"

#define TLV_PAD1		0

/*
 * Walks the TLVs in [off, hdr_len) of the header at `hdr`.  Returns 0 or
 * the drop reason; on success *mrc points at the MRC TLV (of type
 * `mrc_type`), or is NULL when there is none.
 */
static __always_inline int tlv_find_mrc(void *hdr, void *data_end, __u32 off, __u32 hdr_len,
					__u8 mrc_type, __u32 overrun, struct mrc_tlv **mrc)
{
	__u32 i;

	*mrc = NULL;
	for (i = 0; i < MRC_MAX_TLVS; i++) {
		__u8 *tlv;
		__u32 len;

		if (off >= hdr_len)
			return 0;
		off &= 0x7ff;	/* an SRH is at most 2048 bytes: tells the verifier */
		tlv = hdr + off;
		if ((void *)(tlv + 1) > data_end)
			return MRC_RX_DROP_TRUNCATED;
		if (tlv[0] == TLV_PAD1) {
			off += 1;
			continue;
		}
		if ((void *)(tlv + 2) > data_end)
			return MRC_RX_DROP_TRUNCATED;
		len = 2 + tlv[1];
		if (off + len > hdr_len)
			return overrun;
		if (tlv[0] == mrc_type) {
			struct mrc_tlv *m = (void *)tlv;

			if (len != MRC_TLV_SIZE || (void *)(m + 1) > data_end ||
			    m->version != MRC_VERSION)
				return MRC_RX_DROP_MRC_TLV;
			*mrc = m;
		}
		off += len;
	}
	/* more items than we are willing to walk */
	return off >= hdr_len ? 0 : overrun;
}

#endif
