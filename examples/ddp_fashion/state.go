package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/checkpoint"
	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/optim"
)

// A checkpoint is one safetensors file per finished epoch,
// <out>/checkpoint-epochNNN.safetensors, holding
//
//   - the model's state_dict under PyTorch's names ("0.weight", "0.bias",
//     ..., "7.bias"), so that PyTorch loads it into the same nn.Sequential;
//   - the optimizer's state under "optimizer." followed by the names optim
//     uses ("optimizer.state.0.momentum_buffer", "optimizer.param_groups.0.lr");
//   - in the header's metadata: "epoch" (epochs finished), "history" (the
//     per-epoch statistics as JSON, for the plot), the run's settings, and
//     the checkpoint package's checksum of it all ("tandem.checksum").
//
// Only rank 0 writes and reads the files. On -resume it takes the newest
// intact one (a truncated or damaged newer file is skipped, and said so)
// and sends its bytes to the other ranks, so -out need only exist on rank
// 0's machine.

// optimPrefix is the name prefix of the optimizer's entries.
const optimPrefix = "optimizer."

// epochStats is what one epoch measured, on all ranks together. In JSON
// (the checkpoints' "history") a NaN or infinite value is written as the
// string "NaN", "Inf" or "-Inf", since JSON numbers cannot hold them.
type epochStats struct {
	Epoch     int     `json:"epoch"`      // from 1
	TrainLoss float64 `json:"train_loss"` // mean over the epoch's training batches
	TestLoss  float64 `json:"test_loss"`  // mean cross entropy on the test set
	TestAcc   float64 `json:"test_acc"`   // fraction of the test set classified right
	LR        float64 `json:"lr"`         // learning rate of the epoch
	Seconds   float64 `json:"seconds"`    // wall time of training and evaluation
}

// statsJSON is epochStats as written in JSON.
type statsJSON struct {
	Epoch     int       `json:"epoch"`
	TrainLoss jsonFloat `json:"train_loss"`
	TestLoss  jsonFloat `json:"test_loss"`
	TestAcc   jsonFloat `json:"test_acc"`
	LR        jsonFloat `json:"lr"`
	Seconds   jsonFloat `json:"seconds"`
}

// MarshalJSON writes s, NaN and infinities as strings.
func (s epochStats) MarshalJSON() ([]byte, error) {
	return json.Marshal(statsJSON{s.Epoch, jsonFloat(s.TrainLoss), jsonFloat(s.TestLoss), jsonFloat(s.TestAcc), jsonFloat(s.LR), jsonFloat(s.Seconds)})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (s *epochStats) UnmarshalJSON(b []byte) error {
	var w statsJSON
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*s = epochStats{w.Epoch, float64(w.TrainLoss), float64(w.TestLoss), float64(w.TestAcc), float64(w.LR), float64(w.Seconds)}
	return nil
}

// jsonFloat is a float64 that JSON always carries: a number when finite,
// else the string "NaN", "Inf" or "-Inf" (encoding/json refuses to write
// them as numbers, and JSON has no spelling for them).
type jsonFloat float64

func (f jsonFloat) MarshalJSON() ([]byte, error) {
	v := float64(f)
	switch {
	case math.IsNaN(v):
		return []byte(`"NaN"`), nil
	case math.IsInf(v, 1):
		return []byte(`"Inf"`), nil
	case math.IsInf(v, -1):
		return []byte(`"-Inf"`), nil
	}
	return json.Marshal(v)
}

func (f *jsonFloat) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		switch s {
		case "NaN":
			*f = jsonFloat(math.NaN())
		case "Inf", "+Inf":
			*f = jsonFloat(math.Inf(1))
		case "-Inf":
			*f = jsonFloat(math.Inf(-1))
		default:
			return fmt.Errorf("%q is not a number, NaN, Inf or -Inf", s)
		}
		return nil
	}
	var v float64
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*f = jsonFloat(v)
	return nil
}

var checkpointName = regexp.MustCompile(`^checkpoint-epoch(\d+)\.safetensors$`)

// checkpointPath is the file of the checkpoint after epoch (from 1).
func checkpointPath(dir string, epoch int) string {
	return filepath.Join(dir, fmt.Sprintf("checkpoint-epoch%03d.safetensors", epoch))
}

// listCheckpoints returns the checkpoint files in dir, highest epoch first.
func listCheckpoints(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	type found struct {
		path  string
		epoch int
	}
	var cands []found
	for _, e := range entries {
		m := checkpointName.FindStringSubmatch(e.Name())
		if m == nil || !e.Type().IsRegular() {
			continue
		}
		if n, err := strconv.Atoi(m[1]); err == nil {
			cands = append(cands, found{filepath.Join(dir, e.Name()), n})
		}
	}
	slices.SortFunc(cands, func(a, b found) int { return b.epoch - a.epoch })
	out := make([]string, len(cands))
	for i, f := range cands {
		out[i] = f.path
	}
	return out, nil
}

// removeCheckpoints deletes the checkpoint files in dir and says how many
// there were.
func removeCheckpoints(dir string) (int, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range entries {
		if checkpointName.MatchString(e.Name()) && e.Type().IsRegular() {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, nil
}

// runSettings are recorded in every checkpoint, so that a resumed run can
// say when it differs from the run it continues.
type runSettings struct {
	Seed      uint64
	WorldSize int
	Batch     int
	Optimizer string
	LR        float64 // the initial learning rate
	Schedule  string
	Epochs    int
	Limit     int
}

func (s runSettings) metadata() map[string]string {
	return map[string]string{
		"seed":       strconv.FormatUint(s.Seed, 10),
		"world_size": strconv.Itoa(s.WorldSize),
		"batch":      strconv.Itoa(s.Batch),
		"optimizer":  s.Optimizer,
		"lr":         strconv.FormatFloat(s.LR, 'g', -1, 64),
		"schedule":   s.Schedule,
		"epochs":     strconv.Itoa(s.Epochs),
		"limit":      strconv.Itoa(s.Limit),
	}
}

// stateTensors is what a checkpoint holds of model and opt: the model's
// state_dict, then the optimizer's state in name order.
func stateTensors(model models.Module, opt optim.Optimizer) []checkpoint.Named {
	tensors := checkpoint.StateTensors(model)
	state := opt.State()
	names := make([]string, 0, len(state))
	for name := range state {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		tensors = append(tensors, checkpoint.Named{Name: optimPrefix + name, Tensor: state[name]})
	}
	return tensors
}

// saveCheckpoint writes the state after epoch (from 1) to path, atomically.
// sched may be nil (a constant learning rate). It refuses, with an error
// wrapping checkpoint.ErrNonFinite, state that holds NaN or infinities.
func saveCheckpoint(path string, model models.Module, opt optim.Optimizer, sched optim.Scheduler, epoch int, hist []epochStats, settings runSettings) error {
	tensors := stateTensors(model, opt)
	if err := checkpoint.CheckFinite(tensors); err != nil {
		return fmt.Errorf("not saving %s: %w", path, err)
	}
	histJSON, err := json.Marshal(hist)
	if err != nil {
		return err
	}
	meta := settings.metadata()
	meta["format"] = "pt"
	meta["epoch"] = strconv.Itoa(epoch)
	meta["history"] = string(histJSON)
	if sched != nil {
		st, err := json.Marshal(sched.State())
		if err != nil {
			return err
		}
		meta["scheduler"] = string(st)
	}
	if err := checkpoint.Save(path, tensors, meta); err != nil {
		return fmt.Errorf("saving checkpoint %s: %w", path, err)
	}
	return nil
}

// resumed is what a checkpoint restores besides the tensors.
type resumed struct {
	Path     string
	Epoch    int
	History  []epochStats
	Settings map[string]string
}

// shippedCheckpoint is what rank 0 sends the other ranks on -resume: the
// file's bytes, or why there are none.
type shippedCheckpoint struct {
	Path    string
	Data    []byte
	Missing bool   // no intact checkpoint in the folder: start afresh
	Err     string // reading the folder failed: every rank stops
}

// resumeFrom restores model and opt from the newest intact checkpoint in
// dir. Rank 0 removes the temporary files of saves that were killed, tries
// the checkpoints from the highest epoch down, skipping (and reporting to
// w) those that are truncated, malformed or fail their checksum, and
// broadcasts the bytes of the first intact one; every rank decodes them and
// loads them into its replica. It returns nil, and no error, when dir holds
// no intact checkpoint (every rank learns that from rank 0).
func resumeFrom(ctx context.Context, pg *comm.ProcessGroup, dir string, model models.Module, opt optim.Optimizer, sched optim.Scheduler, w io.Writer) (*resumed, error) {
	var ship shippedCheckpoint
	if pg.Rank() == 0 {
		ship = findCheckpoint(dir, w)
	}
	if err := comm.BroadcastObject(ctx, pg, &ship, 0); err != nil {
		return nil, fmt.Errorf("sending the checkpoint to every rank: %w", err)
	}
	switch {
	case ship.Err != "":
		return nil, fmt.Errorf("resuming (rank 0): %s", ship.Err)
	case ship.Missing:
		return nil, nil
	}
	f, err := checkpoint.Decode(ship.Data)
	if err != nil {
		return nil, fmt.Errorf("resuming from %s: %w", ship.Path, err)
	}
	r, err := restore(f, model, opt, sched)
	if err != nil {
		return nil, fmt.Errorf("resuming from %s: %w", ship.Path, err)
	}
	r.Path = ship.Path
	return &r, nil
}

// findCheckpoint is rank 0's part of resumeFrom: clean up, pick the newest
// intact checkpoint, say what was skipped.
func findCheckpoint(dir string, w io.Writer) shippedCheckpoint {
	removed, err := checkpoint.CleanTemps(dir)
	for _, p := range removed {
		fmt.Fprintf(w, "removed %s, left by a save that was interrupted\n", p)
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(w, "note: %v\n", err)
	}
	paths, err := listCheckpoints(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return shippedCheckpoint{Missing: true}
	}
	if err != nil {
		return shippedCheckpoint{Err: err.Error()}
	}
	found, skipped, err := checkpoint.NewestValid(paths)
	for _, s := range skipped {
		fmt.Fprintf(w, "skipping %s: %v\n", s.Path, s.Err)
	}
	if err != nil {
		if len(skipped) > 0 {
			fmt.Fprintf(w, "none of the %d checkpoint(s) in %s is intact\n", len(skipped), dir)
		}
		return shippedCheckpoint{Missing: true}
	}
	return shippedCheckpoint{Path: found.Path, Data: found.Data}
}

// restore loads a decoded checkpoint into model, opt and sched (which may be
// nil; a checkpoint without a scheduler leaves sched as it is). Nothing is
// changed when the checkpoint does not fit.
func restore(f *checkpoint.File, model models.Module, opt optim.Optimizer, sched optim.Scheduler) (resumed, error) {
	var r resumed
	epoch, err := strconv.Atoi(f.Metadata["epoch"])
	if err != nil || epoch < 1 {
		return r, fmt.Errorf("metadata \"epoch\" is %q, want a positive number: %w", f.Metadata["epoch"], checkpoint.ErrFormat)
	}
	if h := f.Metadata["history"]; h != "" {
		if err := json.Unmarshal([]byte(h), &r.History); err != nil {
			return r, fmt.Errorf("metadata \"history\": %w", err)
		}
	}
	// The model's entries must all be there (CopyInto checks shapes and
	// dtypes); the rest must be the optimizer's.
	var missing, unknown, misfit []string
	inModel := map[string]bool{}
	for _, p := range models.StateDict(model) {
		inModel[p.Name] = true
		t, ok := f.Get(p.Name)
		switch {
		case !ok:
			missing = append(missing, p.Name)
		case !t.Shape().Eq(p.Value.Shape()) || t.Dtype() != p.Value.Dtype():
			// Checked here, not only by CopyInto, so that a misfit is found
			// before the optimizer's state is replaced.
			misfit = append(misfit, fmt.Sprintf("%s is %v %v in the checkpoint, %v %v in the model",
				p.Name, t.Dtype(), t.Shape(), p.Value.Dtype(), p.Value.Shape()))
		}
	}
	state := map[string]*tensor.Dense{}
	for _, n := range f.Names() {
		if rest, ok := strings.CutPrefix(n, optimPrefix); ok {
			t, _ := f.Get(n)
			state[rest] = t
		} else if !inModel[n] {
			unknown = append(unknown, n)
		}
	}
	if len(missing) > 0 || len(unknown) > 0 || len(misfit) > 0 {
		return r, fmt.Errorf("the checkpoint does not fit this model (missing: [%s]; not in the model: [%s]; other shapes: [%s]): %w",
			strings.Join(missing, ", "), strings.Join(unknown, ", "), strings.Join(misfit, "; "), checkpoint.ErrMismatch)
	}
	var schedState *optim.SchedulerState
	if js, ok := f.Metadata["scheduler"]; ok && sched != nil {
		schedState = new(optim.SchedulerState)
		if err := json.Unmarshal([]byte(js), schedState); err != nil {
			return r, fmt.Errorf("metadata \"scheduler\": %w", err)
		}
		// What the scheduler's LoadState accepts, checked before anything changes.
		if st := *schedState; st.LastEpoch < 0 || st.StepCount < 1 || !(st.LastLR >= 0) || !(st.BaseLR >= 0) {
			return r, fmt.Errorf("metadata \"scheduler\" holds an invalid state %+v: %w", st, checkpoint.ErrFormat)
		}
	}
	if err := opt.LoadState(state); err != nil {
		return r, fmt.Errorf("optimizer state: %w", err)
	}
	if schedState != nil {
		if err := sched.LoadState(*schedState); err != nil {
			return r, fmt.Errorf("metadata \"scheduler\": %w", err)
		}
	}
	if err := checkpoint.CopyInto(model, f, checkpoint.NonStrict()); err != nil {
		return r, err
	}
	r.Epoch = epoch
	r.Settings = f.Metadata
	if len(r.History) > epoch {
		r.History = r.History[:epoch]
	}
	return r, nil
}
