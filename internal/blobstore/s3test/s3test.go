// Package s3test gives tests a real S3-compatible server: Versity's
// versitygw (built from the Go module proxy by scripts/install-deps) over a
// POSIX directory, on loopback, one per test binary. Each test gets a new
// bucket. Tests skip where versitygw is missing, and fail instead when
// SPACE_REQUIRE_S3=1 (CI).
package s3test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/spacesandbox/space/internal/ids"
)

// The root credentials of the test server.
const (
	AccessKey = "spacetest"
	SecretKey = "spacetest-secret-key"
)

// Server is the running test server.
type Server struct {
	Endpoint string // http://127.0.0.1:port
	Dir      string // the directory behind it: bucket/<object path>
	cmd      *exec.Cmd
}

var (
	once    sync.Once
	srv     *Server
	failure error
)

// SetEnv gives the test's own process the test server's credentials.
func SetEnv(t testing.TB) {
	for _, e := range Env() {
		k, v, _ := strings.Cut(e, "=")
		t.Setenv(k, v)
	}
}

// Env is the environment a process needs to reach the test server.
func Env() []string {
	return []string{"AWS_ACCESS_KEY_ID=" + AccessKey, "AWS_SECRET_ACCESS_KEY=" + SecretKey}
}

// Bucket makes a new bucket for t and returns the server and a
// --blob-store URL of it (with prefix "space").
func Bucket(t testing.TB) (*Server, string) {
	t.Helper()
	once.Do(func() { srv, failure = start() })
	if failure != nil {
		need(t)("S3: %v", failure)
	}
	name := "b" + strings.ToLower(strings.TrimPrefix(ids.New(ids.Sandbox), "sbx_"))[:20]
	c, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.MakeBucket(context.Background(), name, minio.MakeBucketOptions{}); err != nil {
		t.Fatalf("make bucket: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(filepath.Join(srv.Dir, name)) })
	return srv, fmt.Sprintf("s3://%s/space?endpoint=%s&region=us-east-1", name, srv.Endpoint)
}

// Client is an S3 client of the test server, for tests that look into or
// damage the bucket.
func (s *Server) Client() (*minio.Client, error) {
	return minio.New(strings.TrimPrefix(s.Endpoint, "http://"), &minio.Options{
		Creds: credentials.NewStaticV4(AccessKey, SecretKey, ""), Region: "us-east-1"})
}

// Stop stops the server (if one was started) and removes its directory.
func Stop() {
	if srv != nil && srv.cmd.Process != nil {
		srv.cmd.Process.Kill()
		srv.cmd.Wait()
		os.RemoveAll(filepath.Dir(srv.Dir))
		srv = nil
	}
}

func need(t testing.TB) func(string, ...any) {
	if os.Getenv("SPACE_REQUIRE_S3") == "1" {
		return t.Fatalf
	}
	return t.Skipf
}

func start() (*Server, error) {
	bin, err := exec.LookPath("versitygw")
	if err != nil {
		return nil, fmt.Errorf("no versitygw on PATH (scripts/install-deps builds it): %w", err)
	}
	root, err := os.MkdirTemp("", "space-s3-")
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(root, "data")
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(bin, "--access", AccessKey, "--secret", SecretKey, "--port", addr, "posix", dir)
	logf, err := os.Create(filepath.Join(root, "log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start versitygw: %w", err)
	}
	s := &Server{Endpoint: "http://" + addr, Dir: dir, cmd: cmd}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(s.Endpoint)
		if err == nil {
			resp.Body.Close()
			return s, nil
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			log, _ := os.ReadFile(filepath.Join(root, "log"))
			return nil, fmt.Errorf("versitygw did not answer: %v: %s", err, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
