package agent

import "testing"

// InitSystem decides what to mount from one read of the mount table: it
// must list the mount points this host has.
func TestMountPointsReadsTheMountTable(t *testing.T) {
	have := mountPoints()
	if !have["/"] || !have["/proc"] {
		t.Fatalf("mount points = %v, want / and /proc among them", have)
	}
	if have["/no/such/mount"] {
		t.Fatal("a path that is no mount point is listed")
	}
}
