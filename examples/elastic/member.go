package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/data"
	"github.com/tandemml/tandem/ddp"
	"github.com/tandemml/tandem/elastic"
	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/optim"
)

// report is what a member writes with -report when training ends.
type report struct {
	ID       string          `json:"id"`
	Step     int64           `json:"step"`
	Samples  int64           `json:"samples"`
	Rank     int             `json:"rank"`
	Size     int             `json:"size"`
	Weights  string          `json:"weights"`            // sha256 of the parameters
	Accuracy float64         `json:"accuracy,omitempty"` // rank 0, with -eval
	Events   []elastic.Event `json:"events"`
	Finished bool            `json:"finished"` // the job ended while this member waited for a round
}

// Fashion-MNIST's pixel mean and standard deviation, as make demo uses them.
const fashionMean, fashionStd = 0.2860, 0.3530

// runMember trains as one member of the job until the job has seen
// -epochs passes over the training set.
func runMember(ctx context.Context, cfg config, w io.Writer) error {
	trainSet, testSet, err := loadFashion(ctx, cfg)
	if err != nil {
		return err
	}
	st, err := store.NewTCP(ctx, cfg.Store, false, store.WithToken(cfg.Token))
	if err != nil {
		return fmt.Errorf("dialling the job's store: %w", err)
	}
	defer st.Close()

	// Every member builds the model alike; a newcomer's weights are
	// replaced by a live member's when it joins anyway.
	model, err := models.NewCNN(models.CNNConfig{Channels1: cfg.C1, Channels2: cfg.C2, Hidden: cfg.H}, rand.New(rand.NewPCG(cfg.Seed, 0x5eed)), models.WithDtype(tensor.Float32))
	if err != nil {
		return err
	}
	opt, err := optim.NewSGD(model.Params(), optim.LR(cfg.LR), optim.Momentum(0.9))
	if err != nil {
		return err
	}
	loader, err := data.NewLoader(trainSet, cfg.Batch)
	if err != nil {
		return err
	}
	n := trainSet.Len()
	if cfg.Limit > 0 {
		n = min(n, cfg.Limit) // the first -limit examples only
	}
	sampler, err := data.NewRandomSampler(n, cfg.Seed)
	if err != nil {
		return err
	}
	stream, err := elastic.NewStream(sampler)
	if err != nil {
		return err
	}
	// The rounds are reported below; the library's own warnings about the
	// faults (and comm's flight records) are on stderr at -v.
	level := slog.LevelError
	if cfg.Verbose {
		level = slog.LevelWarn
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("member", cfg.ID)
	m, err := elastic.New(ctx, st, elastic.Config{
		Job: "fashion", ID: cfg.ID, MinSize: cfg.Min, MaxSize: cfg.Max,
		// Each member keeps its batch; the learning rate follows the
		// global batch (the linear scaling rule, from -base members).
		Batch:       elastic.PerRankBatchScaleLR(cfg.Batch, cfg.Base),
		InitOptions: []comm.InitOption{comm.WithToken(cfg.Token)},
		Logger:      logger,
	})
	if err != nil {
		return err
	}
	defer m.Close()

	total := int64(cfg.Epochs) * int64(n)
	state := elastic.ModuleState(model, opt)
	var (
		net       *ddp.DDP
		round     elastic.Round
		nextPrint = cfg.Every
		since     = time.Now()
		sinceStep int64
		lossSum   float64
		lossN     int
	)
	for m.Progress().Samples < total {
		round, err = m.Quorum(ctx, state)
		if errors.Is(err, elastic.ErrFinished) {
			fmt.Fprintf(w, "[%s] the job finished while this member waited for a place\n", cfg.ID)
			return writeReport(cfg, report{ID: cfg.ID, Finished: true, Events: m.Events()})
		}
		if err != nil {
			return err
		}
		if round.Changed {
			ev := m.Events()
			fmt.Fprintf(w, "[%s] round %d: %d members (%s), rank %d, from step %d%s (%s)\n", cfg.ID, round.Number, round.Size,
				strings.Join(round.Members, " "), round.Rank, m.Progress().Step, healedNote(round), brief(ev[len(ev)-1]))
			if net, err = ddp.New(ctx, round.Group, model); err != nil {
				// The round broke while DDP set up: vote the step down
				// and let the next Quorum form another.
				if _, err := m.Commit(ctx, err); err != nil {
					return err
				}
				continue
			}
		}
		p := m.Progress()
		// Cosine annealing over the epochs, as make demo's schedule,
		// times the batch rule's factor for this round's size.
		epoch := float64(p.Samples) / float64(n)
		opt.SetLR(cfg.LR * round.LRScale * 0.5 * (1 + math.Cos(math.Pi*math.Floor(epoch)/float64(cfg.Epochs))))

		batch, err := loader.Batch(ctx, m.Indices(stream))
		if err != nil {
			return err
		}
		loss, stepErr := net.Step(ctx, batch.X, batch.Y)
		ok, err := m.Commit(ctx, stepErr)
		if err != nil {
			return err
		}
		if !ok {
			continue // discarded on every member; the next Quorum reforms
		}
		if err := opt.Step(); err != nil {
			return err
		}
		lossSum, lossN = lossSum+loss, lossN+1
		if cfg.StepDelay > 0 {
			time.Sleep(cfg.StepDelay)
		}
		if done := float64(m.Progress().Samples) / float64(total); done >= nextPrint && round.Rank == 0 {
			steps := m.Progress().Step - sinceStep
			fmt.Fprintf(w, "[%s] progress %.3f  epoch %.2f  step %d  members %d  loss %.4f  lr %.4g  %.1f step/s\n",
				cfg.ID, done, float64(m.Progress().Samples)/float64(n), m.Progress().Step, round.Size,
				lossSum/float64(max(lossN, 1)), opt.LR(), float64(steps)/time.Since(since).Seconds())
			for nextPrint <= done {
				nextPrint += cfg.Every
			}
			since, sinceStep, lossSum, lossN = time.Now(), m.Progress().Step, 0, 0
		}
	}
	if err := m.Finish(ctx); err != nil {
		return err
	}
	rep := report{ID: cfg.ID, Step: m.Progress().Step, Samples: m.Progress().Samples, Rank: round.Rank, Size: round.Size,
		Weights: weightsHash(model), Events: m.Events()}
	if cfg.Eval && round.Rank == 0 {
		if rep.Accuracy, err = evaluate(ctx, model, testSet); err != nil {
			return err
		}
		fmt.Fprintf(w, "[%s] done: %d steps, test accuracy %.2f%% (%d images)\n", cfg.ID, rep.Step, 100*rep.Accuracy, testSet.Len())
	}
	return writeReport(cfg, rep)
}

// brief says in a few words why a round formed and how long it took.
func brief(e elastic.Event) string {
	why := e.Reason
	switch {
	case strings.Contains(why, "first round"):
		return "first round"
	case strings.Contains(why, "waiting to join"):
		why = "a member waits to join"
	case strings.Contains(why, "peer lost"), strings.Contains(why, "unresponsive"), strings.Contains(why, "failed"):
		why = "a member was lost"
	}
	return fmt.Sprintf("%s; formed %v after it was noticed", why, e.Resumed.Sub(e.Detected).Round(time.Millisecond))
}

func healedNote(r elastic.Round) string {
	if r.Healed {
		return ", healed from " + r.Members[0]
	}
	return ""
}

func writeReport(cfg config, r report) error {
	if cfg.Report == "" {
		return nil
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(cfg.Report, b, 0o644)
}

// weightsHash fingerprints the parameters, so that members can be compared.
func weightsHash(m models.Module) string {
	h := sha256.New()
	for _, p := range m.Params() {
		for _, v := range p.Value.Data().([]float32) {
			binary.Write(h, binary.LittleEndian, math.Float32bits(v))
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// loadFashion loads both splits, normalised as make demo does.
func loadFashion(ctx context.Context, cfg config) (train, test data.Dataset, err error) {
	opts := []data.Option{data.Normalize(fashionMean, fashionStd), data.NoDownload()}
	if cfg.Data != "" {
		opts = append(opts, data.Dir(cfg.Data))
	}
	tr, err := data.FashionMNIST(ctx, "train", opts...)
	if err != nil {
		return nil, nil, err
	}
	te, err := data.FashionMNIST(ctx, "test", opts...)
	if err != nil {
		return nil, nil, err
	}
	return tr, te, nil
}
