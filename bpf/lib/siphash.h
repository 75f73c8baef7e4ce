/* SPDX-License-Identifier: GPL-2.0 */
/*
 * SipHash-2-4 (Aumasson and Bernstein, "SipHash: a fast short-input PRF",
 * 2012) over a fixed-length message, as a MAC: straight-line code
 * with no loops the verifier has to walk and no helper calls.  The
 * message is read as little-endian 64-bit words (BPF on x86 is little
 * endian), so the result is the reference SipHash of those bytes.
 */
#ifndef MRC_LIB_SIPHASH_H
#define MRC_LIB_SIPHASH_H

#define SIPHASH_ROTL(x, b)	(((x) << (b)) | ((x) >> (64 - (b))))

#define SIPHASH_ROUND(v0, v1, v2, v3)					\
	do {								\
		v0 += v1; v1 = SIPHASH_ROTL(v1, 13); v1 ^= v0;		\
		v0 = SIPHASH_ROTL(v0, 32);				\
		v2 += v3; v3 = SIPHASH_ROTL(v3, 16); v3 ^= v2;		\
		v0 += v3; v3 = SIPHASH_ROTL(v3, 21); v3 ^= v0;		\
		v2 += v1; v1 = SIPHASH_ROTL(v1, 17); v1 ^= v2;		\
		v2 = SIPHASH_ROTL(v2, 32);				\
	} while (0)

struct siphash_state {
	__u64	v0, v1, v2, v3;
};

static __always_inline void siphash_init(struct siphash_state *s, __u64 k0, __u64 k1)
{
	s->v0 = 0x736f6d6570736575ULL ^ k0;
	s->v1 = 0x646f72616e646f6dULL ^ k1;
	s->v2 = 0x6c7967656e657261ULL ^ k0;
	s->v3 = 0x7465646279746573ULL ^ k1;
}

/* One message word: two compression rounds. */
static __always_inline void siphash_word(struct siphash_state *s, __u64 m)
{
	s->v3 ^= m;
	SIPHASH_ROUND(s->v0, s->v1, s->v2, s->v3);
	SIPHASH_ROUND(s->v0, s->v1, s->v2, s->v3);
	s->v0 ^= m;
}

/* After `len` bytes in all: the last block (the len % 8 bytes after the
 * whole words, `tail`, below the length byte), four finalization rounds. */
static __always_inline __u64 siphash_final(struct siphash_state *s, __u32 len, __u64 tail)
{
	siphash_word(s, ((__u64)(len & 0xff) << 56) | tail);
	s->v2 ^= 0xff;
	SIPHASH_ROUND(s->v0, s->v1, s->v2, s->v3);
	SIPHASH_ROUND(s->v0, s->v1, s->v2, s->v3);
	SIPHASH_ROUND(s->v0, s->v1, s->v2, s->v3);
	SIPHASH_ROUND(s->v0, s->v1, s->v2, s->v3);
	return s->v0 ^ s->v1 ^ s->v2 ^ s->v3;
}

/*
 * The little-endian word at p, which may be unaligned: one 8-byte load.
 * The verifier checks alignment on the stack always, elsewhere (packet,
 * map value) only under strict alignment, which x86-64 and arm64 do not
 * have: so p must not point into the stack.  The barrier keeps clang from
 * loading a whole message ahead of its use, which would spill it to the
 * stack (the callers' stacks are nearly full).
 */
static __always_inline __u64 siphash_load(const void *p)
{
	asm volatile("" ::: "memory");
	return *(const __u64 *)p;
}

#endif
