package checkpoint

import (
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gorgonia.org/tensor"
)

// TestNewestValid damages the newest checkpoints of a folder in the ways a
// crash or a bad disk does and checks that NewestValid falls back to the
// newest intact one, saying what it skipped and why.
func TestNewestValid(t *testing.T) {
	dir := t.TempDir()
	var paths []string // newest first
	for e := 4; e >= 1; e-- {
		p := filepath.Join(dir, "ckpt-"+string(rune('0'+e))+".safetensors")
		x := []Named{{"w", tensor.New(tensor.WithShape(64), tensor.WithBacking(make([]float32, 64)))}}
		x[0].Tensor.Float32s()[0] = float32(e)
		if err := Save(p, x, map[string]string{"epoch": string(rune('0' + e))}); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	// 4: truncated (a copy cut short); 3: a data byte flipped; 2: intact.
	data4, _ := os.ReadFile(paths[0])
	if err := os.WriteFile(paths[0], data4[:len(data4)-100], 0o644); err != nil {
		t.Fatal(err)
	}
	data3, _ := os.ReadFile(paths[1])
	data3[len(data3)-1] ^= 0x10
	if err := os.WriteFile(paths[1], data3, 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "ckpt-9.safetensors") // listed, then gone
	found, skipped, err := NewestValid(append([]string{missing}, paths...))
	if err != nil {
		t.Fatal(err)
	}
	if found.Path != paths[2] || found.File.Metadata["epoch"] != "2" || len(found.Data) == 0 {
		t.Fatalf("found %s (metadata %v), want %s", found.Path, found.File.Metadata, paths[2])
	}
	if len(skipped) != 3 || skipped[0].Path != missing || skipped[1].Path != paths[0] || skipped[2].Path != paths[1] {
		t.Fatalf("skipped %v", skipped)
	}
	if !errors.Is(skipped[0].Err, fs.ErrNotExist) {
		t.Errorf("missing file: %v", skipped[0].Err)
	}
	if !errors.Is(skipped[1].Err, ErrFormat) || !strings.Contains(skipped[1].Err.Error(), "exceeds") && !strings.Contains(skipped[1].Err.Error(), "past the end") {
		t.Errorf("truncated file: %v, want ErrFormat saying the data is short", skipped[1].Err)
	}
	if !errors.Is(skipped[2].Err, ErrCorrupt) {
		t.Errorf("flipped byte: %v, want ErrCorrupt", skipped[2].Err)
	}

	// Nothing intact: fs.ErrNotExist, with every file's reason.
	_, skipped, err = NewestValid(paths[:2])
	if !errors.Is(err, fs.ErrNotExist) || len(skipped) != 2 {
		t.Errorf("no intact file: %v, skipped %v", err, skipped)
	}
	if _, _, err := NewestValid(nil); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("no files: %v", err)
	}
}

func TestCheckFinite(t *testing.T) {
	ok := []Named{
		{"w", tensor.New(tensor.WithShape(3), tensor.WithBacking([]float32{1, -2, 3}))},
		{"n", tensor.New(tensor.WithShape(2), tensor.WithBacking([]int64{1, 2}))},
		{"s", tensor.New(tensor.WithShape(), tensor.WithBacking([]float64{0.5}))},
	}
	if err := CheckFinite(ok); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		v    float64
		want string
	}{{math.NaN(), "NaN"}, {math.Inf(1), "+Inf"}, {math.Inf(-1), "-Inf"}} {
		bad := append([]Named(nil), ok...)
		bad = append(bad, Named{"optimizer.state.0.momentum_buffer", tensor.New(tensor.WithShape(2, 2), tensor.WithBacking([]float64{0, c.v, c.v, 1}))})
		err := CheckFinite(bad)
		if !errors.Is(err, ErrNonFinite) {
			t.Fatalf("%v: %v, want ErrNonFinite", c.v, err)
		}
		for _, w := range []string{"optimizer.state.0.momentum_buffer", c.want, "element 1", "2 non-finite"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q lacks %q", err, w)
			}
		}
	}
	scalar := []Named{{"s", tensor.New(tensor.WithShape(), tensor.WithBacking([]float32{float32(math.Inf(1))}))}}
	if err := CheckFinite(scalar); !errors.Is(err, ErrNonFinite) {
		t.Errorf("infinite scalar: %v", err)
	}
}
