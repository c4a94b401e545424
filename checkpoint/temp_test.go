//go:build unix

package checkpoint

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"gorgonia.org/tensor"
)

// TestCleanTemps plays the temporary files of saves killed midway, of
// saves under way and of other hosts, and checks which CleanTemps and Save
// remove.
func TestCleanTemps(t *testing.T) {
	dir := t.TempDir()
	me := writerID()
	// A save under way in another process on this host: its writer lives.
	child := exec.Command("sleep", "30")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { child.Process.Kill(); child.Wait() })
	old := time.Now().Add(-2 * StaleTempAge)
	files := []struct {
		name string
		old  bool // last modified 2·StaleTempAge ago
	}{
		{".ckpt-epoch003.safetensors.tandem-tmp." + me + "." + strconv.Itoa(child.Process.Pid) + ".123456", false},      // 0: live writer
		{".ckpt-epoch004.safetensors.tandem-tmp." + me + "." + strconv.Itoa(os.Getpid()) + ".987", false},               // 1: this process
		{".ckpt-epoch004.safetensors.tandem-tmp.otherhost_4026531836." + strconv.Itoa(child.Process.Pid) + ".5", false}, // 2: another host, fresh
		{".ckpt-epoch002.safetensors.tandem-tmp.otherhost_4026531836.77.5", true},                                       // 3: another host, abandoned
		{".ckpt-epoch001.safetensors.tmp-2718281828", false},                                                            // 4: older version's, fresh
		{".ckpt-epoch000.safetensors.tmp-3141592653", true},                                                             // 5: older version's, abandoned
		{".notes.txt.tmp-1", true},             // 6: not ours
		{"ckpt-epoch001.safetensors", true},    // 7: a checkpoint
		{".ckpt.safetensors.tandem-tmp", true}, // 8: not a full temporary name
	}
	for _, f := range files {
		p := filepath.Join(dir, f.name)
		if err := os.WriteFile(p, []byte("partial"), 0o600); err != nil {
			t.Fatal(err)
		}
		if f.old {
			if err := os.Chtimes(p, old, old); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A folder with a temporary file's name is not touched.
	if err := os.Mkdir(filepath.Join(dir, ".x.safetensors.tmp-1"), 0o755); err != nil {
		t.Fatal(err)
	}
	left := func() []string {
		ents, _ := os.ReadDir(dir)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		return names
	}
	removed, err := CleanTemps(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(dir, files[3].name), filepath.Join(dir, files[5].name)}
	slices.Sort(removed)
	slices.Sort(want)
	if !slices.Equal(removed, want) {
		t.Errorf("removed %q, want the abandoned %q", removed, want)
	}
	for _, i := range []int{0, 1, 2, 4, 6, 7, 8} {
		if !slices.Contains(left(), files[i].name) {
			t.Errorf("%s was removed", files[i].name)
		}
	}

	// The writer is killed: its temporary file is removed at once, by
	// CleanTemps or by the next save into the folder.
	child.Process.Kill()
	child.Wait()
	x := []Named{{"x", tensor.New(tensor.WithShape(1), tensor.WithBacking([]float32{1}))}}
	if err := Save(filepath.Join(dir, "ckpt-epoch005.safetensors"), x, nil); err != nil {
		t.Fatal(err)
	}
	got := left()
	if slices.Contains(got, files[0].name) {
		t.Errorf("the temporary file of a killed writer survived a save: %q", got)
	}
	for _, i := range []int{1, 2, 4} {
		if !slices.Contains(got, files[i].name) {
			t.Errorf("%s was removed by a save", files[i].name)
		}
	}
	known := map[string]bool{".x.safetensors.tmp-1": true}
	for _, f := range files {
		known[f.name] = true
	}
	for _, n := range got {
		if IsTemp(n) && !known[n] {
			t.Errorf("the save left its own temporary file %s", n)
		}
	}
	if _, err := CleanTemps(filepath.Join(dir, "missing")); err == nil {
		t.Error("CleanTemps of a missing folder succeeded")
	}
}

// TestTempName checks that Save's temporary files carry the writer's
// identity and are recognised.
func TestTempName(t *testing.T) {
	dir := t.TempDir()
	f, err := os.CreateTemp(dir, tempPattern("model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	m := tempName.FindStringSubmatch(filepath.Base(f.Name()))
	if m == nil || m[1] != writerID() || m[2] != strconv.Itoa(os.Getpid()) || !IsTemp(filepath.Base(f.Name())) {
		t.Fatalf("temporary file %s: match %q, writer %s", f.Name(), m, writerID())
	}
	if IsTemp("model.safetensors") || IsTemp(".model.safetensors") {
		t.Error("a checkpoint's name is taken for a temporary file's")
	}
}
