package membership

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"quill/internal/cluster/credentials"
)

// IDFile is the file in the data directory that holds the node's ID.
const IDFile = "node-id"

// LoadID returns the node ID kept in dataDir/IDFile, creating it with a
// fresh random ID at the first start. The file is written to a temporary
// name, synced, renamed into place and its directory synced, so a crash
// leaves either no ID or the whole ID, never a torn one; an ID, once read,
// is the node's for the life of the data directory. A file that holds
// anything but an ID is an error, never replaced: replacing it would make
// the node another node.
func LoadID(dataDir string) (id string, created bool, err error) {
	path := filepath.Join(dataDir, IDFile)
	b, err := os.ReadFile(path)
	if err == nil {
		id := strings.TrimSpace(string(b))
		if !credentials.ValidNodeID(id) {
			return "", false, fmt.Errorf("membership: %s does not hold a node ID (%d bytes)", path, len(b))
		}
		return id, false, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", false, fmt.Errorf("membership: reading the node ID: %w", err)
	}
	id = credentials.NewNodeID()
	if err := writeAtomic(path, []byte(id+"\n")); err != nil {
		return "", false, fmt.Errorf("membership: writing the node ID: %w", err)
	}
	return id, true, nil
}

func writeAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after the rename
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
