package b64

import (
	"bytes"
	"encoding/base64"
	"math/rand"
	"testing"
)

// paths runs f with the vector loops (where this CPU has them) and with
// the portable code.
func paths(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	has := simd
	defer func() { simd = has }()
	if has {
		t.Run("avx2", f)
	} else {
		t.Log("the AVX2 loops do not run here (no AVX2, or built with purego): only the portable code is tested")
	}
	simd = false
	t.Run("portable", f)
}

func check(t *testing.T, src []byte) {
	t.Helper()
	want := base64.StdEncoding.EncodeToString(src)
	got := make([]byte, EncodedLen(len(src)))
	Encode(got, src)
	if string(got) != want {
		t.Fatalf("%d bytes: got %q, want %q", len(src), got, want)
	}
}

// checkDecode decodes src as encoding/base64 does: the same bytes, the
// same count, the same error (with its offset).
func checkDecode(t *testing.T, src []byte) {
	t.Helper()
	want := make([]byte, base64.StdEncoding.DecodedLen(len(src)))
	wn, werr := base64.StdEncoding.Decode(want, src)
	got := make([]byte, DecodedLen(len(src)))
	n, err := Decode(got, src)
	if n != wn || !bytes.Equal(got[:n], want[:wn]) || err != werr {
		t.Fatalf("%q: got %d %v, want %d %v", src, n, err, wn, werr)
	}
}

// Every length up to a few rounds, of random and of extreme bytes, encodes
// exactly as encoding/base64 does.
func TestEncodeIsStdEncoding(t *testing.T) {
	paths(t, func(t *testing.T) {
		r := rand.New(rand.NewSource(1))
		for n := 0; n <= 200; n++ {
			src := make([]byte, n)
			r.Read(src)
			check(t, src)
			check(t, bytes.Repeat([]byte{0xff}, n))
			check(t, make([]byte, n))
		}
		big := make([]byte, 1<<20+5)
		r.Read(big)
		check(t, big)
	})
}

// Every length decodes as encoding/base64 decodes it, and so does every
// encoding with one character replaced, at every position of a few
// blocks, by each byte that is not in the alphabet (and by '=', a line
// break, and a character of the alphabet).
func TestDecodeIsStdEncoding(t *testing.T) {
	paths(t, func(t *testing.T) {
		r := rand.New(rand.NewSource(2))
		for n := 0; n <= 200; n++ {
			src := make([]byte, n)
			r.Read(src)
			enc := []byte(base64.StdEncoding.EncodeToString(src))
			checkDecode(t, enc)
			checkDecode(t, []byte(base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xff}, n))))
			if n < len(enc) {
				checkDecode(t, enc[:n]) // cut short: mostly an error
			}
		}
		src := make([]byte, 120)
		r.Read(src)
		enc := []byte(base64.StdEncoding.EncodeToString(src))
		for i := range enc {
			for c := 0; c < 256; c++ {
				if bytes.IndexByte([]byte(alphabet), byte(c)) >= 0 && c != 'A' {
					continue
				}
				bad := bytes.Clone(enc)
				bad[i] = byte(c)
				checkDecode(t, bad)
			}
		}
		big := make([]byte, 1<<20+5)
		r.Read(big)
		checkDecode(t, []byte(base64.StdEncoding.EncodeToString(big)))
	})
}

// A dst shorter than the encoding panics (as with encoding/base64) rather
// than writing a short encoding.
func TestEncodeIntoShortDstPanics(t *testing.T) {
	paths(t, func(t *testing.T) {
		defer func() {
			if recover() == nil {
				t.Fatal("no panic")
			}
		}()
		Encode(make([]byte, 15), make([]byte, 12))
	})
}

func FuzzEncodeIsStdEncoding(f *testing.F) {
	f.Add([]byte("hello, world"))
	f.Add(make([]byte, 14))
	f.Add(make([]byte, 60))
	f.Fuzz(check)
}

// Untrusted bytes (an SSE event from the network) decode exactly as
// encoding/base64 decodes them, whatever they are.
func FuzzDecodeIsStdEncoding(f *testing.F) {
	f.Add([]byte("aGVsbG8sIHdvcmxk"))
	f.Add([]byte(base64.StdEncoding.EncodeToString(make([]byte, 60))))
	f.Add([]byte("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\nAAAAAAAAAAAAAAAAAAAAAAAAAAA=AAAAA"))
	f.Fuzz(checkDecode)
}

var (
	benchSrc = func() []byte { b := make([]byte, 1<<20); rand.Read(b); return b }()
	benchDst = make([]byte, EncodedLen(1<<20))
	benchOut = make([]byte, 1<<20)
)

func BenchmarkEncode(b *testing.B) {
	b.SetBytes(int64(len(benchSrc)))
	for b.Loop() {
		Encode(benchDst, benchSrc)
	}
}

func BenchmarkEncodePortable(b *testing.B) {
	defer func(has bool) { simd = has }(simd)
	simd = false
	BenchmarkEncode(b)
}

func BenchmarkStdEncoding(b *testing.B) {
	b.SetBytes(int64(len(benchSrc)))
	for b.Loop() {
		base64.StdEncoding.Encode(benchDst, benchSrc)
	}
}

func BenchmarkDecode(b *testing.B) {
	Encode(benchDst, benchSrc)
	b.SetBytes(int64(len(benchDst)))
	for b.Loop() {
		if _, err := Decode(benchOut, benchDst); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkStdDecoding(b *testing.B) {
	Encode(benchDst, benchSrc)
	b.SetBytes(int64(len(benchDst)))
	for b.Loop() {
		if _, err := base64.StdEncoding.Decode(benchOut, benchDst); err != nil {
			b.Fatal(err)
		}
	}
}
