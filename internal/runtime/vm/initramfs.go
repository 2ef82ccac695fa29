package vm

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// GuestModules are the kernel modules the guest needs, in load order: the
// virtio core, its MMIO transport (microvm has no PCI), the disk, the
// serial port the agent talks on, the entropy device and the network card.
var GuestModules = []string{
	"kernel/drivers/virtio/virtio_ring.ko",
	"kernel/drivers/virtio/virtio.ko",
	"kernel/drivers/virtio/virtio_mmio.ko",
	"kernel/drivers/block/virtio_blk.ko",
	"kernel/drivers/char/virtio_console.ko",
	"kernel/drivers/char/hw_random/virtio-rng.ko",
	"kernel/net/core/failover.ko",
	"kernel/drivers/net/net_failover.ko",
	"kernel/drivers/net/virtio_net.ko",
}

// BuildInitramfs writes a newc cpio archive holding the agent as /init and
// the guest modules under /modules with their load order. Modules missing
// from modDir are skipped (a kernel may have them built in).
func BuildInitramfs(w io.Writer, agentBin, modDir string) error {
	cw := &cpioWriter{w: w}
	agent, err := os.Open(agentBin)
	if err != nil {
		return fmt.Errorf("read agent: %w", err)
	}
	defer agent.Close()
	fi, err := agent.Stat()
	if err != nil {
		return err
	}
	cw.dir("modules")
	cw.stream("init", 0o100755, fi.Size(), agent)
	var order []string
	for _, m := range GuestModules {
		b, err := os.ReadFile(filepath.Join(modDir, m))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return err
		}
		name := filepath.Base(m)
		cw.file("modules/"+name, 0o644, b)
		order = append(order, name)
	}
	cw.file("modules/order", 0o644, []byte(strings.Join(order, "\n")+"\n"))
	cw.trailer()
	return cw.err
}

// cpioWriter writes the "newc" cpio format the kernel unpacks.
type cpioWriter struct {
	w   io.Writer
	ino int
	err error
}

func (c *cpioWriter) entry(name string, mode uint32, data []byte) {
	c.stream(name, mode, int64(len(data)), bytes.NewReader(data))
}

// stream writes one entry whose size bytes of content come from r.
func (c *cpioWriter) stream(name string, mode uint32, size int64, r io.Reader) {
	if c.err != nil {
		return
	}
	c.ino++
	var hdr bytes.Buffer
	fmt.Fprintf(&hdr, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, 1, 0, size, 0, 0, 0, 0, len(name)+1, 0)
	hdr.WriteString(name)
	hdr.WriteByte(0)
	for hdr.Len()%4 != 0 {
		hdr.WriteByte(0)
	}
	if _, c.err = c.w.Write(hdr.Bytes()); c.err != nil {
		return
	}
	var n int64
	if n, c.err = io.CopyN(c.w, r, size); c.err != nil {
		return
	}
	if pad := (4 - n%4) % 4; pad > 0 {
		_, c.err = c.w.Write(make([]byte, pad))
	}
}

func (c *cpioWriter) dir(name string)                         { c.entry(name, 0o040755, nil) }
func (c *cpioWriter) file(name string, perm uint32, b []byte) { c.entry(name, 0o100000|perm, b) }
func (c *cpioWriter) trailer()                                { c.entry("TRAILER!!!", 0, nil) }
