package agent_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/agent"
	"github.com/spacesandbox/space/internal/agent/proto"
	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/sandboxio/sandboxiotest"
)

// These tests run the agent as a HOST PROCESS (not in a sandbox) and talk to
// it over a real unix socket pair, so its protocol, processes and files are
// tested before any runtime exists.

func startAgentOnHost(t testing.TB) (*agentclient.Client, string) {
	t.Helper()
	return startAgentWith(t, agent.Config{Root: t.TempDir()})
}

func startAgentWith(t testing.TB, cfg agent.Config) (*agentclient.Client, string) {
	t.Helper()
	a := sandboxiotest.StartWith(t, cfg)
	return a.Client, a.Root
}

type result struct {
	stdout, stderr bytes.Buffer
	exited         *proto.Process
	resyncs        int
}

// run creates, starts and reads a process to the end.
func run(t *testing.T, c *agentclient.Client, spec proto.ProcessSpec) *result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if spec.ID == "" {
		spec.ID = "p" + strings.ReplaceAll(t.Name(), "/", "_") + time.Now().Format("150405.000000000")
	}
	if _, err := c.CreateProcess(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartProcess(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	return drain(t, ctx, c, spec.ID, 0)
}

// drain reads a process's output to its end as the host's Follow does:
// while it is busy with what it read (a loaded test machine can stall it for
// seconds), it holds its place in the window every second.
func drain(t *testing.T, ctx context.Context, c *agentclient.Client, id string, after uint64) *result {
	t.Helper()
	res := &result{}
	var acked atomic.Uint64
	acked.Store(after)
	hctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		for tick := time.NewTicker(time.Second); ; {
			select {
			case <-hctx.Done():
				tick.Stop()
				return
			case <-tick.C:
				c.Hold(hctx, id, "test", acked.Load())
			}
		}
	}()
	for {
		acked.Store(after)
		out, err := c.ReadOutput(ctx, id, after, 1<<20, 5*time.Second, "test")
		if err != nil {
			t.Fatalf("read output: %v", err)
		}
		if out.Resync {
			res.resyncs++
		}
		off := 0
		for _, ch := range out.Chunks {
			if ch.Seq <= after && !out.Resync {
				t.Fatalf("chunk %d repeated after %d", ch.Seq, after)
			}
			data := out.Data[off : off+ch.Len]
			off += ch.Len
			if ch.Stream == proto.Stderr {
				res.stderr.Write(data)
			} else {
				res.stdout.Write(data)
			}
			after = ch.Seq
		}
		if out.Exited != nil {
			res.exited = out.Exited
			return res
		}
	}
}

func exitCode(t *testing.T, r *result) int {
	t.Helper()
	if r.exited == nil || r.exited.ExitCode == nil {
		t.Fatalf("no exit recorded: %+v", r.exited)
	}
	return *r.exited.ExitCode
}

func TestAgentOnHostSeedCommand(t *testing.T) {
	c, _ := startAgentOnHost(t)
	r := run(t, c, proto.ProcessSpec{Argv: []string{"sh", "-c", `printf '%s\n' "$GREETING"; pwd`}, Cwd: "/tmp", Env: map[string]string{"GREETING": "Hello from SPACE"}})
	if got := r.stdout.String(); got != "Hello from SPACE\n/tmp\n" || r.stderr.Len() != 0 || exitCode(t, r) != 0 {
		t.Fatalf("stdout %q stderr %q code %d", got, r.stderr.String(), exitCode(t, r))
	}
}

func TestAgentOnHostExitCodesAndStreams(t *testing.T) {
	c, _ := startAgentOnHost(t)
	r := run(t, c, proto.ProcessSpec{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 7"}})
	if r.stdout.String() != "out\n" || r.stderr.String() != "err\n" || exitCode(t, r) != 7 {
		t.Fatalf("stdout %q stderr %q code %d", r.stdout.String(), r.stderr.String(), exitCode(t, r))
	}
}

func TestAgentOnHostStartFailures(t *testing.T) {
	c, _ := startAgentOnHost(t)
	plain := filepath.Join(t.TempDir(), "not-executable")
	os.WriteFile(plain, []byte("data"), 0o644)
	script := filepath.Join(t.TempDir(), "garbage")
	os.WriteFile(script, []byte{0x7f, 'E', 'L', 'F', 0, 0}, 0o755)
	for _, tc := range []struct {
		spec proto.ProcessSpec
		code int
		err  string
	}{
		{proto.ProcessSpec{Argv: []string{"/no/such/binary"}}, 127, "executable_not_found"},
		{proto.ProcessSpec{Argv: []string{"no-such-command-anywhere"}}, 127, "executable_not_found"},
		{proto.ProcessSpec{Argv: []string{plain}}, 126, "executable_not_executable"},
		{proto.ProcessSpec{Argv: []string{script}}, 126, "executable_not_executable"},
		{proto.ProcessSpec{Argv: []string{"true"}, Cwd: "/no/such/dir"}, 125, "cwd_not_found"},
	} {
		r := run(t, c, tc.spec)
		if exitCode(t, r) != tc.code || r.exited.Error == nil || r.exited.Error.Code != tc.err {
			t.Errorf("%v: code %d error %+v", tc.spec.Argv, exitCode(t, r), r.exited.Error)
		}
	}
	// Invalid specs are call errors.
	ctx := context.Background()
	var pe *proto.Error
	if _, err := c.CreateProcess(ctx, proto.ProcessSpec{ID: "x"}); !errors.As(err, &pe) || pe.Code != proto.CodeInvalidArgument {
		t.Fatalf("empty argv = %v", err)
	}
	if _, err := c.StartProcess(ctx, "never-made"); !errors.As(err, &pe) || pe.Code != proto.CodeNotFound {
		t.Fatalf("start unknown = %v", err)
	}
}

func TestAgentOnHostTimeoutKillsGroup(t *testing.T) {
	c, _ := startAgentOnHost(t)
	start := time.Now()
	r := run(t, c, proto.ProcessSpec{Argv: []string{"sh", "-c", "sleep 30 & sleep 30; echo never"}, Timeout: 300 * time.Millisecond})
	if time.Since(start) > 10*time.Second {
		t.Fatal("timeout did not kill the process group")
	}
	if r.exited.Error == nil || r.exited.Error.Code != "timeout" || exitCode(t, r) != 128+9 || strings.Contains(r.stdout.String(), "never") {
		t.Fatalf("timed out process = %+v", r.exited)
	}
}

func TestAgentOnHostStdinAndSignals(t *testing.T) {
	c, _ := startAgentOnHost(t)
	ctx := context.Background()
	c.CreateProcess(ctx, proto.ProcessSpec{ID: "cat", Argv: []string{"cat"}, Stdin: true})
	c.StartProcess(ctx, "cat")
	if err := c.Stdin(ctx, "cat", []byte("round trip\n")); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseStdin(ctx, "cat"); err != nil {
		t.Fatal(err)
	}
	r := drain(t, ctx, c, "cat", 0)
	if r.stdout.String() != "round trip\n" || exitCode(t, r) != 0 {
		t.Fatalf("cat = %q %d", r.stdout.String(), exitCode(t, r))
	}
	for _, sig := range []string{"SIGTERM", "SIGKILL"} {
		id := "sleep-" + sig
		c.CreateProcess(ctx, proto.ProcessSpec{ID: id, Argv: []string{"sleep", "60"}})
		c.StartProcess(ctx, id)
		list, _ := c.ListProcesses(ctx)
		found := false
		for _, p := range list {
			found = found || p.ID == id
		}
		if !found {
			t.Fatalf("%s not listed as running", id)
		}
		if err := c.Signal(ctx, id, sig); err != nil {
			t.Fatal(err)
		}
		r := drain(t, ctx, c, id, 0)
		if r.exited.Signal != sig {
			t.Fatalf("%s: exited %+v", sig, r.exited)
		}
	}
	var pe *proto.Error
	if err := c.Signal(ctx, "cat", "SIGBOGUS"); !errors.As(err, &pe) || pe.Code != proto.CodeInvalidArgument {
		t.Fatalf("bogus signal = %v", err)
	}
}

func TestAgentOnHostPTY(t *testing.T) {
	c, _ := startAgentOnHost(t)
	r := run(t, c, proto.ProcessSpec{Argv: []string{"sh", "-c", "tty; stty size"}, PTY: &proto.PTY{Cols: 100, Rows: 40}})
	out := r.stdout.String()
	if !strings.Contains(out, "/dev/pts/") || !strings.Contains(out, "40 100") || exitCode(t, r) != 0 {
		t.Fatalf("pty output %q", out)
	}
}

// 100 MiB through a 2 MiB window loses nothing while a subscriber reads.
func TestAgentOnHostLargeOutputIntact(t *testing.T) {
	c, _ := startAgentOnHost(t)
	r := run(t, c, proto.ProcessSpec{Argv: []string{"sh", "-c", "head -c 104857600 /dev/urandom > /tmp/space-agent-test-out; sha256sum /tmp/space-agent-test-out >&2; cat /tmp/space-agent-test-out"}})
	defer os.Remove("/tmp/space-agent-test-out")
	sum := sha256.Sum256(r.stdout.Bytes())
	if r.stdout.Len() != 100<<20 || r.resyncs != 0 || !strings.HasPrefix(r.stderr.String(), hexs(sum[:])) {
		t.Fatalf("got %d bytes, %d resyncs, sum %x vs %q", r.stdout.Len(), r.resyncs, sum, r.stderr.String())
	}
}

func hexs(b []byte) string {
	const h = "0123456789abcdef"
	var s strings.Builder
	for _, x := range b {
		s.WriteByte(h[x>>4])
		s.WriteByte(h[x&15])
	}
	return s.String()
}

// Reading again from a point resumes exactly there; a reader that falls out
// of the window gets a resync.
func TestAgentOnHostResumeAndResync(t *testing.T) {
	c, _ := startAgentOnHost(t)
	ctx := context.Background()
	c.CreateProcess(ctx, proto.ProcessSpec{ID: "seq", Argv: []string{"sh", "-c", "for i in 1 2 3 4 5; do echo $i; sleep 0.05; done"}})
	c.StartProcess(ctx, "seq")
	full := drain(t, ctx, c, "seq", 0)
	if full.stdout.String() != "1\n2\n3\n4\n5\n" {
		t.Fatalf("full = %q", full.stdout.String())
	}
	again := drain(t, ctx, c, "seq", 2)
	if again.stdout.String() != "3\n4\n5\n" || again.resyncs != 0 {
		t.Fatalf("resume after 2 = %q", again.stdout.String())
	}
	// 3 MiB into a 2 MiB window with nobody reading: the start is evicted.
	c.CreateProcess(ctx, proto.ProcessSpec{ID: "big", Argv: []string{"head", "-c", "3145728", "/dev/zero"}})
	c.StartProcess(ctx, "big")
	for {
		p, _ := c.GetProcess(ctx, "big")
		if p.State == proto.ProcExited {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	late := drain(t, ctx, c, "big", 0)
	if late.resyncs != 1 || late.stdout.Len() >= 3<<20 || late.stdout.Len() < 1<<20 {
		t.Fatalf("late reader: %d resyncs, %d bytes", late.resyncs, late.stdout.Len())
	}
}

func TestAgentOnHostFiles(t *testing.T) {
	c, root := startAgentOnHost(t)
	ctx := context.Background()
	data := make([]byte, 3<<20+17)
	for i := range data {
		data[i] = byte(i * 7)
	}
	e, err := c.WriteFile(ctx, "/a/b/c.bin", 0o640, bytes.NewReader(data), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if e.Type != "file" || e.Size != int64(len(data)) || e.Mode != "0640" {
		t.Fatalf("entry = %+v", e)
	}
	onDisk, _ := os.ReadFile(filepath.Join(root, "a/b/c.bin"))
	if !bytes.Equal(onDisk, data) {
		t.Fatal("file on disk differs")
	}
	var got []byte
	for off := int64(0); ; {
		res, b, err := c.ReadFile(ctx, "/a/b/c.bin", off, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, b...)
		off += int64(len(b))
		if res.EOF {
			break
		}
	}
	if !bytes.Equal(got, data) {
		t.Fatal("read back differs")
	}
	if _, err := c.Mkdir(ctx, "/d/e", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Move(ctx, "/a/b/c.bin", "/d/e/moved.bin"); err != nil {
		t.Fatal(err)
	}
	l, err := c.List(ctx, "/", 3)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, it := range l.Items {
		paths = append(paths, it.Path)
	}
	if strings.Join(paths, ",") != "/a,/a/b,/d,/d/e,/d/e/moved.bin" {
		t.Fatalf("list = %v", paths)
	}
	if err := c.Remove(ctx, "/d", false); err == nil {
		t.Fatal("non-recursive remove of a non-empty dir succeeded")
	}
	if err := c.Remove(ctx, "/d", true); err != nil {
		t.Fatal(err)
	}
	var pe *proto.Error
	if _, err := c.Stat(ctx, "/d"); !errors.As(err, &pe) || pe.Code != proto.CodeNotFound {
		t.Fatalf("stat removed = %v", err)
	}
	if _, err := c.Stat(ctx, "relative"); !errors.As(err, &pe) || pe.Code != proto.CodeInvalidArgument {
		t.Fatalf("relative path = %v", err)
	}
	// No temporary files left behind.
	left, _ := filepath.Glob(filepath.Join(root, "a/b/.*"))
	if len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
}

// A file whose size is not known up front (/proc: stat says 0) is read to
// its end, in one chunk or many; a FIFO or a device is refused at once, not
// waited on or read forever (#14 item 9).
func TestAgentOnHostFilesOfUnknownSize(t *testing.T) {
	c, _ := startAgentWith(t, agent.Config{Root: "/"})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// A procfs file: size 0 in its stat, content made on each read. Limits,
	// not status: status moves while it is read in chunks (memory figures
	// change length between two reads), so its pieces need not fit.
	want, err := os.ReadFile("/proc/self/limits")
	if err != nil || len(want) < 200 {
		t.Skipf("no /proc/self/limits here: %v", err)
	}
	for _, chunk := range []int{1 << 20, 64} {
		f, err := c.OpenFile(ctx, "/proc/self/limits", chunk)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(f)
		if err != nil {
			t.Fatalf("chunk %d: %v", chunk, err)
		}
		// The agent is this process: the same limits.
		if !bytes.Equal(got, want) {
			t.Fatalf("chunk %d: read %d bytes %q, want %d: %q", chunk, len(got), got, len(want), want)
		}
		if chunk == 64 && f.Size != -1 {
			t.Fatalf("size of a size-less file read in chunks = %d, want -1 (unknown)", f.Size)
		}
		if chunk > len(want) && f.Size != int64(len(got)) {
			t.Fatalf("size of a size-less file read at once = %d, want %d", f.Size, len(got))
		}
	}
	dir := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	var pe *proto.Error
	for _, p := range []string{filepath.Join(dir, "fifo"), "/dev/zero"} {
		if _, err := c.OpenFile(ctx, p, 1<<20); !errors.As(err, &pe) || pe.Code != proto.CodeFailedPrecondition {
			t.Fatalf("read %s = %v, want failed_precondition", p, err)
		}
	}
}

// ".." never climbs out of the root and symlinks cannot lead outside it.
func TestAgentOnHostPathsStayInside(t *testing.T) {
	c, root := startAgentOnHost(t)
	ctx := context.Background()
	outside := filepath.Join(filepath.Dir(root), "outside-"+filepath.Base(root))
	os.WriteFile(outside, []byte("host secret"), 0o600)
	defer os.Remove(outside)
	if _, err := c.WriteFile(ctx, "/../../../"+filepath.Base(outside), 0, strings.NewReader("x"), 0); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(outside); string(b) != "host secret" {
		t.Fatal("a .. path wrote outside the root")
	}
	if _, err := os.Stat(filepath.Join(root, filepath.Base(outside))); err != nil {
		t.Fatal(".. path did not land inside the root")
	}
	os.Symlink(filepath.Dir(root), filepath.Join(root, "escape"))
	os.Symlink("/etc", filepath.Join(root, "etc-link"))
	for _, p := range []string{"/escape/" + filepath.Base(outside), "/etc-link/hostname"} {
		if _, b, err := c.ReadFile(ctx, p, 0, 100); err == nil {
			t.Fatalf("read through symlink %s escaped: %q", p, b)
		}
		if _, err := c.WriteFile(ctx, p, 0, strings.NewReader("pwned"), 0); err == nil {
			t.Fatalf("write through symlink %s escaped", p)
		}
	}
	if b, _ := os.ReadFile(outside); string(b) != "host secret" {
		t.Fatal("a symlink write reached outside the root")
	}
}

func TestAgentOnHostVersionMismatch(t *testing.T) {
	a, _ := agent.New(agent.Config{Root: t.TempDir()})
	defer a.Close()
	h, g := sandboxiotest.SocketPair(t)
	errc := make(chan error, 1)
	go func() { errc <- a.Serve(context.Background(), g) }()
	w, r := proto.NewWriter(h), proto.NewReader(h)
	w.Write(proto.TypeHello, 0, proto.Hello{Versions: []int{99}}, nil)
	f, err := r.Read()
	if err != nil || !strings.Contains(string(f.Header), `"agent"`) || strings.Contains(string(f.Header), `"ready":true`) {
		t.Fatalf("hello answer = %s %v", f.Header, err)
	}
	if err := <-errc; err == nil {
		t.Fatal("agent accepted a host with no common version")
	}
}

// Command sessions nobody attached to are capped (#14 item 15): beyond the
// cap a create is resource_exhausted; starting one frees its place.
func TestAgentOnHostPendingSessionsAreCapped(t *testing.T) {
	c, _ := startAgentWith(t, agent.Config{Root: t.TempDir(), MaxPending: 3})
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		if _, err := c.CreateProcess(ctx, proto.ProcessSpec{ID: fmt.Sprintf("p%d", i), Argv: []string{"true"}}); err != nil {
			t.Fatal(err)
		}
	}
	var pe *proto.Error
	if _, err := c.CreateProcess(ctx, proto.ProcessSpec{ID: "p3", Argv: []string{"true"}}); !errors.As(err, &pe) || pe.Code != proto.CodeResourceExhausted {
		t.Fatalf("fourth pending session = %v, want resource_exhausted", err)
	}
	// The same session again is a retry, not a new one.
	if _, err := c.CreateProcess(ctx, proto.ProcessSpec{ID: "p0", Argv: []string{"true"}}); err != nil {
		t.Fatalf("retry of a pending session = %v", err)
	}
	if _, err := c.StartProcess(ctx, "p0"); err != nil { // a client attached
		t.Fatal(err)
	}
	if _, err := c.CreateProcess(ctx, proto.ProcessSpec{ID: "p3", Argv: []string{"true"}}); err != nil {
		t.Fatalf("after one started: %v", err)
	}
}

// A host that hangs up while a long poll for output is in flight lets the
// agent serve the next connection at once: the poll is cancelled, not
// waited out (a copy's agent redials after a fork or snapshot).
func TestAgentOnHostHangUpCancelsLongPolls(t *testing.T) {
	a, err := agent.New(agent.Config{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	hostSide, agentSide := sandboxiotest.SocketPair(t)
	served := make(chan error, 1)
	go func() { served <- a.Serve(context.Background(), agentSide) }()
	ctx := context.Background()
	c, err := agentclient.Dial(ctx, hostSide)
	if err != nil {
		t.Fatal(err)
	}
	c.CreateProcess(ctx, proto.ProcessSpec{ID: "quiet", Argv: []string{"sleep", "60"}})
	c.StartProcess(ctx, "quiet")
	defer c.Signal(ctx, "quiet", "SIGKILL")
	go c.ReadOutput(ctx, "quiet", 0, 1<<20, 30*time.Second, "") // blocks: no output
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	c.Close()
	select {
	case <-served:
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("Serve returned %v after the hang-up", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve still waits for a long poll of a host that hung up")
	}
}

// A process whose reader is slow may exit with output still in its pipe
// while the window is full (its reader holds its place): that output waits
// for the reader, however long it is held back — the grace for background
// children that keep a pipe open counts only time spent waiting for the
// pipe (before, the pipe was closed a second after the exit and up to a
// pipe's worth of output vanished without a resync).
func TestAgentOnHostSlowReaderGetsOutputLeftInThePipe(t *testing.T) {
	c, _ := startAgentOnHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const size = 3 << 20 // a 2 MiB window nearly full, a read in hand, the rest in the pipe
	id := "slow-reader"
	if _, err := c.CreateProcess(ctx, proto.ProcessSpec{ID: id, Argv: []string{"head", "-c", fmt.Sprint(size), "/dev/urandom"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartProcessFor(ctx, proto.StartRequest{ID: id, Subscriber: "test"}); err != nil {
		t.Fatal(err)
	}
	// The process writes it all and exits at once; the reader stays away
	// for longer than the grace, holding its place.
	for range 3 {
		c.Hold(ctx, id, "test", 0)
		time.Sleep(time.Second)
	}
	r := drain(t, ctx, c, id, 0)
	if r.stdout.Len() != size || r.resyncs != 0 {
		t.Fatalf("slow reader got %d bytes of %d, %d resyncs", r.stdout.Len(), size, r.resyncs)
	}
}

// A background child that keeps the pipe open does not keep its parent's
// exit from being reported: after a second of waiting for the pipe, the
// output ends with what arrived.
func TestAgentOnHostBackgroundChildDoesNotHoldTheExit(t *testing.T) {
	c, _ := startAgentOnHost(t)
	start := time.Now()
	r := run(t, c, proto.ProcessSpec{ID: "background-child", Argv: []string{"sh", "-c", "sleep 30 & echo started"}})
	if took := time.Since(start); r.stdout.String() != "started\n" || exitCode(t, r) != 0 || took > 10*time.Second {
		t.Fatalf("output %q, exit %d after %s", r.stdout.String(), exitCode(t, r), took)
	}
}

// The output exited processes retain is bounded for the whole sandbox: the
// most recently exited keep a window of 1 MiB, older ones what is left of
// the budget, and the oldest none (a late reader gets a resync and
// the exit). Without the bound every remembered process holds its window in
// the sandbox's memory: a thousand noisy commands, gigabytes.
func TestAgentOnHostExitedOutputFitsItsBudget(t *testing.T) {
	c, _ := startAgentWith(t, agent.Config{Root: t.TempDir(), ExitedOutputBytes: 3 << 19})
	ctx := context.Background()
	ids := []string{"old", "mid", "new"}
	for _, id := range ids {
		if _, err := c.CreateProcess(ctx, proto.ProcessSpec{ID: id, Argv: []string{"head", "-c", "3145728", "/dev/zero"}}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.StartProcess(ctx, id); err != nil {
			t.Fatal(err)
		}
		for {
			p, err := c.GetProcess(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if p.State == proto.ProcExited {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	kept := map[string]int{}
	total := 0
	for _, id := range ids {
		r := drain(t, ctx, c, id, 0)
		if r.resyncs != 1 || exitCode(t, r) != 0 {
			t.Fatalf("%s: %d resyncs, exit %v", id, r.resyncs, r.exited)
		}
		kept[id] = r.stdout.Len()
		total += r.stdout.Len()
	}
	if kept["new"] < 1<<20 || kept["mid"] >= kept["new"] || kept["old"] != 0 {
		t.Fatalf("retained after exit: %v (total %d), want new ≥ 1 MiB, mid less, old none", kept, total)
	}
}
