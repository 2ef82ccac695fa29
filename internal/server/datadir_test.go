package server

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/spacesandbox/space/internal/procfs"
)

func TestLockDataDirRefusesWhileItsOwnerLives(t *testing.T) {
	dir := t.TempDir()
	held, err := LockDataDir(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	_, err = LockDataDir(context.Background(), dir)
	if !errors.Is(err, ErrDataDirInUse) {
		t.Fatalf("second lock: %v, want ErrDataDirInUse", err)
	}
	if want := "process " + strconv.Itoa(os.Getpid()); !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not name the owner (%s)", err, want)
	}
	held.Release()
	again, err := LockDataDir(context.Background(), dir)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	again.Release()
}

// A server SIGKILLed while it starts a child leaves its lock with that child
// until the child's exec: a real child process holding the lock's
// descriptor stands in for it, and the recorded owner is a process that
// has ended.
func TestLockDataDirWaitsForALockAnEndedOwnerLeftToAChild(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	ended := exec.Command("true")
	if err := ended.Run(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(strconv.Itoa(ended.Process.Pid)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	child := exec.Command("sleep", "0.5")
	child.ExtraFiles = []*os.File{f}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close() // only the child holds the lock now
	exited := make(chan struct{})
	go func() { child.Wait(); close(exited) }()

	l, err := LockDataDir(context.Background(), dir)
	if err != nil {
		t.Fatalf("lock left to a child by an ended owner: %v", err)
	}
	defer l.Release()
	if st, err := procfs.Stat(child.Process.Pid); err == nil && !st.Ending() {
		t.Fatal("took the lock while the child still held it")
	}
	<-exited
	if b, _ := os.ReadFile(p); string(b) != strconv.Itoa(os.Getpid())+"\n" {
		t.Fatalf("lock file says %q, want this process", b)
	}
}
