// Package pgtest gives tests a real PostgreSQL: a throwaway cluster of
// Debian's PostgreSQL binaries in a temporary directory, on loopback, owned
// by the postgres user when the tests run as root (PostgreSQL refuses to
// run as root). Each test gets a new empty database in it. Set
// SPACE_TEST_POSTGRES to the URL of an existing server (a role that may
// create databases) to use that instead. Tests skip where PostgreSQL is
// missing, and fail instead when SPACE_REQUIRE_POSTGRES=1 (CI).
package pgtest

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/spacesandbox/space/internal/ids"
)

var (
	once    sync.Once
	server  string // admin URL (database postgres)
	cluster *exec.Cmd
	dir     string
	failure error
)

// Main runs a test binary's tests and stops the cluster they started:
// call it from TestMain as os.Exit(pgtest.Main(m)).
func Main(m interface{ Run() int }) int {
	code := m.Run()
	Stop()
	return code
}

// Stop stops the cluster (if one was started) and removes it.
func Stop() {
	if cluster != nil && cluster.Process != nil {
		cluster.Process.Signal(os.Interrupt) // fast shutdown
		done := make(chan struct{})
		go func() { cluster.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cluster.Process.Kill()
			<-done
		}
		cluster = nil
	}
	if dir != "" {
		os.RemoveAll(dir)
		dir = ""
	}
}

// URL returns the URL of a new, empty database for t, dropped when t ends.
func URL(t testing.TB) string {
	t.Helper()
	once.Do(func() { server, failure = start() })
	if failure != nil {
		need(t)("PostgreSQL: %v", failure)
	}
	name := "t_" + strings.ToLower(strings.TrimPrefix(ids.New(ids.Sandbox), "sbx_"))
	admin, err := sql.Open("pgx", server)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec(`CREATE DATABASE ` + name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		a, err := sql.Open("pgx", server)
		if err != nil {
			return
		}
		defer a.Close()
		a.Exec(`DROP DATABASE IF EXISTS ` + name + ` WITH (FORCE)`)
	})
	u, _ := url.Parse(server)
	u.Path = "/" + name
	return u.String()
}

func need(t testing.TB) func(string, ...any) {
	if os.Getenv("SPACE_REQUIRE_POSTGRES") == "1" {
		return t.Fatalf
	}
	return t.Skipf
}

// start starts the cluster, or takes SPACE_TEST_POSTGRES.
func start() (string, error) {
	if u := os.Getenv("SPACE_TEST_POSTGRES"); u != "" {
		return u, nil
	}
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		return "", fmt.Errorf("no /usr/lib/postgresql/*/bin/initdb (apt install postgresql)")
	}
	bin := filepath.Dir(bins[len(bins)-1])
	d, err := os.MkdirTemp("", "space-pg-")
	if err != nil {
		return "", err
	}
	dir = d
	var owner []string // the command prefix that runs as the cluster's owner
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return "", fmt.Errorf("running as root needs the postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(d, uid, gid); err != nil {
			return "", err
		}
		owner = []string{"runuser", "-u", "postgres", "--"}
	}
	run := func(args ...string) *exec.Cmd {
		a := append(append([]string{}, owner...), args...)
		return exec.Command(a[0], a[1:]...)
	}
	data := filepath.Join(d, "data")
	if out, err := run(filepath.Join(bin, "initdb"), "-D", data, "-U", "space", "--auth=trust", "-E", "UTF8", "--no-sync").CombinedOutput(); err != nil {
		return "", fmt.Errorf("initdb: %v: %s", err, out)
	}
	port, err := freePort()
	if err != nil {
		return "", err
	}
	cluster = run(filepath.Join(bin, "postgres"), "-D", data, "-k", d, "-h", "127.0.0.1", "-p", strconv.Itoa(port),
		"-c", "fsync=off", "-c", "max_connections=300", "-c", "log_min_messages=warning")
	logf, err := os.Create(filepath.Join(d, "log"))
	if err != nil {
		return "", err
	}
	cluster.Stdout, cluster.Stderr = logf, logf
	if err := cluster.Start(); err != nil {
		return "", fmt.Errorf("start postgres: %w", err)
	}
	u := fmt.Sprintf("postgres://space@127.0.0.1:%d/postgres?sslmode=disable", port)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		db, err := sql.Open("pgx", u)
		if err == nil {
			err = db.PingContext(ctx)
			db.Close()
		}
		if err == nil {
			return u, nil
		}
		select {
		case <-ctx.Done():
			log, _ := os.ReadFile(filepath.Join(d, "log"))
			return "", fmt.Errorf("postgres did not answer: %v: %s", err, log)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
