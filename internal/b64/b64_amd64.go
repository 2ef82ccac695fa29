//go:build !purego

package b64

import "golang.org/x/sys/cpu"

// simd says whether the AVX2 loops run (tests turn it off to check the
// portable code on the same machine).
var simd = cpu.X86.HasAVX2

// encodeAVX2 encodes whole 24-byte blocks of src into dst while src holds
// 28 bytes (it reads 4 past a block) and dst 32; it returns the bytes of
// src consumed, a multiple of 24.
//
//go:noescape
func encodeAVX2(dst, src []byte) int

// decodeAVX2 decodes whole 32-character blocks of src into dst while src
// holds 32 and dst 32 bytes (each block's 24 bytes are stored as 32), up
// to the first block with a character outside the alphabet; it returns the
// characters of src consumed, a multiple of 32.
//
//go:noescape
func decodeAVX2(dst, src []byte) int
