package slice

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/kvasir-ai/kvasir/engine/gguf"
)

// Cut writes a slice of f into dir: the experts of the given layers (nil:
// all) restricted to the given expert ids (nil: all), one file per expert
// (WriteExpert: temporary file, fsync, rename), then the manifest last
// (WriteManifest), so dir holds a manifest only once every file it lists is
// in place. dir is created if needed; it must be empty or already hold a
// slice (manifest.json), whose manifest is removed first and replaced at the
// end; expert files of the old slice that the new one does not list are
// left in place, unlisted. It returns the manifest written. Errors wrap
// ErrDir, those of FromGGUF, or are the file system's.
func Cut(f *gguf.File, layers, experts []int, dir string) (*Manifest, error) {
	s, err := FromGGUF(f, layers, experts)
	if err != nil {
		return nil, err
	}
	if err := prepareDir(dir); err != nil {
		return nil, err
	}
	var synced []int
	for _, h := range s.Holdings() {
		l, e := int(h.Layer), int(h.Expert)
		ly := s.layers[l]
		if err := WriteExpert(dir, l, e, ly.Gate.Expert[e], ly.Up.Expert[e], ly.Down.Expert[e]); err != nil {
			return nil, err
		}
		if !slices.Contains(synced, l) {
			synced = append(synced, l)
		}
	}
	for _, l := range synced {
		if err := SyncLayerDir(dir, l); err != nil {
			return nil, err
		}
	}
	if err := WriteManifest(dir, s.m); err != nil {
		return nil, err
	}
	// A directory cut before for other layers or experts keeps their
	// files; the manifest no longer lists them, so they are removed.
	keep := map[string]bool{}
	for _, h := range s.Holdings() {
		keep[filepath.FromSlash(ExpertFile(int(h.Layer), int(h.Expert)))] = true
	}
	if err := removeUnlisted(dir, keep); err != nil {
		return nil, fmt.Errorf("slice: written, but the previous cut's files could not all be removed: %w", err)
	}
	return s.m, nil
}

// removeUnlisted removes from the slice directory dir the expert files
// (Lnnn/Ennnn.bin, ExpertFile's names) that keep does not hold, and the
// layer folders left empty; other files are left alone.
func removeUnlisted(dir string, keep map[string]bool) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, ent := range ents {
		var l int
		if !ent.IsDir() {
			continue
		}
		if n, _ := fmt.Sscanf(ent.Name(), "L%03d", &l); n != 1 || ent.Name() != fmt.Sprintf("L%03d", l) {
			continue
		}
		files, err := os.ReadDir(filepath.Join(dir, ent.Name()))
		if err != nil {
			return err
		}
		left := len(files)
		for _, f := range files {
			var e int
			rel := filepath.Join(ent.Name(), f.Name())
			if n, _ := fmt.Sscanf(f.Name(), "E%04d.bin", &e); n != 1 || f.Name() != fmt.Sprintf("E%04d.bin", e) || keep[rel] {
				continue
			}
			if err := os.Remove(filepath.Join(dir, rel)); err != nil {
				return err
			}
			left--
		}
		if left == 0 {
			if err := os.Remove(filepath.Join(dir, ent.Name())); err != nil {
				return err
			}
		}
	}
	return syncDir(dir)
}

// ExpertPath returns the path of expert e of layer l's file in the slice
// directory dir (dir joined with ExpertFile(l, e)).
func ExpertPath(dir string, l, e int) string {
	return filepath.Join(dir, filepath.FromSlash(ExpertFile(l, e)))
}

// WriteExpert writes parts (the expert's gate, up and down bytes, in that
// order) as expert e of layer l of the slice in dir, atomically: to a
// temporary file ".E*.tmp*" in the layer folder (created if needed), fsync,
// then rename to ExpertPath(dir, l, e). The caller fsyncs the layer folder
// (SyncLayerDir) before publishing a manifest that lists the file. Errors
// are the file system's.
func WriteExpert(dir string, l, e int, parts ...[]byte) error {
	path := ExpertPath(dir, l, e)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return writeAtomic(path, parts...)
}

// SyncLayerDir fsyncs layer l's folder of the slice in dir, making the
// renames of WriteExpert durable.
func SyncLayerDir(dir string, l int) error {
	return syncDir(filepath.Dir(ExpertPath(dir, l, 0)))
}

// writeAtomic writes the concatenation of parts to path through a
// temporary file in the same folder, fsynced and renamed over path.
func writeAtomic(path string, parts ...[]byte) (err error) {
	if err := gguf.CheckOutPath(path); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	for _, p := range parts {
		if _, err = tmp.Write(p); err != nil {
			return err
		}
	}
	if err = tmp.Sync(); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// syncDir fsyncs a directory so that renames into it survive a crash.
// Platforms that cannot fsync a directory (errors other than an open
// failure) are tolerated.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	_ = d.Sync() // not supported everywhere (e.g. Windows); best effort
	return nil
}

// prepareDir creates dir or checks that it is empty or a slice directory,
// and removes an existing manifest.
func prepareDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	mp := filepath.Join(dir, ManifestName)
	if _, err := os.Stat(mp); err == nil {
		if err := os.Remove(mp); err != nil {
			return err
		}
		return syncDir(dir)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	if len(ents) > 0 {
		return fmt.Errorf("%w: %s holds %s", ErrDir, dir, ents[0].Name())
	}
	return nil
}
