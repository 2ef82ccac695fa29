//go:build !amd64 || purego

package b64

var simd = false

func encodeAVX2(dst, src []byte) int { return 0 }

func decodeAVX2(dst, src []byte) int { return 0 }
