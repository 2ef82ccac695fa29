//go:build linux

package vm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// VMM-level measurements that need no guest: QEMU's own start, its QMP, and
// saving and loading device state with RAM in a shared file. They run under
// KVM where /dev/kvm exists (even where a stock guest cannot boot under it,
// as on PVM hosts: the vCPUs never run here, -S), else under TCG.
//
//	go test -run XXX -bench VMM -benchtime 20x ./internal/runtime/vm

func vmmAccel(b *testing.B) string {
	if _, err := os.Stat("/dev/kvm"); err == nil {
		return "kvm"
	}
	return "tcg"
}

func startBare(b *testing.B, dir, accel string, incoming bool) (*exec.Cmd, *qmp) {
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		b.Skip("qemu-system-x86_64 not installed")
	}
	sock := filepath.Join(dir, "qmp.sock")
	os.Remove(sock)
	args := []string{"-M", "microvm,x-option-roms=off,pit=off,pic=off,rtc=on", "-accel", accel, "-m", "512M",
		"-object", "memory-backend-file,id=mem,size=512M,mem-path=" + filepath.Join(dir, "mem") + ",share=on",
		"-machine", "memory-backend=mem", "-nodefaults", "-no-user-config", "-nographic", "-S",
		"-device", "virtio-serial-device", "-device", "virtio-blk-device,drive=d",
		"-drive", "id=d,file=" + filepath.Join(dir, "disk.qcow2") + ",format=qcow2,if=none",
		"-qmp", "unix:" + sock + ",server=on,wait=off"}
	if incoming {
		args = append(args, "-incoming", "defer")
	}
	cmd := exec.Command(qemu, args...)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		q, err := dialQMP(ctx, sock)
		if err == nil {
			return cmd, q
		}
		if ctx.Err() != nil {
			cmd.Process.Kill()
			b.Fatal("no QMP")
		}
		time.Sleep(500 * time.Microsecond)
	}
}

func bareDir(b *testing.B) string {
	dir := b.TempDir()
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", filepath.Join(dir, "disk.qcow2"), "1G").CombinedOutput(); err != nil {
		b.Fatalf("%v %s", err, out)
	}
	return dir
}

func stopBare(cmd *exec.Cmd, q *qmp) {
	q.execute(context.Background(), "quit", nil)
	q.close()
	cmd.Wait()
}

// BenchmarkVMMStart: QEMU process start until QMP answers.
func BenchmarkVMMStart(b *testing.B) {
	accel := vmmAccel(b)
	dir := bareDir(b)
	b.ReportMetric(0, "ns/op")
	var total time.Duration
	for i := 0; i < b.N; i++ {
		start := time.Now()
		cmd, q := startBare(b, dir, accel, false)
		total += time.Since(start)
		stopBare(cmd, q)
	}
	b.ReportMetric(float64(total.Microseconds())/float64(b.N)/1000, "ms/start_"+accel)
}

// BenchmarkVMMStopCont: a QMP stop + cont round trip.
func BenchmarkVMMStopCont(b *testing.B) {
	accel := vmmAccel(b)
	cmd, q := startBare(b, bareDir(b), accel, false)
	defer stopBare(cmd, q)
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		q.execute(ctx, "stop", nil)
		q.execute(ctx, "cont", nil)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/stop+cont_"+accel)
}

// BenchmarkVMMSaveLoad: device state out to a file with RAM kept in the
// shared file (x-ignore-shared), then a new QEMU -incoming defer loading it.
func BenchmarkVMMSaveLoad(b *testing.B) {
	accel := vmmAccel(b)
	dir := bareDir(b)
	ctx := context.Background()
	var save, load time.Duration
	for i := 0; i < b.N; i++ {
		cmd, q := startBare(b, dir, accel, false)
		state := filepath.Join(dir, fmt.Sprintf("state-%d", i))
		t0 := time.Now()
		if err := q.run(ctx, ignoreShared, qmpStep{"migrate", map[string]any{"uri": "exec:cat > " + state}}); err != nil {
			b.Fatal(err)
		}
		if err := q.waitMigration(ctx); err != nil {
			b.Fatal(err)
		}
		save += time.Since(t0)
		stopBare(cmd, q)
		cmd, q = startBare(b, dir, accel, true)
		t0 = time.Now()
		if err := q.run(ctx, ignoreShared, qmpStep{"migrate-incoming", map[string]any{"uri": "exec:cat " + state}}); err != nil {
			b.Fatal(err)
		}
		if err := q.waitMigration(ctx); err != nil {
			b.Fatal(err)
		}
		load += time.Since(t0)
		stopBare(cmd, q)
	}
	b.ReportMetric(float64(save.Microseconds())/float64(b.N)/1000, "ms/save_"+accel)
	b.ReportMetric(float64(load.Microseconds())/float64(b.N)/1000, "ms/load_"+accel)
}
