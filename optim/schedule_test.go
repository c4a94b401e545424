package optim

import (
	"errors"
	"testing"

	"github.com/tandemml/tandem/models"
	"gorgonia.org/tensor"
)

func oneParamSGD(t *testing.T, lr float64) *SGD {
	t.Helper()
	p := &models.Param{Name: "w", Value: tensor.New(tensor.WithShape(2), tensor.WithBacking([]float64{1, 2}))}
	o, err := NewSGD([]*models.Param{p}, LR(lr))
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// TestSchedulesMatchPython compares whole schedules with the same recursive
// formulas evaluated by CPython on the C library (testdata/gen_libm.py).
func TestSchedulesMatchPython(t *testing.T) {
	for _, c := range loadLibm(t).Schedules {
		t.Run(c.Kind, func(t *testing.T) {
			opt := oneParamSGD(t, c.LR)
			var scheds []Scheduler
			if c.Kind == "step" || c.Kind == "chained" {
				s, err := NewStepLR(opt, c.StepSize, c.Gamma)
				if err != nil {
					t.Fatal(err)
				}
				scheds = append(scheds, s)
			}
			if c.Kind == "cosine" || c.Kind == "chained" {
				s, err := NewCosineAnnealingLR(opt, c.TMax, c.EtaMin)
				if err != nil {
					t.Fatal(err)
				}
				scheds = append(scheds, s)
			}
			if len(scheds) == 0 {
				t.Fatalf("unknown schedule kind %q", c.Kind)
			}
			exact := 0
			for e := 0; e <= c.Epochs; e++ {
				if e > 0 {
					for _, s := range scheds {
						s.Step()
					}
				}
				got, want := opt.LR(), c.LRs[e]
				if scheds[len(scheds)-1].LastLR() != got || scheds[0].LastEpoch() != e {
					t.Fatalf("epoch %d: LastLR %v / LastEpoch %d disagree with the optimizer's %v", e, scheds[0].LastLR(), scheds[0].LastEpoch(), got)
				}
				// C's cos is off by one ulp now and then (see cosRounded),
				// and the recursive form carries such a difference along.
				if u := ulps(got, want); u > 4 {
					t.Fatalf("epoch %d: lr %.17g, Python %.17g (%d ulp)", e, got, want, u)
				} else if u == 0 {
					exact++
				}
			}
			t.Logf("%s: %d of %d epochs bit-identical", c.Kind, exact, c.Epochs+1)
		})
	}
}

func TestStepLRClosedForm(t *testing.T) {
	opt := oneParamSGD(t, 1)
	s, err := NewStepLR(opt, 2, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	want := []float64{1, 1, 0.5, 0.5, 0.25, 0.25, 0.125}
	for e, w := range want {
		if e > 0 {
			s.Step()
		}
		if opt.LR() != w {
			t.Fatalf("epoch %d: lr %v, want %v", e, opt.LR(), w)
		}
	}
}

func TestCosineReachesEtaMinAndReturns(t *testing.T) {
	opt := oneParamSGD(t, 0.1)
	s, err := NewCosineAnnealingLR(opt, 4, 0.01)
	if err != nil {
		t.Fatal(err)
	}
	lrs := []float64{opt.LR()}
	for e := 1; e <= 8; e++ {
		s.Step()
		lrs = append(lrs, opt.LR())
	}
	if d := lrs[4] - 0.01; d > 1e-15 || d < -1e-15 {
		t.Errorf("lr at T_max = %v, want eta_min 0.01", lrs[4])
	}
	if d := lrs[8] - 0.1; d > 1e-15 || d < -1e-15 {
		t.Errorf("lr at 2*T_max = %v, want the initial 0.1", lrs[8])
	}
	for e := 1; e <= 4; e++ {
		if !(lrs[e] < lrs[e-1]) || !(lrs[e+4] > lrs[e+3]) {
			t.Errorf("schedule not monotone on each half period: %v", lrs)
		}
	}
}

func TestSchedulerStateResumes(t *testing.T) {
	a := oneParamSGD(t, 0.1)
	sa, _ := NewCosineAnnealingLR(a, 5, 0.001)
	for i := 0; i < 3; i++ {
		sa.Step()
	}
	saved, savedLR := sa.State(), a.LR()

	b := oneParamSGD(t, 0.1)
	sb, _ := NewCosineAnnealingLR(b, 5, 0.001)
	if err := sb.LoadState(saved); err != nil {
		t.Fatal(err)
	}
	b.SetLR(savedLR)
	for i := 0; i < 9; i++ {
		sa.Step()
		sb.Step()
		if a.LR() != b.LR() || sa.LastEpoch() != sb.LastEpoch() {
			t.Fatalf("resumed schedule diverged at step %d: %v vs %v", i, b.LR(), a.LR())
		}
	}
	if err := sb.LoadState(SchedulerState{LastEpoch: -3}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("LoadState of a negative epoch: %v, want ErrInvalidArgument", err)
	}
}

func TestSchedulerArguments(t *testing.T) {
	opt := oneParamSGD(t, 0.1)
	for name, err := range map[string]error{
		"step 0":    second(NewStepLR(opt, 0, 0.1)),
		"nil opt":   second(NewStepLR(nil, 1, 0.1)),
		"T_max 0":   second(NewCosineAnnealingLR(opt, 0, 0)),
		"nil opt 2": second(NewCosineAnnealingLR(nil, 3, 0)),
	} {
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
}

func second[T any](_ T, err error) error { return err }
