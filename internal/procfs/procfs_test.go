package procfs

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

func TestParseMemInfo(t *testing.T) {
	m := ParseMemInfo([]byte("MemTotal:       24681332 kB\nMemAvailable:    1000 kB\nHugePages_Total:       4\nbroken line\nEmpty:\nBad: x kB\n"))
	want := map[string]uint64{"MemTotal": 24681332 << 10, "MemAvailable": 1000 << 10, "HugePages_Total": 4}
	if len(m) != len(want) {
		t.Fatalf("got %v", m)
	}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("%s = %d, want %d", k, m[k], v)
		}
	}
	if mem, err := MemInfo(); err != nil || mem["MemTotal"] == 0 {
		t.Fatalf("this machine's meminfo: %v %v", mem, err)
	}
}

// Stat tells a live process, a zombie (a child that exited, not yet
// reaped) and a process that no longer exists apart.
func TestStat(t *testing.T) {
	if p, err := Stat(os.Getpid()); err != nil || p.Ending() || p.State == 0 {
		t.Fatalf("this process: %+v %v", p, err)
	}
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		p, err := Stat(cmd.Process.Pid)
		if err == nil && p.Gone() && p.Ending() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("an exited, unreaped child: %+v %v", p, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	cmd.Wait()
	if _, err := Stat(cmd.Process.Pid); err == nil {
		t.Fatal("a reaped child still has a stat")
	}
}

// A SIGKILL not yet taken shows in the pending masks of /proc/<pid>/status
// (the process's own or its thread's); other signals do not count, and a
// live process has none.
func TestKillPending(t *testing.T) {
	status := func(sig, shd string) []byte {
		return []byte("Name:\tsleep\nState:\tS (sleeping)\nSigQ:\t1/95594\nSigPnd:\t" + sig + "\nShdPnd:\t" + shd + "\nSigBlk:\t0000000000000100\n")
	}
	for _, c := range []struct {
		sig, shd string
		want     bool
	}{
		{"0000000000000000", "0000000000000000", false},
		{"0000000000000000", "0000000000000100", true},
		{"0000000000000100", "0000000000000000", true},
		{"0000000000004000", "0000000000000002", false}, // SIGTERM, SIGINT
		{"0000000000000000", "not hex", false},
	} {
		if got := killPending(status(c.sig, c.shd)); got != c.want {
			t.Errorf("SigPnd %s ShdPnd %s: %v, want %v", c.sig, c.shd, got, c.want)
		}
	}
	if got, err := KillPending(os.Getpid()); err != nil || got {
		t.Fatalf("this process: %v %v", got, err)
	}
	if _, err := KillPending(1 << 30); err == nil {
		t.Fatal("no error for a process that does not exist")
	}
}
