package main

// The peer runner shared by the benchmarks that have a PyTorch counterpart
// (the repository's peers/ directory: torch_allreduce.py, torch_ddp.py,
// torch_rpc.py; see peers/README.md).
// With -peer a benchmark runs Tandem and the peer script in turns, round
// after round in one command (T P, then P T, then T P...: whichever goes
// first has the machine in a different state, so the order alternates),
// says which BLAS each side uses, refuses a peer whose libblas.so.3 is the
// reference BLAS (PyTorch is several times slower on it: a comparison
// against it flatters us) unless -allow-reference-blas, which marks every
// ratio VOID, and reports each metric as both sides' medians over the
// rounds, the median of the per-round ratios and their range.
//
// A ratio is Tandem's value over the peer's, in the metric's own unit: for
// times (lower is better) 0.5x means Tandem takes half the time, for rates
// (higher is better) 2x means Tandem does twice as much.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	tblas "github.com/tandemml/tandem/internal/blas"
)

const (
	// peerDirName is the repository's directory of peer programs.
	peerDirName = "peers"
	// peerPython is Debian's python3, the one python3-torch installs for
	// (the python3 first on PATH may be another).
	peerPython = "/usr/bin/python3"
	// debianLibBLAS is the libblas.so.3 that Debian's torch is linked
	// against; update-alternatives points it at a BLAS.
	debianLibBLAS = "/usr/lib/x86_64-linux-gnu/libblas.so.3"
	// installOpenBLAS says how to give the peer OpenBLAS.
	installOpenBLAS = "apt-get install -y libopenblas0-pthread (or libopenblas-dev), then check `update-alternatives --display libblas.so.3-x86_64-linux-gnu` points at openblas-pthread"
)

// peerFlag is -peer: a switch that also takes the peer script's path
// (-peer=PATH) for a script elsewhere than the repository's peers/.
type peerFlag struct {
	on     bool
	script string
}

func (p *peerFlag) IsBoolFlag() bool { return true }

func (p *peerFlag) String() string {
	if p == nil || !p.on {
		return "false"
	}
	if p.script != "" {
		return p.script
	}
	return "true"
}

func (p *peerFlag) Set(s string) error {
	if b, err := strconv.ParseBool(s); err == nil {
		p.on = b
		return nil
	}
	if s == "" {
		return errors.New("empty peer script path")
	}
	p.on, p.script = true, s
	return nil
}

// peerOptions are the flags of a benchmark's peer comparison.
type peerOptions struct {
	peer       peerFlag
	rounds     *int
	allowRefBL *bool
}

// addPeerFlags defines -peer, -rounds and -allow-reference-blas on fs for a
// benchmark whose peer is script (a file in the repository's peers/,
// found by findPeerDir). rounds is the
// default of -rounds; a benchmark that has -rounds already passes 0 and
// sets opts.rounds itself.
func addPeerFlags(fs *flag.FlagSet, script string, rounds int) *peerOptions {
	o := &peerOptions{}
	fs.Var(&o.peer, "peer", "also run PyTorch's "+script+" (from the repository's "+peerDirName+"/ directory, or -peer=PATH) in turns with Tandem over -rounds, and print the ratios")
	if rounds > 0 {
		o.rounds = fs.Int("rounds", rounds, "with -peer: rounds of Tandem and the peer, taken in turns")
	}
	o.allowRefBL = fs.Bool("allow-reference-blas", false, "with -peer: compare even when the peer's libblas.so.3 is the reference BLAS (every ratio is then marked VOID)")
	return o
}

// scriptPath is the peer script to run: -peer=PATH, else script in the
// repository's peers/ directory (findPeerDir), else script in peers/ under
// the working directory, which the run then reports missing.
func (o *peerOptions) scriptPath(script string) string {
	if o.peer.script != "" {
		return o.peer.script
	}
	dir := findPeerDir(os.Getwd, sourceDir())
	if dir == "" {
		dir = peerDirName
	}
	return filepath.Join(dir, script)
}

// findPeerDir returns the repository's peers/ directory: the first one
// found in the working directory or above it (a command run inside a
// clone), else the one beside the source tree this binary was built from
// (src, this file's directory: cmd/tandem in a clone or in the module
// cache, which `go install` fills). "" when there is neither.
func findPeerDir(getwd func() (string, error), src string) string {
	isPeerDir := func(dir string) bool {
		fi, err := os.Stat(filepath.Join(dir, "torch_ddp.py"))
		return err == nil && fi.Mode().IsRegular()
	}
	if wd, err := getwd(); err == nil {
		for dir := wd; ; dir = filepath.Dir(dir) {
			if p := filepath.Join(dir, peerDirName); isPeerDir(p) {
				return p
			}
			if filepath.Dir(dir) == dir {
				break
			}
		}
	}
	if src != "" && filepath.IsAbs(src) {
		if p := filepath.Join(src, "..", "..", peerDirName); isPeerDir(p) {
			return filepath.Clean(p)
		}
	}
	return ""
}

// sourceDir is the directory this file was compiled from ("" when the
// binary was built with -trimpath, which leaves module-relative paths).
func sourceDir() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return ""
	}
	return filepath.Dir(file)
}

// joinPeerPath rewrites "-peer X.py" as "-peer=X.py", so that the form with
// a space keeps working although -peer is a switch.
func joinPeerPath(args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if (a == "-peer" || a == "--peer") && i+1 < len(args) && strings.HasSuffix(args[i+1], ".py") {
			out = append(out, a+"="+args[i+1])
			i++
			continue
		}
		out = append(out, a)
	}
	return out
}

// tandemBLAS says which BLAS this binary runs its matrix products on.
func tandemBLAS() string {
	if tblas.Name == "openblas" {
		s := "OpenBLAS (built with -tags openblas, core " + tblas.Core()
		if v := os.Getenv(openblasCoreEnv); v != "" {
			s += ", chosen by " + openblasCoreEnv + "=" + v
		}
		return s + ", one thread)"
	}
	if tblas.Core() == "go-avx512" {
		return "pure Go (gonum; float32 GEMM in Tandem's AVX-512 kernels)"
	}
	if tblas.Core() == "go-fma" {
		return "pure Go (gonum; float32 GEMM in Tandem's AVX/FMA kernels)"
	}
	return "pure Go (gonum)"
}

// peerBLASInfo is what the peer's libblas.so.3 turned out to be.
type peerBLASInfo struct {
	Lib      string // the path Debian's torch loads
	Resolved string // where its symlinks lead ("" when it is missing)
	Via      string // how it was found: the symlink chain, or ldconfig
	Kind     string // openblas, blis, atlas, mkl, reference, unknown or missing
	Warning  string // the peer script's own warning, when it printed one
	// CoreDetected is the kernel set OpenBLAS would run: its own choice,
	// or the caller's OPENBLAS_CORETYPE; CoreSet, when not "", the better
	// one the peer runs with instead.
	CoreDetected, CoreSet string
}

// String describes the peer's BLAS for the report.
func (b peerBLASInfo) String() string {
	var names = map[string]string{"openblas": "OpenBLAS", "blis": "BLIS", "atlas": "ATLAS", "mkl": "MKL",
		"reference": "the REFERENCE BLAS (netlib, unoptimised)", "unknown": "an unrecognised BLAS", "missing": "no libblas.so.3 found"}
	s := names[b.Kind]
	if b.Resolved != "" {
		s += fmt.Sprintf(" (%s -> %s, via %s)", b.Lib, b.Resolved, b.Via)
	}
	switch {
	case b.CoreSet != "":
		s += fmt.Sprintf(", kernels %s (OpenBLAS would run %s, slower on this processor; the peer runs with %s=%s)", b.CoreSet, b.CoreDetected, openblasCoreEnv, b.CoreSet)
	case b.CoreDetected != "":
		s += ", kernels " + b.CoreDetected
	}
	return s
}

// blasProbe finds the BLAS behind libblas.so.3. Its fields are the paths and
// the ldconfig it consults, so that tests can point it at a fake tree.
type blasProbe struct {
	lib      string                       // libblas.so.3 as Debian's torch loads it
	ldconfig func() ([]byte, error)       // `ldconfig -p`, used when lib is missing
	resolve  func(string) (string, error) // symlink resolution
	readlink func(string) (string, error) // one link's target
	// openblasCore returns the kernel set to run an OpenBLAS peer with and
	// the one it detected (peerOpenBLASCore); nil: leave OpenBLAS alone.
	openblasCore func(context.Context) (set, detected string)
}

// systemBLASProbe is the probe of this machine.
func systemBLASProbe() blasProbe {
	return blasProbe{
		lib: debianLibBLAS,
		ldconfig: func() ([]byte, error) {
			for _, p := range []string{"/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"} {
				if out, err := exec.Command(p, "-p").Output(); err == nil {
					return out, nil
				}
			}
			return nil, errors.New("ldconfig -p failed")
		},
		resolve:      filepath.EvalSymlinks,
		readlink:     os.Readlink,
		openblasCore: peerOpenBLASCore,
	}
}

// detect resolves libblas.so.3: through its symlink chain (on Debian,
// /etc/alternatives/libblas.so.3-x86_64-linux-gnu), or, when that path is
// missing, through the loader's cache (ldconfig -p).
func (p blasProbe) detect() peerBLASInfo {
	info := peerBLASInfo{Lib: p.lib, Kind: "missing"}
	via := "a plain file"
	target, err := p.resolve(p.lib)
	if err != nil && p.ldconfig != nil {
		if out, lerr := p.ldconfig(); lerr == nil {
			if lib := ldconfigBLAS(out); lib != "" {
				info.Lib, via = lib, "ldconfig -p"
				target, err = p.resolve(lib)
			}
		}
	}
	if err != nil {
		return info
	}
	if via != "ldconfig -p" && p.readlink != nil {
		if hop, err := p.readlink(info.Lib); err == nil {
			via = "symlink " + hop // on Debian, /etc/alternatives/libblas.so.3-<arch>
		}
	}
	info.Resolved, info.Via, info.Kind = target, via, classifyBLAS(target)
	return info
}

// ldconfigBLAS returns the x86-64 libblas.so.3 that `ldconfig -p` lists, ""
// when it lists none.
func ldconfigBLAS(out []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "libblas.so.3 ") || !strings.Contains(line, "x86-64") {
			continue
		}
		if _, path, ok := strings.Cut(line, "=> "); ok {
			return strings.TrimSpace(path)
		}
	}
	return ""
}

// classifyBLAS names the BLAS a resolved libblas.so.3 path belongs to.
// Debian installs each BLAS in a directory of its own under the
// architecture's lib directory: openblas-pthread (or -openmp, -serial),
// blis-pthread, atlas, and blas for the reference implementation.
func classifyBLAS(path string) string {
	p := strings.ToLower(path)
	switch {
	case strings.Contains(p, "openblas"):
		return "openblas"
	case strings.Contains(p, "blis"):
		return "blis"
	case strings.Contains(p, "atlas"):
		return "atlas"
	case strings.Contains(p, "mkl"):
		return "mkl"
	case filepath.Base(filepath.Dir(p)) == "blas" || strings.Contains(p, "refblas") || strings.Contains(p, "netlib"):
		return "reference"
	}
	return "unknown"
}

// peerWarning returns the warning a peer script prints when libblas.so.3
// is not OpenBLAS ("# WARNING: libblas.so.3 is PATH, ..."), "" when it
// printed none.
func peerWarning(out []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "# WARNING") {
			return strings.TrimSpace(strings.TrimPrefix(l, "#"))
		}
	}
	return ""
}

// warnedBLASKind classifies the library a peer's warning names, "" when the
// warning names none.
func warnedBLASKind(warning string) string {
	_, rest, ok := strings.Cut(warning, "libblas.so.3 is ")
	if !ok {
		return ""
	}
	path, _, _ := strings.Cut(rest, ",")
	return classifyBLAS(strings.TrimSpace(path))
}

// errReferenceBLAS is the refusal to compare with a handicapped peer.
var errReferenceBLAS = errors.New("refusing to compare")

// peerVerdict decides whether a comparison with a peer on this BLAS may go
// on, and whether its ratios are void: a peer on the reference BLAS (or on
// none that can be found) is refused unless allowed, and then void.
func peerVerdict(info peerBLASInfo, allow bool) (void bool, err error) {
	kind := info.Kind
	if k := warnedBLASKind(info.Warning); k == "reference" {
		kind = k
	}
	if kind != "reference" && kind != "missing" {
		return false, nil
	}
	if allow {
		return true, nil
	}
	what := "is the reference BLAS"
	if kind == "missing" {
		what = "cannot be found"
	}
	return false, fmt.Errorf("bench: -peer: %w: the peer's %s %s (%s), on which PyTorch runs several times slower than at its best; %s, or pass -allow-reference-blas to print the figures marked VOID",
		errReferenceBLAS, info.Lib, what, cmpOrString(info.Resolved, "no target"), installOpenBLAS)
}

func cmpOrString(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// peerMetric is one figure of one side in one round.
type peerMetric struct {
	Name  string  // what was measured, the key that pairs the sides: "echo 4194304 B p50"
	Unit  string  // "s", "GB/s", "calls/s", "samples/s"
	Lower bool    // lower is better (times)
	Value float64 // in Unit
}

// peerComparison is one line of a comparison: one metric over the rounds.
type peerComparison struct {
	Bench      string    `json:"bench"`
	Metric     string    `json:"metric"`
	Unit       string    `json:"unit"`
	Better     string    `json:"better"` // "lower" or "higher"
	Rounds     int       `json:"rounds"`
	Tandem     float64   `json:"tandem"`         // median over the rounds
	Peer       float64   `json:"peer,omitempty"` // likewise; absent for a metric the peer does not measure
	Ratio      float64   `json:"ratio,omitempty"`
	RatioMin   float64   `json:"ratio_min,omitempty"`
	RatioMax   float64   `json:"ratio_max,omitempty"`
	TandemAll  []float64 `json:"tandem_rounds"`
	PeerAll    []float64 `json:"peer_rounds,omitempty"`
	Ratios     []float64 `json:"ratios,omitempty"`
	Void       bool      `json:"void,omitempty"` // the peer ran on the reference BLAS
	TandemBLAS string    `json:"tandem_blas"`
	PeerBLAS   string    `json:"peer_blas"`
	PeerScript string    `json:"peer_script"`
	LoadAvg    string    `json:"loadavg,omitempty"` // 1-minute load average at the start and the end
}

// comparePeerRounds pairs the rounds' metrics by name, in the order of
// Tandem's first round, and computes each one's medians and ratios. A metric
// the peer lacks has Tandem's figures only; one Tandem lacks is left out.
func comparePeerRounds(tandem, peer [][]peerMetric) []peerComparison {
	if len(tandem) == 0 {
		return nil
	}
	var out []peerComparison
	for _, m := range tandem[0] {
		c := peerComparison{Metric: m.Name, Unit: m.Unit, Better: "higher", Rounds: len(tandem)}
		if m.Lower {
			c.Better = "lower"
		}
		for r := range tandem {
			tv, ok := findMetric(tandem[r], m.Name)
			if !ok {
				continue
			}
			c.TandemAll = append(c.TandemAll, tv)
			if r < len(peer) {
				if pv, ok := findMetric(peer[r], m.Name); ok {
					c.PeerAll = append(c.PeerAll, pv)
					if pv != 0 {
						c.Ratios = append(c.Ratios, tv/pv)
					}
				}
			}
		}
		c.Tandem, c.Peer = medianOf(c.TandemAll), medianOf(c.PeerAll)
		if len(c.Ratios) > 0 {
			c.Ratio, c.RatioMin, c.RatioMax = medianOf(c.Ratios), slices.Min(c.Ratios), slices.Max(c.Ratios)
		}
		out = append(out, c)
	}
	return out
}

func findMetric(ms []peerMetric, name string) (float64, bool) {
	for _, m := range ms {
		if m.Name == name {
			return m.Value, true
		}
	}
	return 0, false
}

// peerRun is one benchmark's comparison: how to run each side once.
type peerRun struct {
	bench  string
	setup  string // how Tandem's side runs (backend, processes), for the table
	script string // the peer script's path
	rounds int
	allow  bool
	probe  blasProbe
	// tandem runs Tandem's side once; peer runs the peer once (its stdout
	// is returned for the BLAS warning) and returns its metrics.
	tandem func(ctx context.Context) ([]peerMetric, error)
	peer   func(ctx context.Context) ([]peerMetric, []byte, error)
}

// run takes the rounds in turns and writes the comparison to stdout, as a
// table or, with asJSON, one peerComparison a line.
func (p peerRun) run(ctx context.Context, stdout io.Writer, asJSON bool) error {
	if p.rounds < 1 {
		return fmt.Errorf("bench %s: -rounds %d: need at least one round", p.bench, p.rounds)
	}
	info := p.probe.detect()
	void, err := peerVerdict(info, p.allow)
	if err != nil {
		return err
	}
	peerCtx := ctx
	if info.Kind == "openblas" && p.probe.openblasCore != nil {
		info.CoreSet, info.CoreDetected = p.probe.openblasCore(ctx)
		if info.CoreSet != "" {
			peerCtx = withPeerEnv(ctx, openblasCoreEnv+"="+info.CoreSet)
		}
	}
	load0 := loadAvg()
	var tandem, peer [][]peerMetric
	for r := 0; r < p.rounds; r++ {
		tandemFirst := r%2 == 0
		for _, side := range []bool{tandemFirst, !tandemFirst} {
			if side {
				ms, err := p.tandem(ctx)
				if err != nil {
					return fmt.Errorf("bench %s: round %d, Tandem: %w", p.bench, r+1, err)
				}
				tandem = append(tandem, ms)
				continue
			}
			ms, out, err := p.peer(peerCtx)
			if err != nil {
				return fmt.Errorf("bench %s: round %d, peer %s: %w", p.bench, r+1, p.script, err)
			}
			if w := peerWarning(out); w != "" && info.Warning == "" {
				info.Warning = w
				if void, err = peerVerdict(info, p.allow); err != nil {
					return err
				}
			}
			peer = append(peer, ms)
		}
	}
	load := load0 + " .. " + loadAvg()
	cs := comparePeerRounds(tandem, peer)
	for i := range cs {
		cs[i].Bench, cs[i].Void, cs[i].TandemBLAS, cs[i].PeerBLAS, cs[i].PeerScript, cs[i].LoadAvg =
			p.bench, void && cs[i].Ratios != nil, tandemBLAS(), info.String(), p.script, load
	}
	if asJSON {
		for _, c := range cs {
			if err := writeJSONLine(stdout, c); err != nil {
				return err
			}
		}
		return nil
	}
	writePeerTable(stdout, p.bench, p.setup, p.script, p.rounds, info, void, load, cs)
	return nil
}

// writePeerTable prints a comparison for people.
func writePeerTable(w io.Writer, bench, setup, script string, rounds int, info peerBLASInfo, void bool, load string, cs []peerComparison) {
	fmt.Fprintf(w, "tandem bench %s against %s: %d round(s), Tandem and the peer in turns (T P, P T, ...)\n", bench, filepath.Base(script), rounds)
	if setup != "" {
		fmt.Fprintf(w, "Tandem runs: %s\n", setup)
	}
	fmt.Fprintf(w, "Tandem BLAS: %s\n", tandemBLAS())
	fmt.Fprintf(w, "peer BLAS:   %s\n", info)
	if info.Warning != "" {
		fmt.Fprintf(w, "peer says:   %s\n", info.Warning)
	}
	fmt.Fprintf(w, "load average (1 min): %s, %d CPUs\n", load, runtime.NumCPU())
	if void {
		fmt.Fprintln(w, "VOID: the peer ran on the reference BLAS; these ratios are not PyTorch at its best and must not be quoted")
	}
	fmt.Fprintln(w, "ratio = Tandem / peer, medians over the rounds; the range is the per-round ratios' min..max")
	fmt.Fprintf(w, "%-28s %-7s %12s %12s %8s %17s\n", "metric", "better", "Tandem", "peer", "ratio", "range")
	for _, c := range cs {
		if c.Ratios == nil {
			fmt.Fprintf(w, "%-28s %-7s %12s %12s\n", c.Metric, c.Better, fmtMetric(c.Tandem, c.Unit), "-")
			continue
		}
		line := fmt.Sprintf("%-28s %-7s %12s %12s %7.3gx %8.3g..%-7.3g", c.Metric, c.Better, fmtMetric(c.Tandem, c.Unit), fmtMetric(c.Peer, c.Unit), c.Ratio, c.RatioMin, c.RatioMax)
		if c.Void {
			line += " VOID"
		}
		fmt.Fprintln(w, strings.TrimRight(line, " "))
	}
}

// fmtMetric formats a value of unit for the table.
func fmtMetric(v float64, unit string) string {
	if unit == "s" {
		return fmtSeconds(v)
	}
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f %s", v, unit)
	default:
		return fmt.Sprintf("%.3g %s", v, unit)
	}
}

// peerRunTimeout bounds one run of a peer script: when one of its ranks
// dies the others wait for it for ever.
const peerRunTimeout = 10 * time.Minute

// runPeerScript runs a peer script with the arguments args gives for a port
// that was free a moment ago, and returns its stdout. Its stderr goes to
// ours; OpenBLAS is pinned to one thread, as the scripts do themselves. A
// run that fails (a port taken meanwhile, a rank lost) is tried once more
// on another port; a run that hangs is killed, its ranks with it.
func runPeerScript(ctx context.Context, script string, args func(port string) []string) ([]byte, error) {
	if _, err := os.Stat(script); err != nil {
		return nil, fmt.Errorf("peer script: %w (the scripts are in the repository's %s/ directory: run tandem inside a clone, or name the script with -peer=PATH)", err, peerDirName)
	}
	var out []byte
	var err error
	for try := 0; try < 2 && ctx.Err() == nil; try++ {
		if try > 0 {
			fmt.Fprintf(os.Stderr, "tandem bench: %v; trying once more\n", err)
		}
		var port int
		if port, err = freePort(); err != nil {
			return nil, err
		}
		if out, err = runPeerOnce(ctx, script, args(strconv.Itoa(port))); err == nil {
			return out, nil
		}
	}
	return out, err
}

func runPeerOnce(ctx context.Context, script string, args []string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, peerRunTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, peerPython, append([]string{script}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	cmd.Env = append(append(os.Environ(), "OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1"), peerEnv(ctx)...)
	// The script's ranks are processes of its own: kill them with it.
	cmd.SysProcAttr = workerSysProcAttr()
	cmd.Cancel = func() error { return signalGroup(cmd.Process.Pid, os.Kill) }
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return out.Bytes(), fmt.Errorf("%s %s %s did not finish in %v (a rank of it died?): %w", peerPython, script, strings.Join(args, " "), peerRunTimeout, err)
	}
	if err != nil {
		return out.Bytes(), fmt.Errorf("%s %s %s: %w (is python3-torch installed? apt-get install -y python3-torch)", peerPython, script, strings.Join(args, " "), err)
	}
	return out.Bytes(), nil
}

// loadAvg returns the 1-minute load average of the machine, "" when unknown.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// peerEnvKey carries extra environment for the peer's processes.
type peerEnvKey struct{}

// withPeerEnv returns ctx carrying env (NAME=VALUE) for the peer runs under it.
func withPeerEnv(ctx context.Context, env ...string) context.Context {
	return context.WithValue(ctx, peerEnvKey{}, append(peerEnv(ctx), env...))
}

// peerEnv is the extra environment ctx carries for the peer.
func peerEnv(ctx context.Context) []string {
	env, _ := ctx.Value(peerEnvKey{}).([]string)
	return slices.Clone(env)
}
