package b64

import (
	"bytes"
	"encoding/base64"
	"math/rand"
	"testing"
)

func check(t *testing.T, src []byte) {
	t.Helper()
	want := base64.StdEncoding.EncodeToString(src)
	got := make([]byte, EncodedLen(len(src)))
	Encode(got, src)
	if string(got) != want {
		t.Fatalf("%d bytes: got %q, want %q", len(src), got, want)
	}
}

// Every length up to a few rounds, of random and of extreme bytes, encodes
// exactly as encoding/base64 does.
func TestEncodeIsStdEncoding(t *testing.T) {
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
}

// A dst shorter than the encoding panics (as with encoding/base64) rather
// than writing a short encoding.
func TestEncodeIntoShortDstPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	Encode(make([]byte, 15), make([]byte, 12))
}

func FuzzEncodeIsStdEncoding(f *testing.F) {
	f.Add([]byte("hello, world"))
	f.Add(make([]byte, 14))
	f.Fuzz(check)
}

var (
	benchSrc = func() []byte { b := make([]byte, 1<<20); rand.Read(b); return b }()
	benchDst = make([]byte, EncodedLen(1<<20))
)

func BenchmarkEncode(b *testing.B) {
	b.SetBytes(int64(len(benchSrc)))
	for b.Loop() {
		Encode(benchDst, benchSrc)
	}
}

func BenchmarkStdEncoding(b *testing.B) {
	b.SetBytes(int64(len(benchSrc)))
	for b.Loop() {
		base64.StdEncoding.Encode(benchDst, benchSrc)
	}
}
