package procfs

import "testing"

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
