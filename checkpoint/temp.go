package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// StaleTempAge is how long a temporary file of Save's may go unmodified
// before CleanTemps takes it for abandoned whoever wrote it. A save in
// progress writes its temporary file continuously and renames it away at
// once, so an hour without a write means the writer is gone.
const StaleTempAge = time.Hour

// tempMarker sits between the file's name and the writer's identity in a
// temporary file's name (see IsTemp).
const tempMarker = ".tandem-tmp."

var (
	tempName       = regexp.MustCompile(`^\..+\.tandem-tmp\.([A-Za-z0-9_-]+)\.([0-9]+)\.[0-9]+$`)
	legacyTempName = regexp.MustCompile(`^\..+\.safetensors\.tmp-[0-9]+$`)
)

// tempPattern is the os.CreateTemp pattern of Save's temporary file for a
// file called base.
func tempPattern(base string) string {
	return "." + base + tempMarker + writerID() + "." + strconv.Itoa(os.Getpid()) + ".*"
}

// writerID names this process's host and pid namespace, the scope in which
// its pid means something.
func writerID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	host = strings.Map(func(r rune) rune {
		if 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '-' {
			return r
		}
		return '-'
	}, host)
	if len(host) > 32 {
		host = host[:32]
	}
	// Containers may share a host name but not a pid namespace; the
	// namespace's inode number ("pid:[4026531836]") tells them apart.
	if ns, err := os.Readlink("/proc/self/ns/pid"); err == nil {
		if n, ok := strings.CutPrefix(ns, "pid:["); ok {
			if n, ok = strings.CutSuffix(n, "]"); ok {
				if _, err := strconv.ParseUint(n, 10, 64); err == nil {
					host += "_" + n
				}
			}
		}
	}
	return host
}

// IsTemp reports whether name (a file name without its folder) is one of
// Save's temporary files. Save writes the file <name> through a temporary
// file in the same folder named
//
//	.<name>.tandem-tmp.<host>.<pid>.<random>
//
// where <host> is the writer's host name (letters, digits and '-' only, at
// most 32) followed on Linux by '_' and its pid namespace's number, and
// <pid> is its process id. Versions before checksums named it
// .<name>.tmp-<random>; IsTemp recognises those when <name> ends in
// ".safetensors".
func IsTemp(name string) bool {
	return tempName.MatchString(name) || legacyTempName.MatchString(name)
}

// CleanTemps removes the temporary files that saves into dir left behind
// when their process died before renaming them, and returns their paths.
// A temporary file is removed when
//
//   - the process that wrote it ran on this host, in this pid namespace,
//     and no process with its pid exists any more; or
//   - it has not been modified for StaleTempAge (whoever wrote it: another
//     host sharing the folder, a reused pid, an older version's file).
//
// The temporary file of a save under way, here or on another host, is
// therefore left alone. Save calls CleanTemps on its folder before writing.
// Only Save's own temporary files are touched (see IsTemp); other files in
// dir never are.
func CleanTemps(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: cleaning temporary files: %w", err)
	}
	me := writerID()
	now := time.Now()
	var removed []string
	var errList []error
	for _, e := range ents {
		name := e.Name()
		if !e.Type().IsRegular() || !IsTemp(name) {
			continue
		}
		stale := false
		if m := tempName.FindStringSubmatch(name); m != nil && m[1] == me {
			if pid, err := strconv.Atoi(m[2]); err == nil && processGone(pid) {
				stale = true
			}
		}
		if !stale {
			info, err := e.Info()
			if err != nil {
				continue // gone meanwhile: renamed by its writer, or removed
			}
			stale = now.Sub(info.ModTime()) > StaleTempAge
		}
		if !stale {
			continue
		}
		path := filepath.Join(dir, name)
		switch err := os.Remove(path); {
		case err == nil:
			removed = append(removed, path)
		case !errors.Is(err, fs.ErrNotExist):
			errList = append(errList, err)
		}
	}
	if err := errors.Join(errList...); err != nil {
		return removed, fmt.Errorf("checkpoint: cleaning temporary files: %w", err)
	}
	return removed, nil
}
