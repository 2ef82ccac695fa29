package proto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	big := bytes.Repeat([]byte{7}, MaxBlob)
	if err := w.Write(TypeCall, 7, Call{Method: "x"}, []byte("blob")); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(TypeReply, 9, Reply{}, big); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(TypeHello, 0, Hello{Versions: []int{1}}, nil); err != nil {
		t.Fatal(err)
	}
	r := NewReader(&buf)
	f, err := r.Read()
	if err != nil || f.Type != TypeCall || f.ID != 7 || string(f.Blob) != "blob" || string(f.Header) != `{"method":"x"}` {
		t.Fatalf("frame 1 = %+v %v", f, err)
	}
	f, err = r.Read()
	if err != nil || f.ID != 9 || !bytes.Equal(f.Blob, big) {
		t.Fatalf("frame 2: %v", err)
	}
	f, err = r.Read()
	if err != nil || f.Type != TypeHello || len(f.Blob) != 0 {
		t.Fatalf("frame 3 = %+v %v", f, err)
	}
	if _, err := r.Read(); err != io.EOF {
		t.Fatalf("end = %v", err)
	}
	if err := w.Write(TypeReply, 1, Reply{}, make([]byte, MaxFrame)); err == nil {
		t.Fatal("oversized frame written")
	}
}

func TestMalformedFrames(t *testing.T) {
	frame := func(n uint32, body []byte) []byte {
		b := binary.BigEndian.AppendUint32(nil, n)
		return append(b, body...)
	}
	good := func(t Type, hl uint32, rest string) []byte {
		b := []byte{byte(t), 0, 0, 0, 1}
		b = binary.BigEndian.AppendUint32(b, hl)
		return append(b, rest...)
	}
	cases := map[string][]byte{
		"too long":         frame(MaxFrame+1, nil),
		"too short":        frame(3, []byte{1, 2, 3}),
		"unknown type":     frame(11, good(9, 2, "{}")),
		"header overflows": frame(11, good(TypeCall, 99, "{}")),
		"header not json":  frame(11, good(TypeCall, 2, "{x")),
		"empty header":     frame(9, good(TypeCall, 0, "")),
	}
	for name, b := range cases {
		_, err := NewReader(bytes.NewReader(b)).Read()
		if !errors.Is(err, ErrFrame) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
	// Truncated body.
	_, err := NewReader(bytes.NewReader(frame(20, good(TypeCall, 2, "{}")))).Read()
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("truncated: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	var buf bytes.Buffer
	NewWriter(&buf).Write(TypeCall, 3, Call{Method: "process.read"}, []byte("abc"))
	f.Add(buf.Bytes()[4:])
	f.Add([]byte{2, 0, 0, 0, 0, 0, 0, 0, 2, '{', '}'})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := Parse(b)
		if err != nil {
			return
		}
		if len(fr.Header)+len(fr.Blob)+9 != len(b) {
			t.Fatalf("parts do not add up: %d+%d+9 != %d", len(fr.Header), len(fr.Blob), len(b))
		}
		// What parses re-encodes to the same bytes.
		var out bytes.Buffer
		var hdr any = rawJSON(fr.Header)
		if err := NewWriter(&out).Write(fr.Type, fr.ID, hdr, fr.Blob); err != nil {
			return // header JSON that does not re-marshal verbatim is fine
		}
		back, err := NewReader(&out).Read()
		if err != nil || back.ID != fr.ID || back.Type != fr.Type || !bytes.Equal(back.Blob, fr.Blob) {
			t.Fatalf("re-encode mismatch: %v", err)
		}
	})
}

type rawJSON []byte

func (r rawJSON) MarshalJSON() ([]byte, error) { return r, nil }

// A pooled reader's large frames reuse buffers handed back with Release,
// and only those: a frame still held keeps its bytes while later frames
// are read, a released buffer serves a later large frame, and a buffer
// released twice still serves only one frame at a time.
func TestPooledFramesReuseOnlyReleasedBuffers(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	blobs := [][]byte{bytes.Repeat([]byte{1}, 1<<20), bytes.Repeat([]byte{2}, 1<<20), bytes.Repeat([]byte{3}, 1<<20), bytes.Repeat([]byte{4}, 1<<20), []byte("small")}
	for i, b := range blobs {
		if err := w.Write(TypeReply, uint32(i), Reply{}, b); err != nil {
			t.Fatal(err)
		}
	}
	r := NewReader(&buf)
	r.Pool = true
	held, err := r.Read() // kept, never released
	if err != nil {
		t.Fatal(err)
	}
	second, err := r.Read()
	if err != nil || !bytes.Equal(second.Blob, blobs[1]) {
		t.Fatalf("second frame: %v", err)
	}
	second.Release()
	second.Release() // a second release is a no-op, not a double hand-back
	third, err := r.Read()
	if err != nil {
		t.Fatal(err)
	}
	fourth, err := r.Read()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(third.Blob, blobs[2]) || !bytes.Equal(fourth.Blob, blobs[3]) {
		t.Fatal("two frames read one after the other share a buffer")
	}
	if !bytes.Equal(held.Blob, blobs[0]) {
		t.Fatal("a frame still held was overwritten by a later one")
	}
	small, err := r.Read()
	if err != nil || string(small.Blob) != "small" || small.pooled != nil {
		t.Fatalf("small frame = %q pooled %v: %v", small.Blob, small.pooled != nil, err)
	}
	third.Release()
	fourth.Release()
	held.Release()
}
