package netns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tandemml/tandem/internal/errs"
)

// stateDir holds one record per test process that made a net (a file named
// by its pid holding its start time) and the lock that serializes setup
// between processes.
func stateDir() string {
	if fi, err := os.Stat("/run"); err == nil && fi.IsDir() {
		return "/run/tandem-netns"
	}
	return filepath.Join(os.TempDir(), "tandem-netns")
}

// lockState takes the lock that serializes setup (sweeping, picking names
// and subnets) between test processes, waiting at most lockWait.
func lockState() (unlock func(), err error) {
	dir := stateDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("the state directory: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("the state lock: %w", err)
	}
	deadline := time.Now().Add(lockWait)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", f.Name(), err)
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w: another test process held it for %v", f.Name(), errs.Timeout, lockWait)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

// startTime returns process pid's start time (in clock ticks since boot),
// which tells a live process from a later one that reuses its pid.
func startTime(pid int) (string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", err
	}
	// The command name, field 2, is in parentheses and may hold spaces.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); the start time is field 22.
	if len(f) < 20 {
		return "", fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	return f[19], nil
}

// writeRecord records that process pid makes nets here.
func writeRecord(pid int) error {
	st, err := startTime(pid)
	if err != nil {
		return fmt.Errorf("this process's start time: %w", err)
	}
	p := filepath.Join(stateDir(), strconv.Itoa(pid))
	if b, err := os.ReadFile(p); err == nil && string(b) == st {
		return nil
	}
	if err := os.WriteFile(p, []byte(st), 0o644); err != nil {
		return fmt.Errorf("the process record: %w", err)
	}
	return nil
}

// removeRecord removes process pid's record.
func removeRecord(pid int) {
	os.Remove(filepath.Join(stateDir(), strconv.Itoa(pid)))
}

// alive reports whether the process recorded with start time st still runs.
func alive(pid int, st string) bool {
	now, err := startTime(pid)
	return err == nil && now == st
}

// sweep removes the namespaces and interfaces of every recorded process
// (other than self) that has died, killing what still runs in those
// namespaces, and then its record. Failures are left for a later sweep.
func sweep(ip string, self int) {
	dir := stateDir()
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self || pid <= 0 {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil || alive(pid, string(b)) {
			continue
		}
		if removeOwned(ip, pid) == nil {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

// owned returns the namespaces and root-namespace interfaces named as
// process pid's.
func owned(ip string, pid int) (nss, links []string, err error) {
	all, err := listNamespaces(ip)
	if err != nil {
		return nil, nil, err
	}
	nsp := nsPrefix + strconv.Itoa(pid) + "-"
	for _, name := range all {
		if strings.HasPrefix(name, nsp) {
			nss = append(nss, name)
		}
	}
	if all, err = listLinks(ip); err != nil {
		return nil, nil, err
	}
	ifp := ifPrefix + strconv.Itoa(pid) + "_"
	for _, name := range all {
		if strings.HasPrefix(name, ifp) {
			links = append(links, name)
		}
	}
	return nss, links, nil
}

// removeOwned removes every namespace and root-namespace interface named as
// process pid's, killing the processes in those namespaces first.
func removeOwned(ip string, pid int) error {
	nss, links, err := owned(ip, pid)
	if err != nil {
		return err
	}
	var failed []string
	for _, name := range nss {
		killIn(ip, name)
		if out, err := run(ip, "netns", "del", name); err != nil {
			failed = append(failed, name+": "+out)
		}
	}
	for _, name := range links {
		if out, err := run(ip, "link", "del", name); err != nil && linkExists(ip, name) {
			failed = append(failed, name+": "+out)
		}
	}
	if failed != nil {
		return fmt.Errorf("could not remove %s", strings.Join(failed, "; "))
	}
	return nil
}

// killIn kills, with SIGKILL, every process in namespace name.
func killIn(ip, name string) {
	out, err := run(ip, "netns", "pids", name)
	if err != nil {
		return
	}
	for _, f := range strings.Fields(out) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
