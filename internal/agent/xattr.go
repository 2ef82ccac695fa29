package agent

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/agent/proto"
)

// A file's user-defined metadata lives in its extended attributes under
// proto.MetadataPrefix, as E2B's envd keeps it, so metadata set inside the
// sandbox with setfattr shows too.

// errNoXattrs is a file system that keeps no extended attributes.
var errNoXattrs = errors.New("this file system does not keep file metadata (extended attributes)")

// readMetadata reads the metadata of the file or directory at p (callers
// pass only those, so following a link is harmless; /proc/self/fd paths
// must be followed): nil when it has none or its file system keeps none.
func readMetadata(p string) map[string]string {
	// Most files have no extended attributes: a small first buffer, and the
	// value buffer only once a metadata name is found (listings call this
	// for every entry).
	buf := make([]byte, 256)
	n, err := unix.Listxattr(p, buf)
	if errors.Is(err, unix.ERANGE) {
		if n, err = unix.Listxattr(p, nil); err == nil {
			buf = make([]byte, n)
			n, err = unix.Listxattr(p, buf)
		}
	}
	if err != nil || n == 0 {
		return nil
	}
	var m map[string]string
	var val []byte
	for _, name := range strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00") {
		key, ok := strings.CutPrefix(name, proto.MetadataPrefix)
		if !ok || key == "" {
			continue
		}
		if val == nil {
			val = make([]byte, proto.MaxMetadataTotalLen)
		}
		vn, err := unix.Getxattr(p, name, val)
		if err != nil || !utf8.ValidString(key) || !utf8.Valid(val[:vn]) {
			continue // gone meanwhile, too long, or not text
		}
		if m == nil {
			m = map[string]string{}
		}
		m[key] = string(val[:vn])
	}
	return m
}

// writeMetadata sets m on the open file f (a new file: nothing to remove).
func writeMetadata(f *os.File, m map[string]string) error {
	for k, v := range m {
		err := unix.Fsetxattr(int(f.Fd()), proto.MetadataPrefix+k, []byte(v), 0)
		if errors.Is(err, unix.ENOTSUP) {
			return errNoXattrs
		}
		if err != nil {
			return fmt.Errorf("set metadata %q: %w", k, err)
		}
	}
	return nil
}

// rootMetadata reads metadata through an os.Root: the file is opened as a
// path only (no follow) and its attributes read through /proc/self/fd.
func rootMetadata(r *os.Root, name string) map[string]string {
	f, err := r.OpenFile(name, unix.O_PATH|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil
	}
	defer f.Close()
	return readMetadata(fmt.Sprintf("/proc/self/fd/%d", f.Fd()))
}
