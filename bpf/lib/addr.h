/* SPDX-License-Identifier: GPL-2.0 */
/* IPv6 address helpers over plain byte arrays (no alignment assumed). */
#ifndef MRC_LIB_ADDR_H
#define MRC_LIB_ADDR_H

static __always_inline int addr_equal(const __u8 *a, const __u8 *b)
{
	const __u32 *x = (const __u32 *)a, *y = (const __u32 *)b;

	return ((x[0] ^ y[0]) | (x[1] ^ y[1]) | (x[2] ^ y[2]) | (x[3] ^ y[3])) == 0;
}

/* fe80::/10 and ff00::/8 stay on the link: never encapsulated. */
static __always_inline int addr_is_link_scoped(const __u8 *a)
{
	return a[0] == 0xff || (a[0] == 0xfe && (a[1] & 0xc0) == 0x80);
}

#endif
