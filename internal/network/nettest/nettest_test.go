//go:build linux

package nettest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// A slot another process holds is skipped; so is one this process holds
// already. The other process is a real one (a sleep holding the slot's
// locked file).
func TestClaimSkipsSlotsHeldElsewhere(t *testing.T) {
	Root(t)
	n := claim(t, 40)
	if again := claim(t, n); again == n {
		t.Fatalf("slot %d claimed twice in one process", n)
	}
	// A free slot, locked here and handed to another process.
	var f *os.File
	other := -1
	for i := 1; i < 64 && other < 0; i++ {
		o := (n + i) % 64
		lf, err := os.OpenFile(filepath.Join(slotDir, fmt.Sprintf("upstream-%d.lock", o)), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		if syscall.Flock(int(lf.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			lf.Close()
			continue
		}
		f, other = lf, o
	}
	if other < 0 {
		t.Fatal("no free slot to hand to another process")
	}
	hold := exec.Command("sleep", "30")
	hold.ExtraFiles = []*os.File{f}
	if err := hold.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close() // only the other process holds it now
	defer func() { hold.Process.Kill(); hold.Wait() }()
	if got := claim(t, other); got == other {
		t.Fatalf("slot %d claimed while another process holds it", other)
	}
	hold.Process.Kill()
	hold.Wait()
	if got := claim(t, other); got != other {
		t.Fatalf("slot %d, freed by its holder's end, not claimed (got %d)", other, got)
	}
}
