//go:build !purego

#include "textflag.h"

// The AVX2 loops of Wojciech Muła and Daniel Lemire ("Faster Base64
// Encoding and Decoding Using AVX2 Instructions", 2018), written for this
// package. Each returns how many bytes of src it consumed: a whole number
// of blocks, all valid; the Go side does the rest (padding, line breaks,
// errors) with the portable code.

// encShuf places the three bytes a, b, c of each group as b, a, c, b in a
// 32-bit word, in each 128-bit lane (which holds 12 input bytes).
DATA encShuf<>+0(SB)/8, $0x0405030401020001
DATA encShuf<>+8(SB)/8, $0x0a0b090a07080607
DATA encShuf<>+16(SB)/8, $0x0405030401020001
DATA encShuf<>+24(SB)/8, $0x0a0b090a07080607
GLOBL encShuf<>(SB), RODATA|NOPTR, $32

// encLUT is what to add to a 6-bit value, by its range class: 0 for
// 26..51 ('a'-26), 1..10 for 52..61 ('0'-52), 11 for 62 ('+'-62), 12 for
// 63 ('/'-63), 13 for 0..25 ('A').
DATA encLUT<>+0(SB)/8, $0xfcfcfcfcfcfcfc47
DATA encLUT<>+8(SB)/8, $0x000041f0edfcfcfc
DATA encLUT<>+16(SB)/8, $0xfcfcfcfcfcfcfc47
DATA encLUT<>+24(SB)/8, $0x000041f0edfcfcfc
GLOBL encLUT<>(SB), RODATA|NOPTR, $32

// encK: masks and multipliers that move the four 6-bit fields of each
// word into its four bytes, then the range-class constants 51, 26, 13.
DATA encK<>+0(SB)/4, $0x0fc0fc00
DATA encK<>+4(SB)/4, $0x04000040
DATA encK<>+8(SB)/4, $0x003f03f0
DATA encK<>+12(SB)/4, $0x01000010
DATA encK<>+16(SB)/4, $0x33333333
DATA encK<>+20(SB)/4, $0x1a1a1a1a
DATA encK<>+24(SB)/4, $0x0d0d0d0d
GLOBL encK<>(SB), RODATA|NOPTR, $28

// func encodeAVX2(dst, src []byte) int
TEXT ·encodeAVX2(SB), NOSPLIT, $0-56
	MOVQ dst_base+0(FP), DI
	MOVQ dst_len+8(FP), DX
	MOVQ src_base+24(FP), SI
	MOVQ src_len+32(FP), CX
	XORQ AX, AX
	VMOVDQU encShuf<>(SB), Y15
	VMOVDQU encLUT<>(SB), Y14
	VPBROADCASTD encK<>+0(SB), Y13
	VPBROADCASTD encK<>+4(SB), Y12
	VPBROADCASTD encK<>+8(SB), Y11
	VPBROADCASTD encK<>+12(SB), Y10
	VPBROADCASTD encK<>+16(SB), Y9
	VPBROADCASTD encK<>+20(SB), Y8
	VPBROADCASTD encK<>+24(SB), Y7

encloop:
	// 24 input bytes per round, read as src[0:16] and src[12:28].
	CMPQ CX, $28
	JLT  encdone
	CMPQ DX, $32
	JLT  encdone
	VMOVDQU     (SI), X0
	VINSERTI128 $1, 12(SI), Y0, Y0
	VPSHUFB     Y15, Y0, Y0
	VPAND       Y13, Y0, Y1
	VPMULHUW    Y12, Y1, Y1
	VPAND       Y11, Y0, Y2
	VPMULLW     Y10, Y2, Y2
	VPOR        Y1, Y2, Y0    // a 6-bit value in each byte
	VPSUBUSB    Y9, Y0, Y1    // 52..63 → 1..12, the rest 0
	VPCMPGTB    Y0, Y8, Y2    // 0..25
	VPAND       Y7, Y2, Y2
	VPOR        Y2, Y1, Y1    // the range class
	VPSHUFB     Y1, Y14, Y1
	VPADDB      Y1, Y0, Y0
	VMOVDQU     Y0, (DI)
	ADDQ        $24, SI
	SUBQ        $24, CX
	ADDQ        $32, DI
	SUBQ        $32, DX
	ADDQ        $24, AX
	JMP         encloop

encdone:
	VZEROUPPER
	MOVQ AX, ret+48(FP)
	RET

// decLUTLo and decLUTHi, indexed by a character's low and high nibble,
// share a set bit exactly when the character is not in the alphabet.
DATA decLUTLo<>+0(SB)/8, $0x1111111111111115
DATA decLUTLo<>+8(SB)/8, $0x1a1b1b1b1a131111
DATA decLUTLo<>+16(SB)/8, $0x1111111111111115
DATA decLUTLo<>+24(SB)/8, $0x1a1b1b1b1a131111
GLOBL decLUTLo<>(SB), RODATA|NOPTR, $32

DATA decLUTHi<>+0(SB)/8, $0x0804080402011010
DATA decLUTHi<>+8(SB)/8, $0x1010101010101010
DATA decLUTHi<>+16(SB)/8, $0x0804080402011010
DATA decLUTHi<>+24(SB)/8, $0x1010101010101010
GLOBL decLUTHi<>(SB), RODATA|NOPTR, $32

// decRoll, indexed by the high nibble (one less for '/'), is what to add
// to a valid character to get its 6-bit value.
DATA decRoll<>+0(SB)/8, $0xb9b9bfbf04131000
DATA decRoll<>+8(SB)/8, $0x0000000000000000
DATA decRoll<>+16(SB)/8, $0xb9b9bfbf04131000
DATA decRoll<>+24(SB)/8, $0x0000000000000000
GLOBL decRoll<>(SB), RODATA|NOPTR, $32

// decPack takes the three bytes of each 24-bit word, most significant
// first, to the front of each lane; decPerm joins the two lanes' 12.
DATA decPack<>+0(SB)/8, $0x090a040506000102
DATA decPack<>+8(SB)/8, $0x808080800c0d0e08
DATA decPack<>+16(SB)/8, $0x090a040506000102
DATA decPack<>+24(SB)/8, $0x808080800c0d0e08
GLOBL decPack<>(SB), RODATA|NOPTR, $32

DATA decPerm<>+0(SB)/4, $0
DATA decPerm<>+4(SB)/4, $1
DATA decPerm<>+8(SB)/4, $2
DATA decPerm<>+12(SB)/4, $4
DATA decPerm<>+16(SB)/4, $5
DATA decPerm<>+20(SB)/4, $6
DATA decPerm<>+24(SB)/4, $7
DATA decPerm<>+28(SB)/4, $7
GLOBL decPerm<>(SB), RODATA|NOPTR, $32

// decK: the nibble mask, '/', and the multipliers that join four 6-bit
// values into 24 bits.
DATA decK<>+0(SB)/4, $0x0f0f0f0f
DATA decK<>+4(SB)/4, $0x2f2f2f2f
DATA decK<>+8(SB)/4, $0x01400140
DATA decK<>+12(SB)/4, $0x00011000
GLOBL decK<>(SB), RODATA|NOPTR, $16

// func decodeAVX2(dst, src []byte) int
TEXT ·decodeAVX2(SB), NOSPLIT, $0-56
	MOVQ dst_base+0(FP), DI
	MOVQ dst_len+8(FP), DX
	MOVQ src_base+24(FP), SI
	MOVQ src_len+32(FP), CX
	XORQ AX, AX
	VMOVDQU decLUTLo<>(SB), Y15
	VMOVDQU decLUTHi<>(SB), Y14
	VMOVDQU decRoll<>(SB), Y13
	VMOVDQU decPack<>(SB), Y12
	VMOVDQU decPerm<>(SB), Y11
	VPBROADCASTD decK<>+0(SB), Y10
	VPBROADCASTD decK<>+4(SB), Y9
	VPBROADCASTD decK<>+8(SB), Y8
	VPBROADCASTD decK<>+12(SB), Y7

decloop:
	// 32 characters per round into 24 bytes, stored as 32 (the last 8
	// are overwritten by the next round or lie past what is returned).
	CMPQ CX, $32
	JLT  decdone
	CMPQ DX, $32
	JLT  decdone
	VMOVDQU    (SI), Y0
	VPSRLD     $4, Y0, Y1
	VPAND      Y10, Y1, Y1    // high nibbles
	VPAND      Y10, Y0, Y2    // low nibbles
	VPSHUFB    Y2, Y15, Y2
	VPSHUFB    Y1, Y14, Y3
	VPTEST     Y2, Y3
	JNZ        decdone        // a character outside the alphabet
	VPCMPEQB   Y9, Y0, Y4
	VPADDB     Y4, Y1, Y4
	VPSHUFB    Y4, Y13, Y4
	VPADDB     Y4, Y0, Y0     // a 6-bit value in each byte
	VPMADDUBSW Y8, Y0, Y0
	VPMADDWD   Y7, Y0, Y0     // 24 bits in each word
	VPSHUFB    Y12, Y0, Y0
	VPERMD     Y0, Y11, Y0
	VMOVDQU    Y0, (DI)
	ADDQ       $32, SI
	SUBQ       $32, CX
	ADDQ       $24, DI
	SUBQ       $24, DX
	ADDQ       $32, AX
	JMP        decloop

decdone:
	VZEROUPPER
	MOVQ AX, ret+48(FP)
	RET
