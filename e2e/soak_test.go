package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/spacesandbox/space/client"
)

// soakCycles is how many create/exec/write/suspend/wake/read/delete cycles
// the soak test runs: a short run by default, `make soak` asks for 1,000.
func soakCycles() int {
	if v, err := strconv.Atoi(os.Getenv("SPACE_SOAK_CYCLES")); err == nil && v > 0 {
		return v
	}
	return 48
}

// usage is what a long run must not grow: the server's open files,
// goroutines and resident memory; the host's sandbox processes and mounts;
// the data directory's size.
type usage struct {
	fds, goroutines, procs, mounts int
	rssMiB, diskMiB                float64
}

func (s *server) usage(t *testing.T) usage {
	t.Helper()
	s.mu.Lock()
	pid := s.cmd.Process.Pid
	s.mu.Unlock()
	var u usage
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	u.fds = len(fds)
	m := string(s.do("GET", "/metrics", "", nil).body)
	metric := func(name string) float64 {
		sc := bufio.NewScanner(strings.NewReader(m))
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == name {
				v, _ := strconv.ParseFloat(f[1], 64)
				return v
			}
		}
		t.Fatalf("no %s in /metrics", name)
		return 0
	}
	u.goroutines = int(metric("go_goroutines"))
	u.rssMiB = metric("process_resident_memory_bytes") / (1 << 20)
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, _ := os.ReadFile(p); bytes.Contains(b, []byte(s.dataDir)) && (bytes.Contains(b, []byte("runsc")) || bytes.Contains(b, []byte("qemu"))) {
			u.procs++
		}
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	u.mounts = bytes.Count(mi, []byte("\n"))
	var disk int64
	filepath.Walk(s.dataDir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			disk += fi.Size()
		}
		return nil
	})
	u.diskMiB = float64(disk) / (1 << 20)
	return u
}

// The soak test (#14's standing test): cycles of create, exec, write,
// suspend, wake, read and delete from 8 concurrent clients on gVisor; at the
// end the server's open files, goroutines and memory, the host's sandbox
// processes and mounts, and the data directory are where they started,
// within the tolerances below. `make soak` runs 1,000 cycles.
func TestSoak(t *testing.T) {
	requireGVisor(t)
	s := startRuntimeServer(t, "gvisor")
	ctx := context.Background()
	cycle := func() error {
		out, _, err := s.client().CreateSandbox(ctx, client.CreateSandboxRequest{Template: s.template}, "")
		if err != nil {
			return fmt.Errorf("create: %w", err)
		}
		id := out.Sandbox.ID
		if op, err := s.client().WaitOperation(ctx, out.Operation.ID); err != nil || op.State != "succeeded" {
			return fmt.Errorf("create %s: %v %+v", id, err, op)
		}
		if r := s.do("PUT", "/v1/sandboxes/"+id+"/files?path=/root/soak.txt", s.token, []byte(id)); r.status != 200 {
			return fmt.Errorf("write: %d %s", r.status, r.body)
		}
		sess := s.command(id, map[string]any{"command": []string{"cat", "/root/soak.txt"}})
		st, _ := s.attach(sess.Attach.URL, sess.Attach.Token, "")
		if st == nil {
			return fmt.Errorf("attach %s", id)
		}
		tr := &transcript{}
		collect(t, st, tr, nil)
		if string(tr.stdout) != id {
			return fmt.Errorf("exec in %s: %q", id, tr.stdout)
		}
		for _, verb := range []string{"suspend", "wake"} {
			op, _, err := s.client().Lifecycle(ctx, verb, id, "")
			if err != nil {
				return fmt.Errorf("%s %s: %w", verb, id, err)
			}
			if op, err := s.client().WaitOperation(ctx, op.ID); err != nil || op.State != "succeeded" {
				return fmt.Errorf("%s %s: %v %+v", verb, id, err, op)
			}
		}
		if r := s.do("GET", "/v1/sandboxes/"+id+"/files?path=/root/soak.txt", s.token, nil); string(r.body) != id {
			return fmt.Errorf("read after wake: %d %q", r.status, r.body)
		}
		op, _, err := s.client().Lifecycle(ctx, "delete", id, "")
		if err != nil {
			return fmt.Errorf("delete %s: %w", id, err)
		}
		if op, err := s.client().WaitOperation(ctx, op.ID); err != nil || op.State != "succeeded" {
			return fmt.Errorf("delete %s: %v %+v", id, err, op)
		}
		return nil
	}
	// One cycle first: what is made once and kept (caches, pools of
	// connections) is not a leak.
	if err := cycle(); err != nil {
		t.Fatal(err)
	}
	before := s.usage(t)
	cycles, workers := soakCycles(), 8
	work := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range work {
				if err := cycle(); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	for i := 0; i < cycles; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	after := s.usage(t)
	t.Logf("soak: %d cycles, %d clients: before %+v, after %+v", cycles, workers, before, after)
	switch {
	case after.fds > before.fds+16:
		t.Errorf("server open files grew %d → %d", before.fds, after.fds)
	case after.goroutines > before.goroutines+32:
		t.Errorf("server goroutines grew %d → %d", before.goroutines, after.goroutines)
	case after.rssMiB > before.rssMiB*1.5+64:
		t.Errorf("server memory grew %.0f → %.0f MiB", before.rssMiB, after.rssMiB)
	case after.procs != before.procs:
		t.Errorf("sandbox processes %d → %d", before.procs, after.procs)
	case after.mounts != before.mounts:
		t.Errorf("mounts %d → %d", before.mounts, after.mounts)
	case after.diskMiB > before.diskMiB+16:
		t.Errorf("data directory grew %.1f → %.1f MiB", before.diskMiB, after.diskMiB)
	}
}
