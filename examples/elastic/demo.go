package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tandemml/tandem/comm/store"
)

// runDemo plays the README's story on this machine: it serves the job's
// store, starts members a, b and c, kills b with SIGKILL when training is
// killAt done, starts a new member d when it is addAt done, and when the
// job ends checks that every member holds the same weights.
func runDemo(ctx context.Context, cfg config, extra []string, killAt, addAt float64, w io.Writer) error {
	var secret [16]byte
	rand.Read(secret[:])
	token := hex.EncodeToString(secret[:])
	srv, err := store.NewServer("127.0.0.1:0", store.WithToken(token))
	if err != nil {
		return err
	}
	sctx, stopStore := context.WithCancel(ctx)
	defer stopStore()
	go srv.Serve(sctx)
	defer srv.Close()
	dir, err := os.MkdirTemp("", "tandem-elastic-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	fmt.Fprintf(w, "demo: the job's store serves at %s; members a, b, c start\n", srv.Addr())

	exe, err := os.Executable()
	if err != nil {
		return err
	}
	progress := make(chan float64, 64)
	var outMu sync.Mutex
	start := func(id string) (*exec.Cmd, error) {
		args := []string{"-store", srv.Addr(), "-id", id, "-report", filepath.Join(dir, id+".json"),
			"-min", strconv.Itoa(cfg.Min), "-max", strconv.Itoa(cfg.Max), "-epochs", strconv.Itoa(cfg.Epochs),
			"-batch", strconv.Itoa(cfg.Batch), "-base", strconv.Itoa(cfg.Base), "-lr", fmt.Sprint(cfg.LR),
			"-limit", strconv.Itoa(cfg.Limit), "-seed", fmt.Sprint(cfg.Seed), "-every", fmt.Sprint(cfg.Every),
			"-step-delay", cfg.StepDelay.String(), "-eval=" + strconv.FormatBool(cfg.Eval), "-v=" + strconv.FormatBool(cfg.Verbose),
			"-channels1", strconv.Itoa(cfg.C1), "-channels2", strconv.Itoa(cfg.C2), "-hidden", strconv.Itoa(cfg.H)}
		if cfg.Data != "" {
			args = append(args, "-data", cfg.Data)
		}
		cmd := exec.CommandContext(ctx, exe, append(args, extra...)...)
		cmd.Env = append(os.Environ(), "TANDEM_TOKEN="+token)
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				line := sc.Text()
				outMu.Lock()
				fmt.Fprintln(w, line)
				outMu.Unlock()
				if _, rest, ok := strings.Cut(line, "] progress "); ok {
					if f, err := strconv.ParseFloat(strings.Fields(rest)[0], 64); err == nil {
						select {
						case progress <- f:
						default:
						}
					}
				}
			}
		}()
		return cmd, nil
	}
	say := func(format string, a ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(w, "demo: "+format+"\n", a...)
	}

	members := map[string]*exec.Cmd{}
	for _, id := range []string{"a", "b", "c"} {
		if members[id], err = start(id); err != nil {
			return err
		}
	}
	waits := make(chan error, 4)
	wait := func(id string, cmd *exec.Cmd) {
		err := cmd.Wait()
		if err != nil {
			err = fmt.Errorf("member %s: %w", id, err)
		}
		waits <- err
	}
	go wait("a", members["a"])
	go wait("c", members["c"])
	killed, added := false, false
	running := 2
	bDone := make(chan struct{})
	go func() { members["b"].Wait(); close(bDone) }()
	for running > 0 {
		select {
		case f := <-progress:
			if !killed && f >= killAt {
				killed = true
				members["b"].Process.Signal(syscall.SIGKILL)
				<-bDone
				say("killed member b with SIGKILL at %.0f%% of the training", 100*f)
			}
			if killed && !added && f >= addAt {
				added = true
				d, err := start("d")
				if err != nil {
					return err
				}
				running++
				go wait("d", d)
				say("started a new member d at %.0f%% of the training", 100*f)
			}
		case err := <-waits:
			running--
			if err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if !killed || !added {
		return fmt.Errorf("the training ended before the demo could kill a member (%v) and add one (%v); use a larger -limit or -epochs", killed, added)
	}
	return summarize(dir, []string{"a", "c", "d"}, w)
}

// summarize reads the members' reports and checks they agree.
func summarize(dir string, ids []string, w io.Writer) error {
	var reps []report
	for _, id := range ids {
		b, err := os.ReadFile(filepath.Join(dir, id+".json"))
		if err != nil {
			return fmt.Errorf("member %s left no report: %w", id, err)
		}
		var r report
		if err := json.Unmarshal(b, &r); err != nil {
			return err
		}
		reps = append(reps, r)
	}
	for _, r := range reps {
		if r.Finished {
			return fmt.Errorf("member %s never got a place: the job ended before it was admitted; use a larger -limit or -epochs", r.ID)
		}
	}
	same := true
	for _, r := range reps[1:] {
		same = same && r.Weights == reps[0].Weights && r.Step == reps[0].Step
	}
	fmt.Fprintf(w, "demo: the job ended at step %d with %d members; identical weights on all: %v\n", reps[0].Step, reps[0].Size, same)
	for _, r := range reps {
		for i, e := range r.Events {
			if i == 0 && r.ID != "d" {
				continue // the first round
			}
			fmt.Fprintf(w, "demo: member %s: round %d of %d members from step %d, resumed %v after it noticed (%s)%s\n",
				r.ID, e.Round, e.Size, e.Step, e.Resumed.Sub(e.Detected).Round(time.Millisecond), shorten(e.Reason), map[bool]string{true: ", healed"}[e.Healed])
		}
		if r.Accuracy > 0 {
			fmt.Fprintf(w, "demo: test accuracy %.2f%%\n", 100*r.Accuracy)
		}
	}
	if !same {
		return fmt.Errorf("the members ended with different weights")
	}
	return nil
}

func shorten(s string) string {
	if len(s) > 90 {
		return s[:87] + "..."
	}
	return s
}
