// Package b64 encodes and decodes standard base64 (RFC 4648, padded, as
// encoding/base64.StdEncoding) several times as fast as encoding/base64:
// the SSE data plane base64-encodes every byte of output, on the one
// goroutine that also writes it to the client, and the client decodes it.
//
// On amd64 with AVX2, 24 bytes are encoded and 32 characters decoded per
// step with vector shuffles (b64_amd64.s). Elsewhere, encoding uses the
// fact that each pair of output characters stands for 12 input bits: a
// table of 4,096 two-character entries (8 KiB, in L1) turns six input
// bytes into eight output bytes with four lookups and one 8-byte store,
// where encoding/base64 does eight lookups and eight byte stores; decoding
// is encoding/base64's.
package b64

import (
	"encoding/base64"
	"encoding/binary"
)

const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

// pairs[v] is the two characters for the 12 bits v, the first in the low
// byte (the order a little-endian store writes them).
var pairs = func() (t [4096]uint16) {
	for v := range t {
		t[v] = uint16(alphabet[v>>6]) | uint16(alphabet[v&63])<<8
	}
	return t
}()

// EncodedLen is the length of the encoding of n bytes.
func EncodedLen(n int) int { return base64.StdEncoding.EncodedLen(n) }

// Encode writes the standard base64 encoding of src to dst, which must
// hold EncodedLen(len(src)) bytes; the result is what
// base64.StdEncoding.Encode writes.
func Encode(dst, src []byte) {
	_ = dst[:EncodedLen(len(src))] // too short a dst fails here, as in encoding/base64
	if simd {
		n := encodeAVX2(dst, src)
		src, dst = src[n:], dst[n/3*4:]
	}
	// Two groups of six bytes per round; each group is read as eight bytes
	// (two past it), so the loop stops two bytes early.
	for len(src) >= 14 {
		a := binary.BigEndian.Uint64(src)
		b := binary.BigEndian.Uint64(src[6:])
		binary.LittleEndian.PutUint64(dst, eight(a))
		binary.LittleEndian.PutUint64(dst[8:], eight(b))
		src, dst = src[12:], dst[16:]
	}
	// The rest (fewer than 14 bytes; what went before is a whole number
	// of 3-byte groups) with its padding.
	base64.StdEncoding.Encode(dst, src)
}

// eight is the eight characters for the top 48 bits of x.
func eight(x uint64) uint64 {
	return uint64(pairs[x>>52]) | uint64(pairs[(x>>40)&0xfff])<<16 | uint64(pairs[(x>>28)&0xfff])<<32 | uint64(pairs[(x>>16)&0xfff])<<48
}

// DecodedLen is the most bytes n characters decode to.
func DecodedLen(n int) int { return base64.StdEncoding.DecodedLen(n) }

// Decode decodes src into dst, which must hold DecodedLen(len(src))
// bytes, and returns what base64.StdEncoding.Decode returns: the bytes
// written and, for input that is not base64, the offset of the first bad
// character (line breaks are skipped, as there).
func Decode(dst, src []byte) (int, error) {
	n, done := 0, 0
	if simd {
		done = decodeAVX2(dst, src)
		n = done / 4 * 3
	}
	m, err := base64.StdEncoding.Decode(dst[n:], src[done:])
	if e, ok := err.(base64.CorruptInputError); ok {
		err = e + base64.CorruptInputError(done)
	}
	return n + m, err
}
