// Package durable makes files survive a crash before they are relied on.
package durable

import (
	"io/fs"
	"os"
	"path/filepath"
)

// SyncTree fsyncs every file and directory under root (symbolic links
// aside), so a tree written there can be renamed into place.
func SyncTree(root string) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.Type()&fs.ModeSymlink != 0 {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		return f.Sync()
	})
}
