//go:build linux

package nettest

import (
	"os"
	"os/exec"
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
	other, f, err := lockSlot(n + 1)
	if err != nil {
		t.Fatal(err)
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
