package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/tandemml/tandem/data"
)

// mainEnv makes the test binary the elastic command: the demo starts its
// members by running its own executable, which in a test is this binary.
const mainEnv = "TANDEM_ELASTIC_EXAMPLE_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(mainEnv) == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// writeFakeFashion writes a small look-alike of Fashion-MNIST into dir:
// noise with a bright horizontal bar whose row is the class.
func writeFakeFashion(t *testing.T, dir string, nTrain, nTest int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(3, 5))
	write := func(name string, magic uint32, dims []int, payload []byte) {
		var b bytes.Buffer
		binary.Write(&b, binary.BigEndian, magic)
		for _, d := range dims {
			binary.Write(&b, binary.BigEndian, uint32(d))
		}
		b.Write(payload)
		if err := os.WriteFile(filepath.Join(dir, name), b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	split := func(prefix string, n int) {
		px, lab := make([]byte, n*784), make([]byte, n)
		for i := range n {
			c := rng.IntN(10)
			lab[i] = byte(c)
			img := px[i*784 : (i+1)*784]
			for j := range img {
				img[j] = byte(rng.IntN(80))
			}
			for r := 2 + 2*c; r < 4+2*c; r++ {
				for col := 4; col < 24; col++ {
					img[r*28+col] = byte(180 + rng.IntN(70))
				}
			}
		}
		write(prefix+"-images-idx3-ubyte", data.ImagesMagic, []int{n, 28, 28}, px)
		write(prefix+"-labels-idx1-ubyte", data.LabelsMagic, []int{n}, lab)
	}
	split("train", nTrain)
	split("t10k", nTest)
}

// TestDemoKillAndAdd plays the README's story on a small data set: three
// members, one killed with SIGKILL mid-run and a fourth started later; the
// job must finish with the same weights on every member, the newcomer
// healed from a live one.
func TestDemoKillAndAdd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts member processes")
	}
	dir := t.TempDir()
	writeFakeFashion(t, dir, 960, 200)
	t.Setenv(mainEnv, "1")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	err := run(ctx, []string{"-demo", "-data", dir, "-epochs", "3", "-batch", "16", "-every", "0.05",
		"-step-delay", "15ms", "-lr", "0.02",
		// A narrow CNN: the test runs under the race detector too.
		"-channels1", "2", "-channels2", "4", "-hidden", "16"}, &out, &errOut)
	if err != nil {
		t.Fatalf("demo: %v\n%s\n%s", err, out.String(), errOut.String())
	}
	s := out.String()
	// Round numbers vary: a member that starts late joins at the first
	// step boundary, and on a loaded machine a slow member can be taken
	// for lost and the round re-formed. The story's events must be there.
	for _, want := range []string{
		`killed member b with SIGKILL`,
		`\] round \d+: 2 members \((a c|c a)\)`,
		`started a new member d`,
		`\[d\] round \d+: 3 members .*healed from`,
		`identical weights on all: true`,
		`test accuracy`,
	} {
		if !regexp.MustCompile(want).MatchString(s) {
			t.Errorf("the demo's output lacks %q:\n%s", want, s)
		}
	}
}
