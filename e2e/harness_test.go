package e2e

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/spacesandbox/space/client"
	"github.com/spacesandbox/space/internal/blobstore/s3test"
	"github.com/spacesandbox/space/internal/network"
	"github.com/spacesandbox/space/internal/network/nettest"
	"github.com/spacesandbox/space/internal/store/postgres/pgtest"
)

// upstreams numbers the test networks of real servers.
var upstreams atomic.Int32

// Binaries built once per test run.
var (
	spaceBin     string // production build
	spaceFakeBin string // test build with the FAKE runtime (spacefake tag)
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "space-e2e-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	spaceBin = filepath.Join(dir, "space")
	spaceFakeBin = filepath.Join(dir, "space-fake")
	for _, b := range []struct{ out, tags string }{{spaceBin, ""}, {spaceFakeBin, "spacefake"}} {
		// -trimpath: the build cache then serves the previous release's
		// unchanged packages to its build (TestUpgradeFromPreviousRelease).
		args := []string{"build", "-trimpath", "-o", b.out}
		if b.tags != "" {
			args = append(args, "-tags", b.tags)
		}
		if raceEnabled {
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, "../cmd/space")...)
		cmd.Stderr = os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build space:", err)
			os.Exit(1)
		}
	}
	agent := exec.Command("go", "build", "-o", filepath.Join(dir, "space-agent"), "../cmd/space-agent")
	agent.Env = append(os.Environ(), "CGO_ENABLED=0")
	agent.Stderr = os.Stderr
	if err := agent.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build space-agent:", err)
		os.Exit(1)
	}
	before := runscSandboxes()
	netBefore := sandboxNetworks()
	code := m.Run()
	pgtest.Stop()
	s3test.Stop()
	os.RemoveAll(dir)
	// Nor any sandbox network: namespaces, links, rule tables.
	for name := range sandboxNetworks() {
		if !netBefore[name] {
			fmt.Fprintf(os.Stderr, "e2e: leaked sandbox network object %s\n", name)
			code = 1
		}
	}
	// Tests must leave no sandbox behind on the host.
	for pid, cmd := range runscSandboxes() {
		if _, ok := before[pid]; !ok {
			fmt.Fprintf(os.Stderr, "e2e: leaked sandbox process (gVisor or QEMU) %d: %s\n", pid, cmd)
			code = 1
		}
	}
	os.Exit(code)
}

// productionBackends says the gvisor servers of this run keep their state
// in PostgreSQL (a throwaway cluster, pgtest) instead of SQLite:
// SPACE_E2E_BACKENDS=production, which CI sets; their suspend snapshots
// go to an S3 bucket (versitygw, s3test) as well. The vm and fake servers
// stay on the embedded defaults, so both are covered end to end.
func productionBackends() bool { return os.Getenv("SPACE_E2E_BACKENDS") == "production" }

// productionEnv is the environment that puts a server on a new PostgreSQL
// database and a new S3 bucket (and gives it the bucket's credentials).
func productionEnv(t *testing.T) []string {
	_, bucket := s3test.Bucket(t)
	return append(s3test.Env(), "SPACE_STORE="+pgtest.URL(t), "SPACE_BLOB_STORE="+bucket)
}

// flagValue returns the value of flag name in args ("" when absent).
func flagValue(args []string, name string) string {
	for i, a := range args {
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
	}
	return ""
}

// server is one `space serve` process.
type server struct {
	t       *testing.T
	bin     string
	dataDir string
	apiAddr string
	dpAddr  string
	ecwAddr string // the E2B-compatible layer
	env     []string
	args    []string
	token   string
	// template is what createRunning creates sandboxes from ("" = default).
	template string
	// opWait is how long waitOp waits for an operation (default a minute).
	opWait time.Duration
	// up is the "internet" the server's sandboxes reach (real runtimes):
	// a network namespace this test made; no test packet leaves the host.
	up *nettest.Upstream

	mu   sync.Mutex // guards cmd and done
	cmd  *exec.Cmd
	done chan struct{}

	logMu sync.Mutex // guards logs
	logs  bytes.Buffer
}

type serverOpts struct {
	bin      string   // default spaceFakeBin
	args     []string // extra flags (default: --runtime fake)
	env      []string // extra environment
	dataDir  string   // default: a new temporary directory
	template string   // template createRunning uses (default: the server's)
	token    string   // the API token (default: the one the server made in its data directory)
}

// startServer starts `space serve` and waits until it answers /healthz.
func startServer(t *testing.T, o serverOpts) *server {
	t.Helper()
	if o.bin == "" {
		o.bin = spaceFakeBin
	}
	if o.args == nil && o.bin == spaceFakeBin {
		o.args = []string{"--runtime", "fake"}
	}
	if o.dataDir == "" {
		o.dataDir = t.TempDir()
	}
	// Port 0: the server binds free ports itself and logs them, so no other
	// process can take a port between picking and binding it. A restart
	// reuses the ports learned here (clients keep their URLs).
	s := &server{t: t, bin: o.bin, dataDir: o.dataDir, apiAddr: "127.0.0.1:0", dpAddr: "127.0.0.1:0", ecwAddr: "127.0.0.1:0", env: o.env, args: o.args, template: o.template}
	if o.bin != spaceFakeBin && !slices.Contains(o.args, "--sandbox-network") {
		// Every real server's sandboxes get their own range, and their
		// uplink leads into a namespace of this test, never the real network.
		s.up = nettest.NewUpstream(t, int(upstreams.Add(1))%48) // 48…63 are the unit tests'
		rng := s.up.SandboxRange()
		t.Cleanup(func() { network.Teardown(rng) }) // runs after the server stopped
		s.args = append(slices.Clone(s.args), "--sandbox-network", rng.String(),
			"--egress-uplink", s.up.Uplink, "--egress-gateway", s.up.Gateway.String(), "--egress-dns", s.up.DNS)
	}
	if o.bin == spaceBin && productionBackends() && flagValue(s.args, "--runtime") == "gvisor" && !slices.ContainsFunc(s.env, func(e string) bool { return strings.HasPrefix(e, "SPACE_STORE=") }) {
		// The gvisor suites run on the production backends in CI; the
		// environment reaches the CLI too (token, template gc).
		s.env = append(slices.Clone(s.env), productionEnv(t)...)
	}
	s.start()
	t.Cleanup(s.stop)
	if o.token != "" {
		s.token = o.token
		return s
	}
	b, err := os.ReadFile(filepath.Join(s.dataDir, "api-token"))
	if err != nil {
		t.Fatalf("read api-token: %v", err)
	}
	s.token = strings.TrimSpace(string(b))
	return s
}

func (s *server) start() {
	s.t.Helper()
	// A restart binds the ports the first start learned; a port a client's
	// outgoing connection holds for a moment is retried, never given up.
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := s.startOnce(deadline)
		if err == nil {
			return
		}
		if !strings.Contains(err.Error(), "address already in use") || time.Now().After(deadline) {
			s.t.Fatal(err)
		}
		s.logMu.Lock()
		s.logs.Reset()
		s.logMu.Unlock()
		time.Sleep(200 * time.Millisecond)
	}
}

// startOnce starts the process and waits for its "serving" line and a
// healthy /healthz.
func (s *server) startOnce(deadline time.Time) error {
	args := append([]string{"serve", "--data-dir", s.dataDir, "--api-addr", s.apiAddr, "--data-plane-addr", s.dpAddr, "--ecw-addr", s.ecwAddr, "--log-format", "json", "--shutdown-grace", "5s"}, s.args...)
	cmd := exec.Command(s.bin, args...)
	cmd.Env = append(os.Environ(), s.env...)
	lw := &lockedWriter{w: &s.logs, mu: &s.logMu}
	cmd.Stdout, cmd.Stderr = lw, lw
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	// Only the first start learns addresses; a restart already has them
	// (and must not write fields other goroutines read).
	learned := !strings.HasSuffix(s.apiAddr, ":0")
	for {
		if !learned {
			learned = s.learnAddrs()
		}
		if learned {
			resp, err := http.Get(s.url("/healthz"))
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					return nil
				}
			}
		}
		select {
		case <-done:
			s.mu.Lock()
			s.cmd = nil
			s.mu.Unlock()
			return fmt.Errorf("space serve exited at start:\n%s", s.log())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("space serve did not become healthy:\n%s", s.log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// learnAddrs reads the bound addresses from the server's "serving" log line.
func (s *server) learnAddrs() bool {
	for _, line := range strings.Split(s.log(), "\n") {
		var e struct {
			Msg  string `json:"msg"`
			API  string `json:"api_addr"`
			Data string `json:"data_plane_addr"`
			ECW  string `json:"ecw_addr"`
		}
		if json.Unmarshal([]byte(line), &e) != nil || e.Msg != "serving" {
			continue
		}
		s.apiAddr, s.dpAddr, s.ecwAddr = e.API, e.Data, e.ECW
		return true
	}
	return false
}

func (s *server) log() string {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	return s.logs.String()
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// pid is the running server's process id (0 when it is stopped).
func (s *server) pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// kill sends SIGKILL and waits for the process to be gone.
func (s *server) kill() {
	s.signal(syscall.SIGKILL)
}

func (s *server) signal(sig syscall.Signal) {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		s.t.Fatalf("space serve did not exit on %v", sig)
	}
	s.mu.Lock()
	s.cmd = nil
	s.mu.Unlock()
}

func (s *server) stop() {
	s.signal(syscall.SIGTERM)
	killAgents(s.dataDir)
	if s.t.Failed() {
		s.t.Logf("server log:\n%s", s.log())
	}
}

func (s *server) url(path string) string { return "http://" + s.apiAddr + path }

func (s *server) client() *client.Client {
	c, err := client.New("http://"+s.apiAddr, s.token)
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}

// reply is a raw HTTP answer.
type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
}

// errorCode returns the code of an error envelope ("" if none).
func (r reply) errorCode() string {
	var env struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	json.Unmarshal(r.body, &env)
	return env.Error.Code
}

// do sends a raw request. headers are "Name: value" strings; a token of ""
// sends no Authorization header.
func (s *server) do(method, path, token string, body []byte, headers ...string) reply {
	s.t.Helper()
	return s.doAt(s.apiAddr, method, path, token, body, headers...)
}

// doAt is do against another of the server's listeners.
func (s *server) doAt(addr, method, path, token string, body []byte, headers ...string) reply {
	s.t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(context.Background(), method, "http://"+addr+path, rd)
	if err != nil {
		s.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ":")
		if strings.EqualFold(strings.TrimSpace(k), "Host") {
			req.Host = strings.TrimSpace(v)
			continue
		}
		req.Header.Set(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
}

func (s *server) waitOp(id string) *client.Operation {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cmp.Or(s.opWait, time.Minute))
	defer cancel()
	op, err := s.client().WaitOperation(ctx, id)
	if err != nil {
		s.t.Fatalf("wait %s: %v", id, err)
	}
	return op
}

// createRunning creates a sandbox and waits for it to run.
func (s *server) createRunning() string {
	s.t.Helper()
	out, _, err := s.client().CreateSandbox(context.Background(), client.CreateSandboxRequest{Template: s.template}, "")
	if err != nil {
		s.t.Fatal(err)
	}
	if op := s.waitOp(out.Operation.ID); op.State != "succeeded" {
		s.t.Fatalf("create failed: %+v", op.Error)
	}
	return out.Sandbox.ID
}

// runCLI runs the space CLI against s and returns stdout, stderr and the
// exit code.
func (s *server) runCLI(args ...string) (string, string, int) {
	s.t.Helper()
	return s.runCLIWith(s.bin, args...)
}

func (s *server) runCLIWith(bin string, args ...string) (string, string, int) {
	s.t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(append(os.Environ(), s.env...), "SPACE_API_URL=http://"+s.apiAddr, "SPACE_API_TOKEN="+s.token, "SPACE_DATA_DIR="+s.dataDir)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		s.t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

// runscSandboxes lists the sandbox processes (runsc sandboxes and SPACE's
// QEMUs) on the host.
func runscSandboxes() map[int]string {
	out := map[int]string{}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, _ := os.ReadFile(p)
		if bytes.HasPrefix(b, []byte("runsc-sandbox")) || (bytes.Contains(b, []byte("qemu-system")) && bytes.Contains(b, []byte("space-sbx_"))) {
			var pid int
			fmt.Sscan(filepath.Base(filepath.Dir(p)), &pid)
			out[pid] = strings.ReplaceAll(string(b), "\x00", " ")
		}
	}
	return out
}

// sandboxNetworks lists the host's sandbox network objects: namespaces
// (space-*), links of sandbox ranges (s<tag>x<n>) and nftables tables
// (space_*).
func sandboxNetworks() map[string]bool {
	out := map[string]bool{}
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "space-") {
			out["netns "+e.Name()] = true
		}
	}
	links, _ := exec.Command("ip", "-o", "link", "show").Output()
	for _, l := range strings.Split(string(links), "\n") {
		if f := strings.Fields(l); len(f) > 1 {
			name := strings.TrimSuffix(strings.SplitN(f[1], "@", 2)[0], ":")
			if len(name) >= 7 && name[0] == 's' && name[5] == 'x' && strings.Trim(name[6:], "0123456789t") == "" {
				out["link "+name] = true
			}
		}
	}
	if c, err := nftables.New(); err == nil {
		tables, _ := c.ListTablesOfFamily(nftables.TableFamilyINet)
		for _, t := range tables {
			if strings.HasPrefix(t.Name, "space_") {
				out["nft table "+t.Name] = true
			}
		}
	}
	return out
}
