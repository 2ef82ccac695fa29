package templates

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// TreeDigest hashes a directory tree into a template digest: for each entry,
// in lexical order, its relative path, type, permission and special bits,
// owner, group, and its content hash (files), link target (symlinks) or
// device number (devices). Timestamps do not count, so rebuilding the same
// content yields the same digest. It also returns the total file size.
func TreeDigest(ctx context.Context, root string) (string, int64, error) {
	h := sha256.New()
	var total int64
	buf := make([]byte, 1<<20)
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		var uid, gid uint32
		var rdev uint64
		if st != nil {
			uid, gid, rdev = st.Uid, st.Gid, st.Rdev
		}
		mode := fi.Mode()
		fmt.Fprintf(h, "%q %o %d %d ", rel, uint32(mode.Perm())|specialBits(mode), uid, gid)
		switch {
		case mode.IsRegular():
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			fh := sha256.New()
			n, err := io.CopyBuffer(fh, f, buf)
			f.Close()
			if err != nil {
				return err
			}
			total += n
			fmt.Fprintf(h, "f %d %s\n", n, hex.EncodeToString(fh.Sum(nil)))
		case mode.IsDir():
			fmt.Fprint(h, "d\n")
		case mode&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "l %q\n", target)
		case mode&fs.ModeDevice != 0:
			kind := "b"
			if mode&fs.ModeCharDevice != 0 {
				kind = "c"
			}
			fmt.Fprintf(h, "%s %d\n", kind, rdev)
		case mode&fs.ModeNamedPipe != 0:
			fmt.Fprint(h, "p\n")
		default:
			fmt.Fprint(h, "s\n") // sockets carry no content
		}
		return nil
	})
	if err != nil {
		return "", 0, err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), total, nil
}

func specialBits(m fs.FileMode) uint32 {
	var b uint32
	if m&fs.ModeSetuid != 0 {
		b |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		b |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		b |= 0o1000
	}
	return b
}
