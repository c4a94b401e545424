//go:build unix

package main

// A member process of `tandem bench elastic`: it trains the benchmark's MLP
// data-parallel (package ddp) under an elastic.Manager that meets the other
// members in the bench's store, and reports on stdout, one JSON object a
// line, every committed step and every round it enters. It runs until it is
// killed; the bench decides when the run ends.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/data"
	"github.com/tandemml/tandem/ddp"
	"github.com/tandemml/tandem/elastic"
	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/optim"
)

// elasticMemberLine is one line a member prints: Kind "step" for a
// committed step (Step, T, Size), Kind "round" for a round it entered
// (the fields of elastic.Event).
type elasticMemberLine struct {
	Kind string `json:"kind"`
	ID   string `json:"id"`
	// Step: the step just committed (kind step), or the committed step the
	// round starts from (kind round).
	Step int64 `json:"step"`
	// T is when the step committed, Unix nanoseconds.
	T    int64 `json:"t,omitempty"`
	Size int   `json:"size"`
	// Round, Detected and Resumed (Unix nanoseconds), Healed and Reason:
	// the round's elastic.Event.
	Round    int    `json:"round,omitempty"`
	Detected int64  `json:"detected,omitempty"`
	Resumed  int64  `json:"resumed,omitempty"`
	Healed   bool   `json:"healed,omitempty"`
	Reason   string `json:"reason,omitempty"`
	// Members are the round's members in rank order (kind round).
	Members []string `json:"members,omitempty"`
}

// elasticMemberConfig is what the bench tells a member.
type elasticMemberConfig struct {
	store, job, id   string
	sizes            []int
	batch            int // global batch (elastic.FixedGlobalBatch)
	minSize, maxSize int
	seed             uint64 // the member's own initial weights: healing makes them agree
	verbose          bool
}

// elasticDataBatches is the synthetic data set's size in global batches.
const elasticDataBatches = 8

// elasticMember trains until ctx ends or a step fails for a reason of its
// own; a write error on stdout (the bench is gone) stops it too.
func elasticMember(ctx context.Context, cfg elasticMemberConfig, stdout io.Writer) error {
	level := slog.LevelError
	if cfg.verbose {
		level = slog.LevelInfo
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("member", cfg.id)
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	st, err := store.Dial(dctx, cfg.store)
	cancel()
	if err != nil {
		return fmt.Errorf("member %s: reaching the bench's store: %w", cfg.id, err)
	}
	defer st.Close()
	m, err := elastic.New(ctx, st, elastic.Config{Job: cfg.job, ID: cfg.id, MinSize: cfg.minSize, MaxSize: cfg.maxSize,
		Batch: elastic.FixedGlobalBatch(cfg.batch), Logger: logger})
	if err != nil {
		return err
	}
	defer m.Close()

	model, err := models.NewMLP(cfg.sizes, models.WithRand(mrand.New(mrand.NewPCG(cfg.seed, 1))), models.WithDtype(tensor.Float32))
	if err != nil {
		return err
	}
	opt, err := optim.NewSGD(model.Params(), optim.LR(0.01), optim.Momentum(0.9))
	if err != nil {
		return err
	}
	// The data: the same synthetic set on every member (seeded alike).
	in, classes := cfg.sizes[0], cfg.sizes[len(cfg.sizes)-1]
	n := elasticDataBatches * cfg.batch
	rng := mrand.New(mrand.NewPCG(42, 42))
	xs := make([]float32, n*in)
	for i := range xs {
		xs[i] = float32(rng.NormFloat64())
	}
	ys := make([]int64, n)
	for i := range ys {
		ys[i] = int64(rng.IntN(classes))
	}
	sampler, err := data.NewRandomSampler(n, 7)
	if err != nil {
		return err
	}
	stream, err := elastic.NewStream(sampler)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(stdout)
	state := elastic.ModuleState(model, opt)
	var net *ddp.DDP
	for {
		r, err := m.Quorum(ctx, state)
		if err != nil {
			return fmt.Errorf("member %s: %w", cfg.id, err)
		}
		if r.Changed {
			evs := m.Events()
			ev := evs[len(evs)-1]
			if err := enc.Encode(elasticMemberLine{Kind: "round", ID: cfg.id, Step: ev.Step, Size: ev.Size, Round: ev.Round,
				Detected: ev.Detected.UnixNano(), Resumed: ev.Resumed.UnixNano(), Healed: ev.Healed, Reason: ev.Reason, Members: r.Members}); err != nil {
				return err
			}
			if net, err = ddp.New(ctx, r.Group, model); err != nil {
				// The round broke while DDP set up: the next Quorum
				// forms another.
				if _, cerr := m.Commit(ctx, err); cerr != nil {
					return fmt.Errorf("member %s: ddp: %w", cfg.id, cerr)
				}
				continue
			}
		}
		idx := m.Indices(stream)
		x := make([]float32, len(idx)*in)
		y := make([]int64, len(idx))
		for k, i := range idx {
			copy(x[k*in:(k+1)*in], xs[i*in:(i+1)*in])
			y[k] = ys[i]
		}
		_, stepErr := net.Step(ctx, tensor.New(tensor.WithShape(len(idx), in), tensor.WithBacking(x)),
			tensor.New(tensor.WithShape(len(idx)), tensor.WithBacking(y)))
		ok, err := m.Commit(ctx, stepErr)
		if err != nil {
			return fmt.Errorf("member %s: step %d: %w", cfg.id, m.Progress().Step+1, err)
		}
		if !ok {
			continue
		}
		if err := opt.Step(); err != nil {
			return err
		}
		if err := enc.Encode(elasticMemberLine{Kind: "step", ID: cfg.id, Step: m.Progress().Step, T: time.Now().UnixNano(), Size: r.Size}); err != nil {
			return err
		}
	}
}
