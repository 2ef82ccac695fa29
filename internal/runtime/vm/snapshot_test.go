//go:build linux

package vm_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/agent/proto"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/runtime/runtimetest"
	"github.com/spacesandbox/space/internal/runtime/vm"
	"github.com/spacesandbox/space/internal/sandbox"
)

// Snapshots of a VM whose agent streams a process's output to a reader
// polling through the runtime: each save finds the agent at a session's
// end and the VM answers again at once. (A reader that made the runtime
// listen again mid-save let the agent start a session the save caught
// half-way: it then answered only after a minute.)
func TestSnapshotWhileStreaming(t *testing.T) {
	qemu := requireVM(t)
	agent := runtimetest.BuildAgent(t)
	store, tpl := runtimetest.TestTemplate(t)
	dir := t.TempDir()
	r, err := vm.New(context.Background(), vm.Config{QEMU: qemu, Kernel: filepath.Join(guestDir, "vmlinuz"),
		Modules: filepath.Join(guestDir, "modules"), AgentBin: agent, Dir: dir, Templates: store})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	id := ids.New(ids.Sandbox)
	spec := runtime.Spec{SandboxID: id, Template: sandbox.TemplateRef{Ref: "test:latest", Digest: tpl.Digest},
		Resources: sandbox.Resources{VCPUs: 1, MemoryMiB: 256, DiskMiB: 1024}, SnapshotDir: filepath.Join(t.TempDir(), "s")}
	defer r.Delete(context.Background(), spec)
	if err := r.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	c, _ := r.Agent(ctx, spec)
	p, err := c.CreateProcess(ctx, proto.ProcessSpec{ID: "p1", Argv: []string{"sh", "-c", "i=0; while true; do i=$((i+1)); echo $i; sleep 0.05; done"}})
	if err != nil {
		t.Fatal(err)
	}
	c.StartProcess(ctx, p.ID)
	stop := make(chan struct{})
	go func() {
		var after uint64
		for {
			select {
			case <-stop:
				return
			default:
			}
			c, err := r.Agent(ctx, spec)
			if err != nil {
				continue
			}
			out, err := c.ReadOutput(ctx, "p1", after, 1<<16, time.Second, "s")
			if err == nil {
				if n := len(out.Chunks); n > 0 {
					after = out.Chunks[n-1].Seq
				}
			}
		}
	}()
	for i := 0; i < 4; i++ {
		time.Sleep(500 * time.Millisecond)
		t0 := time.Now()
		if err := r.Snapshot(ctx, spec, filepath.Join(t.TempDir(), "snap")); err != nil {
			b, _ := os.ReadFile(filepath.Join(dir, "sandboxes", id, "console.log"))
			t.Fatalf("snapshot %d: %v\nconsole: %s", i, err, b)
		}
		t.Logf("snapshot %d: %s", i, time.Since(t0))
		if d := time.Since(t0); d > 30*time.Second {
			t.Fatalf("snapshot %d took %s: the agent did not answer at once", i, d)
		}
	}
	close(stop)
}
