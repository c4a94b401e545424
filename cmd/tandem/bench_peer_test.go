package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	tblas "github.com/tandemml/tandem/internal/blas"
)

// fakeBLASTree lays out Debian's arrangement under a temporary directory:
// lib/libblas.so.3 -> etc/alternatives/libblas.so.3-x86_64-linux-gnu ->
// lib/<dir>/libblas.so.3, a real file. It returns the probe of that tree.
func fakeBLASTree(t *testing.T, dir string) blasProbe {
	t.Helper()
	root := t.TempDir()
	target := filepath.Join(root, "lib", dir, "libblas.so.3")
	alt := filepath.Join(root, "etc", "alternatives", "libblas.so.3-x86_64-linux-gnu")
	lib := filepath.Join(root, "lib", "libblas.so.3")
	for _, d := range []string{filepath.Dir(target), filepath.Dir(alt)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(target, []byte("ELF"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, alt); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(alt, lib); err != nil {
		t.Fatal(err)
	}
	return blasProbe{lib: lib, resolve: filepath.EvalSymlinks, readlink: os.Readlink}
}

func TestClassifyBLAS(t *testing.T) {
	for path, want := range map[string]string{
		"/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3": "openblas",
		"/usr/lib/x86_64-linux-gnu/openblas-openmp/libblas.so.3":  "openblas",
		"/usr/lib/x86_64-linux-gnu/blas/libblas.so.3.11.0":        "reference",
		"/usr/lib/x86_64-linux-gnu/blis-pthread/libblas.so.3":     "blis",
		"/usr/lib/x86_64-linux-gnu/atlas/libblas.so.3":            "atlas",
		"/opt/intel/mkl/lib/libmkl_rt.so":                         "mkl",
		"/usr/lib/x86_64-linux-gnu/libblas.so.3":                  "unknown",
	} {
		if got := classifyBLAS(path); got != want {
			t.Errorf("classifyBLAS(%q) = %q, want %q", path, got, want)
		}
	}
}

func TestBLASProbeFollowsTheAlternativesLink(t *testing.T) {
	for dir, want := range map[string]string{"openblas-pthread": "openblas", "blas": "reference"} {
		p := fakeBLASTree(t, dir)
		info := p.detect()
		if info.Kind != want || !strings.HasSuffix(info.Resolved, filepath.Join(dir, "libblas.so.3")) {
			t.Errorf("%s: detected %+v, want kind %s", dir, info, want)
		}
		if !strings.Contains(info.Via, "alternatives") {
			t.Errorf("%s: via %q does not name the alternatives link", dir, info.Via)
		}
	}
}

func TestBLASProbeFallsBackToLdconfig(t *testing.T) {
	p := fakeBLASTree(t, "blas")
	ref := p.lib
	p.lib = filepath.Join(t.TempDir(), "libblas.so.3") // not there
	p.ldconfig = func() ([]byte, error) {
		return []byte("1234 libs found in cache `/etc/ld.so.cache'\n" +
			"\tlibblas.so.3 (libc6) => /usr/lib/i386-linux-gnu/libblas.so.3\n" +
			"\tlibblas.so.3 (libc6,x86-64) => " + ref + "\n" +
			"\tlibblas.so (libc6,x86-64) => /nowhere/libblas.so\n"), nil
	}
	info := p.detect()
	if info.Kind != "reference" || info.Lib != ref || info.Via != "ldconfig -p" {
		t.Fatalf("detected %+v, want the reference BLAS through ldconfig", info)
	}
	p.ldconfig = func() ([]byte, error) { return []byte("0 libs found\n"), nil }
	if info := p.detect(); info.Kind != "missing" {
		t.Fatalf("with no libblas.so.3 anywhere: %+v", info)
	}
}

func TestPeerVerdict(t *testing.T) {
	openblas := peerBLASInfo{Lib: "/l/libblas.so.3", Resolved: "/l/openblas-pthread/libblas.so.3", Kind: "openblas"}
	reference := peerBLASInfo{Lib: "/l/libblas.so.3", Resolved: "/l/blas/libblas.so.3", Kind: "reference"}
	missing := peerBLASInfo{Lib: "/l/libblas.so.3", Kind: "missing"}
	// The script saw the reference BLAS although the probe did not.
	warned := openblas
	warned.Warning = "WARNING: libblas.so.3 is /usr/lib/x86_64-linux-gnu/blas/libblas.so.3.11.0, not OpenBLAS: apt-get install -y libopenblas0-pthread (PyTorch is handicapped without it)"
	// A warning about a BLAS that is not the reference one is shown, not refused.
	blis := peerBLASInfo{Lib: "/l/libblas.so.3", Resolved: "/l/blis-pthread/libblas.so.3", Kind: "blis",
		Warning: "WARNING: libblas.so.3 is /l/blis-pthread/libblas.so.3, not OpenBLAS: ..."}

	for _, c := range []struct {
		name        string
		info        peerBLASInfo
		allow       bool
		refuse      bool
		void        bool
		errContains string
	}{
		{"openblas", openblas, false, false, false, ""},
		{"blis", blis, false, false, false, ""},
		{"reference", reference, false, true, false, "libopenblas0-pthread"},
		{"reference allowed", reference, true, false, true, ""},
		{"missing", missing, false, true, false, "cannot be found"},
		{"warned", warned, false, true, false, "-allow-reference-blas"},
		{"warned allowed", warned, true, false, true, ""},
	} {
		void, err := peerVerdict(c.info, c.allow)
		if (err != nil) != c.refuse || void != c.void {
			t.Errorf("%s: void %v, err %v; want void %v, refused %v", c.name, void, err, c.void, c.refuse)
			continue
		}
		if err != nil && (!errors.Is(err, errReferenceBLAS) || !strings.Contains(err.Error(), c.errContains)) {
			t.Errorf("%s: error %q, want errReferenceBLAS mentioning %q", c.name, err, c.errContains)
		}
	}
}

func TestComparePeerRounds(t *testing.T) {
	m := func(name string, v float64) peerMetric {
		return peerMetric{Name: name, Unit: "s", Lower: true, Value: v}
	}
	rate := func(name string, v float64) peerMetric { return peerMetric{Name: name, Unit: "GB/s", Value: v} }
	tandem := [][]peerMetric{
		{m("t", 1), rate("bw", 3), m("ours", 5)},
		{m("t", 2), rate("bw", 6), m("ours", 7)},
		{m("t", 4), rate("bw", 1), m("ours", 6)},
	}
	peer := [][]peerMetric{
		{m("t", 2), rate("bw", 1), m("theirs", 9)},
		{m("t", 2), rate("bw", 2), m("theirs", 9)},
		{m("t", 2), rate("bw", 2), m("theirs", 9)},
	}
	cs := comparePeerRounds(tandem, peer)
	if len(cs) != 3 || cs[0].Metric != "t" || cs[1].Metric != "bw" || cs[2].Metric != "ours" {
		t.Fatalf("metrics %+v: want t, bw, ours in Tandem's order (the peer's own left out)", cs)
	}
	// t: per-round ratios 0.5, 1, 2: median 1, range 0.5..2; medians of the
	// sides 2 and 2.
	if c := cs[0]; c.Tandem != 2 || c.Peer != 2 || c.Ratio != 1 || c.RatioMin != 0.5 || c.RatioMax != 2 || c.Better != "lower" ||
		!slices.Equal(c.Ratios, []float64{0.5, 1, 2}) {
		t.Errorf("t: %+v", c)
	}
	// bw: ratios 3, 3, 0.5: the median of the ratios (3) is not the ratio of
	// the medians (3/2).
	if c := cs[1]; c.Tandem != 3 || c.Peer != 2 || c.Ratio != 3 || c.RatioMin != 0.5 || c.RatioMax != 3 || c.Better != "higher" {
		t.Errorf("bw: %+v", c)
	}
	// ours: Tandem's alone, no ratio.
	if c := cs[2]; c.Tandem != 6 || c.Peer != 0 || c.Ratios != nil || c.Ratio != 0 || len(c.TandemAll) != 3 {
		t.Errorf("ours: %+v", c)
	}
	// An even number of rounds: the medians are the means of the middle two.
	cs = comparePeerRounds(tandem[:2], peer[:2])
	if c := cs[0]; c.Tandem != 1.5 || c.Ratio != 0.75 || c.RatioMin != 0.5 || c.RatioMax != 1 {
		t.Errorf("two rounds: %+v", c)
	}
}

// fakePeerRun is a comparison whose sides record the order they ran in.
func fakePeerRun(probe blasProbe, rounds int, allow bool, order *[]string) peerRun {
	return peerRun{
		bench: "fake", script: "/peers/torch_fake.py", rounds: rounds, allow: allow, probe: probe,
		tandem: func(context.Context) ([]peerMetric, error) {
			*order = append(*order, "T")
			return []peerMetric{{Name: "step", Unit: "s", Lower: true, Value: 0.010}, {Name: "p99", Unit: "s", Lower: true, Value: 0.02}}, nil
		},
		peer: func(context.Context) ([]peerMetric, []byte, error) {
			*order = append(*order, "P")
			return []peerMetric{{Name: "step", Unit: "s", Lower: true, Value: 0.020}}, []byte("world=1 median_step_s=0.02\n"), nil
		},
	}
}

func TestPeerRunTakesTurnsAndReports(t *testing.T) {
	var order []string
	var out bytes.Buffer
	if err := fakePeerRun(fakeBLASTree(t, "openblas-pthread"), 4, false, &order).run(context.Background(), &out, true); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(order, " "); got != "T P P T T P P T" {
		t.Errorf("order %q: want the first side to alternate, T P P T T P P T", got)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want one JSON line a metric: %q", out.String())
	}
	var c peerComparison
	if err := json.Unmarshal([]byte(lines[0]), &c); err != nil {
		t.Fatal(err)
	}
	if c.Bench != "fake" || c.Metric != "step" || c.Rounds != 4 || c.Ratio != 0.5 || c.RatioMin != 0.5 || c.RatioMax != 0.5 ||
		c.Void || !strings.Contains(c.PeerBLAS, "OpenBLAS") || c.TandemBLAS == "" {
		t.Errorf("step: %+v", c)
	}
}

func TestPeerRunRefusesTheReferenceBLAS(t *testing.T) {
	ref := fakeBLASTree(t, "blas")
	var order []string
	var out bytes.Buffer
	err := fakePeerRun(ref, 3, false, &order).run(context.Background(), &out, false)
	if !errors.Is(err, errReferenceBLAS) || !strings.Contains(err.Error(), "apt-get install") {
		t.Fatalf("err %v, want a refusal that says how to install OpenBLAS", err)
	}
	if len(order) != 0 || out.Len() != 0 {
		t.Fatalf("a refused comparison ran %v and printed %q", order, out.String())
	}

	// Allowed: every ratio line says VOID, a Tandem-only line does not.
	order = nil
	if err := fakePeerRun(ref, 1, true, &order).run(context.Background(), &out, false); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	if !strings.Contains(text, "REFERENCE") || !strings.Contains(text, "VOID:") {
		t.Errorf("the table does not warn about the reference BLAS:\n%s", text)
	}
	for _, line := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(line, "step "):
			if !strings.HasSuffix(line, "VOID") {
				t.Errorf("ratio line not marked VOID: %q", line)
			}
		case strings.HasPrefix(line, "p99 "):
			if strings.Contains(line, "VOID") {
				t.Errorf("a line without a ratio marked VOID: %q", line)
			}
		}
	}
	out.Reset()
	if err := fakePeerRun(ref, 1, true, &order).run(context.Background(), &out, true); err != nil {
		t.Fatal(err)
	}
	var c peerComparison
	if err := json.Unmarshal([]byte(strings.Split(out.String(), "\n")[0]), &c); err != nil || !c.Void {
		t.Fatalf("JSON line %q (%v): want void", out.String(), err)
	}
}

func TestPeerFlag(t *testing.T) {
	for _, c := range []struct {
		args   []string
		on     bool
		script string
	}{
		{nil, false, ""},
		{[]string{"-peer"}, true, ""},
		{[]string{"-peer=false"}, false, ""},
		{[]string{"-peer=/x/torch_ddp.py"}, true, "/x/torch_ddp.py"},
		{[]string{"-peer", "../elsewhere/torch_ddp.py", "-rounds", "5"}, true, "../elsewhere/torch_ddp.py"},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		o := addPeerFlags(fs, "torch_ddp.py", 3)
		if err := parseBenchFlags(fs, joinPeerPath(c.args)); err != nil {
			t.Errorf("%q: %v", c.args, err)
			continue
		}
		if o.peer.on != c.on || o.peer.script != c.script {
			t.Errorf("%q: peer %+v", c.args, o.peer)
		}
		want := c.script
		if want == "" {
			// The test runs in cmd/tandem: the repository's peers/ is two up.
			abs, err := filepath.Abs(filepath.Join("..", "..", "peers", "torch_ddp.py"))
			if err != nil {
				t.Fatal(err)
			}
			want = abs
		}
		if got := o.scriptPath("torch_ddp.py"); got != want {
			t.Errorf("%q: script %q, want %q", c.args, got, want)
		}
	}
}

func TestParsePeerOutputs(t *testing.T) {
	ar := "# gloo allreduce world=2\nbytes\tmedian_s\talgbw_GBps\tbusbw_GBps\n4096\t0.000550\t0.007\t0.007\n16777216\t0.016000\t1.049\t1.049\n"
	ms, err := parseTorchAllreduce([]byte(ar), 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 4 || ms[0].Name != "time 4096 B" || ms[0].Value != 0.00055 || !ms[0].Lower ||
		ms[3].Name != "busbw 16777216 B" || ms[3].Value < 1.048 || ms[3].Value > 1.049 {
		t.Errorf("allreduce metrics %+v", ms)
	}
	if _, err := parseTorchAllreduce([]byte("Traceback\n"), 2); err == nil {
		t.Error("output without sizes parsed")
	}
	step, err := parseTorchDDP([]byte("# WARNING: x\nworld=1 median_step_s=0.01030 samples_per_s=6214 last_loss=1.7655\n"))
	if err != nil || step != 0.0103 {
		t.Errorf("ddp step %v, %v", step, err)
	}
	if _, err := parseTorchDDP([]byte("world=1\n")); err == nil {
		t.Error("output without a step parsed")
	}
	if w := peerWarning([]byte("# WARNING: libblas.so.3 is /l/blas/libblas.so.3, not OpenBLAS\nworld=1\n")); warnedBLASKind(w) != "reference" {
		t.Errorf("warning %q", w)
	}
}

func TestFindPeerDir(t *testing.T) {
	root := t.TempDir()
	peers := filepath.Join(root, "peers")
	deep := filepath.Join(root, "cmd", "tandem")
	for _, d := range []string{peers, deep} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(peers, "torch_ddp.py"), []byte("# peer\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	elsewhere := t.TempDir()
	wd := func(dir string) func() (string, error) { return func() (string, error) { return dir, nil } }
	noWD := func() (string, error) { return "", errors.New("no working directory") }
	for _, c := range []struct {
		name  string
		getwd func() (string, error)
		src   string
		want  string
	}{
		{"working directory is the root", wd(root), "", peers},
		{"working directory below the root", wd(deep), "", peers},
		{"source tree when the working directory has none", wd(elsewhere), deep, peers},
		{"source tree without a working directory", noWD, deep, peers},
		{"module-relative source path (-trimpath)", wd(elsewhere), "github.com/tandemml/tandem/cmd/tandem", ""},
		{"neither", wd(elsewhere), elsewhere, ""},
	} {
		if got := findPeerDir(c.getwd, c.src); got != c.want {
			t.Errorf("%s: findPeerDir = %q, want %q", c.name, got, c.want)
		}
	}
	// A directory named peers without the programs is not the one.
	if err := os.MkdirAll(filepath.Join(elsewhere, "peers"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := findPeerDir(wd(elsewhere), ""); got != "" {
		t.Errorf("empty peers/: findPeerDir = %q, want \"\"", got)
	}
}

// TestPeerOpenBLASCoreOverridesASlowerChoice: a caller's OPENBLAS_CORETYPE
// that names kernels slower than the processor's best is replaced for the
// peer, and one as good stands.
func TestPeerOpenBLASCoreOverridesASlowerChoice(t *testing.T) {
	best := tblas.BestOpenBLASCore()
	t.Setenv(openblasCoreEnv, "Prescott")
	set, detected := peerOpenBLASCore(context.Background())
	if set != best || !strings.Contains(detected, "Prescott") {
		t.Fatalf("caller's Prescott on a processor whose best is %q: set %q, detected %q; want set %q", best, set, detected, best)
	}
	if best == "" {
		return
	}
	t.Setenv(openblasCoreEnv, best)
	if set, _ := peerOpenBLASCore(context.Background()); set != "" {
		t.Fatalf("caller's %s, the processor's best: set %q, want it left alone", best, set)
	}
}
