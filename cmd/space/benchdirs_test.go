package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A bench makes its bare directory locked for its lifetime, and first
// clears what a killed bench left: the process running from its directory
// ends, the mount in it goes, the directory goes. A live bench's directory
// (locked) is left alone. Needs root (a bind mount).
func TestNewBenchDirClearsWhatAKilledBenchLeft(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts")
	}
	rt := t.TempDir()
	stale := filepath.Join(rt, benchDirPrefix+"killed")
	live := filepath.Join(rt, benchDirPrefix+"live")
	for _, d := range []string{stale, live} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// What the killed bench left: a process whose command line names its
	// directory (as runsc's and QEMU's do) and a pin mounted in it.
	proc := exec.Command("sh", "-c", "while :; do sleep 0.05; done", filepath.Join(stale, "runsc"))
	if err := proc.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- proc.Wait() }()
	defer proc.Process.Kill()
	pin := filepath.Join(stale, "netns")
	for _, f := range []string{pin, filepath.Join(stale, "src")} {
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mount(filepath.Join(stale, "src"), pin, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(pin, unix.MNT_DETACH)
	// The live bench holds its lock.
	lock, err := os.Open(live)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}

	dir, err := newBenchDir(rt)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("the killed bench's process still runs")
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("the killed bench's directory is still there: %v", err)
	}
	if b, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(b), stale) {
		t.Fatal("the killed bench's pin is still mounted")
	}
	if _, err := os.Stat(live); err != nil {
		t.Fatalf("the live bench's directory went: %v", err)
	}
	// The new directory is locked: another bench would leave it alone.
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != unix.EWOULDBLOCK {
		t.Fatalf("lock of the new directory by another = %v, want EWOULDBLOCK", err)
	}
}
