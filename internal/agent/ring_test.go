package agent

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"
)

func seqs(cs []chunk) string {
	return fmt.Sprint(func() []uint64 {
		var s []uint64
		for _, c := range cs {
			s = append(s, c.seq)
		}
		return s
	}())
}

func TestRingReadAfterAndEvict(t *testing.T) {
	r := newRing(10, time.Second)
	ctx := context.Background()
	for i := 0; i < 5; i++ {
		r.append("stdout", []byte("ab")) // 5 chunks, 10 bytes: all fit
	}
	if rs, cs, _ := r.read(ctx, 0, 100, 0, ""); rs || seqs(cs) != "[1 2 3 4 5]" {
		t.Fatalf("read(0) = %v %s", rs, seqs(cs))
	}
	if rs, cs, _ := r.read(ctx, 3, 100, 0, ""); rs || seqs(cs) != "[4 5]" {
		t.Fatalf("read(3) = %v %s", rs, seqs(cs))
	}
	if _, cs, _ := r.read(ctx, 0, 3, 0, ""); seqs(cs) != "[1]" {
		t.Fatalf("maxBytes not honoured: %s", seqs(cs))
	}
	r.append("stderr", []byte("cdef")) // evicts 1 and 2
	if rs, cs, _ := r.read(ctx, 1, 100, 0, ""); !rs || seqs(cs) != "[3 4 5 6]" {
		t.Fatalf("read evicted = %v %s", rs, seqs(cs))
	}
	if rs, cs, _ := r.read(ctx, 2, 100, 0, ""); rs || seqs(cs) != "[3 4 5 6]" {
		t.Fatalf("read(2) right at the window = %v %s", rs, seqs(cs))
	}
	if rs, _, _ := r.read(ctx, 99, 100, 0, ""); !rs {
		t.Fatal("a future id must resync")
	}
	if rs, cs, ex := r.read(ctx, 6, 100, 0, ""); rs || len(cs) != 0 || ex {
		t.Fatalf("caught up = %v %s %v", rs, seqs(cs), ex)
	}
	r.close()
	if _, _, ex := r.read(ctx, 6, 100, time.Second, ""); !ex {
		t.Fatal("not exhausted after close")
	}
}

func TestRingWaitsForActiveSubscriber(t *testing.T) {
	r := newRing(4, 2*time.Second)
	ctx := context.Background()
	r.read(ctx, 0, 100, 0, "sub") // subscribe at 0
	r.append("stdout", []byte("1234"))
	appended := make(chan struct{})
	go func() { r.append("stdout", []byte("5678")); close(appended) }()
	select {
	case <-appended:
		t.Fatal("evicted output the subscriber has not read")
	case <-time.After(100 * time.Millisecond):
	}
	_, cs, _ := r.read(ctx, 0, 100, 0, "sub")
	r.read(ctx, cs[len(cs)-1].seq, 100, 0, "sub") // ack chunk 1
	select {
	case <-appended:
	case <-time.After(time.Second):
		t.Fatal("producer still blocked after the subscriber acknowledged")
	}
	if _, cs, _ := r.read(ctx, 1, 100, 0, "sub"); seqs(cs) != "[2]" {
		t.Fatalf("after ack = %s", seqs(cs))
	}
}

func TestRingForgetsIdleSubscriber(t *testing.T) {
	r := newRing(4, 80*time.Millisecond)
	r.read(context.Background(), 0, 100, 0, "gone")
	r.append("stdout", []byte("1234"))
	done := make(chan struct{})
	go func() { r.append("stdout", []byte("5678")); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("an idle subscriber blocks the process forever")
	}
}

func TestRingReadWaitsForOutput(t *testing.T) {
	r := newRing(100, time.Second)
	go func() { time.Sleep(30 * time.Millisecond); r.append("stdout", []byte("x")) }()
	_, cs, _ := r.read(context.Background(), 0, 100, 5*time.Second, "")
	if seqs(cs) != "[1]" {
		t.Fatalf("long poll = %s", seqs(cs))
	}
}

// Each chunk owns memory of its own size, so many small reads do not each
// pin a whole read buffer: 1,000 one-line chunks hold kilobytes, not
// 1,000 read buffers.
func TestPumpChunksOwnTheirSize(t *testing.T) {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	r := newRing(4*pumpBuf, time.Minute) // holds all of it
	done := make(chan struct{})
	go func() { pump(pr, "stdout", r); close(done) }()
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const lines = 1000
	for i := 0; i < lines; i++ {
		fmt.Fprintf(pw, "%07d\n", i)
		for deadline := time.Now().Add(5 * time.Second); ; {
			r.mu.Lock()
			n := r.next
			r.mu.Unlock()
			if n == uint64(i+2) {
				break // its own chunk
			}
			if time.Now().After(deadline) {
				t.Fatalf("line %d not pumped", i)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grown := int64(after.HeapAlloc) - int64(before.HeapAlloc); grown > 1<<20 {
		t.Fatalf("%d one-line chunks hold %d KiB of heap", lines, grown>>10)
	}
	big := make([]byte, 3*pumpBuf)
	pw.Write(big)
	pw.Close()
	<-done
	total := 0
	for _, c := range r.chunks {
		total += len(c.data)
	}
	if want := lines*8 + len(big); total != want {
		t.Fatalf("pumped %d bytes, want %d", total, want)
	}
}

// A reader blocked in a long wait for output is there, however long ago it
// asked: the producer must not forget it (and evict what it has not read)
// just because its wait outlasts the idle limit.
func TestRingKeepsWaitingSubscriber(t *testing.T) {
	r := newRing(4, 50*time.Millisecond)
	got := make(chan []chunk, 1)
	go func() {
		_, cs, _ := r.read(context.Background(), 0, 100, 2*time.Second, "waiter")
		got <- cs
	}()
	time.Sleep(200 * time.Millisecond) // four idle limits while it waits
	r.mu.Lock()
	needed := r.neededLocked(1, time.Now())
	r.mu.Unlock()
	if !needed {
		t.Fatal("a subscriber waiting in read was forgotten after the idle limit")
	}
	r.append("stdout", []byte("1234"))
	if cs := <-got; seqs(cs) != "[1]" {
		t.Fatalf("waiter got %s", seqs(cs))
	}
}
