package optim

import (
	"fmt"
	"math"
)

// Scheduler changes an optimizer's learning rate once per epoch. Construction
// counts as epoch 0 and leaves the learning rate as it is; each Step moves to
// the next epoch and sets the optimizer's learning rate (torch:
// scheduler.step(), called after the epoch's optimizer steps).
//
// Both schedulers here use PyTorch's recursive ("chainable") form: the new
// rate is computed from the optimizer's current rate, not from the epoch
// alone, so that several schedulers can act on one optimizer and a rate set
// by hand carries on. They reproduce torch.optim.lr_scheduler's arithmetic
// operation by operation (cosines correctly rounded, as C's cos returns them).
type Scheduler interface {
	// Step advances one epoch and updates the optimizer's learning rate.
	Step()
	// LastEpoch is the epoch the current rate belongs to (0 after construction).
	LastEpoch() int
	// LastLR is the rate the scheduler last set (torch: get_last_lr()[0]).
	LastLR() float64
	// State and LoadState save and restore the scheduler's counters for a
	// checkpoint (torch: state_dict, load_state_dict).
	State() SchedulerState
	LoadState(SchedulerState) error
}

// SchedulerState is what a scheduler needs to resume: torch's last_epoch,
// _step_count, base_lrs[0] and _last_lr[0].
type SchedulerState struct {
	LastEpoch int
	StepCount int
	BaseLR    float64
	LastLR    float64
}

// schedule is the part every scheduler shares: torch's LRScheduler.
type schedule struct {
	opt   Optimizer
	st    SchedulerState
	rule  func(s *SchedulerState, lr float64) float64
	label string
}

func newSchedule(label string, opt Optimizer, rule func(*SchedulerState, float64) float64) schedule {
	s := schedule{opt: opt, rule: rule, label: label, st: SchedulerState{LastEpoch: -1, BaseLR: opt.LR()}}
	s.Step() // the initial step: epoch 0, rate unchanged
	return s
}

func (s *schedule) Step() {
	s.st.StepCount++
	s.st.LastEpoch++
	lr := s.rule(&s.st, s.opt.LR())
	s.opt.SetLR(lr)
	s.st.LastLR = lr
}

func (s *schedule) LastEpoch() int        { return s.st.LastEpoch }
func (s *schedule) LastLR() float64       { return s.st.LastLR }
func (s *schedule) State() SchedulerState { return s.st }

func (s *schedule) LoadState(st SchedulerState) error {
	if st.LastEpoch < 0 || st.StepCount < 1 || math.IsNaN(st.BaseLR) || math.IsNaN(st.LastLR) {
		return fmt.Errorf("optim: %s: invalid scheduler state %+v (needs LastEpoch >= 0, StepCount >= 1): %w",
			s.label, st, ErrInvalidArgument)
	}
	s.st = st
	return nil
}

// StepLR multiplies the learning rate by gamma every stepSize epochs
// (torch.optim.lr_scheduler.StepLR). Recursive form: at epoch e > 0 with
// e % stepSize == 0 the rate becomes lr*gamma, otherwise it stays.
type StepLR struct{ schedule }

// NewStepLR returns a StepLR over opt. stepSize must be positive.
func NewStepLR(opt Optimizer, stepSize int, gamma float64) (*StepLR, error) {
	if opt == nil {
		return nil, fmt.Errorf("optim: StepLR: nil optimizer: %w", ErrInvalidArgument)
	}
	if stepSize <= 0 {
		return nil, fmt.Errorf("optim: StepLR: step size must be positive, got %d: %w", stepSize, ErrInvalidArgument)
	}
	if err := validFinite("StepLR", "gamma", gamma); err != nil {
		return nil, err
	}
	rule := func(s *SchedulerState, lr float64) float64 {
		if s.LastEpoch == 0 || s.LastEpoch%stepSize != 0 {
			return lr
		}
		return lr * gamma
	}
	return &StepLR{newSchedule("StepLR", opt, rule)}, nil
}

// CosineAnnealingLR anneals the learning rate from its initial value (the
// optimizer's rate at construction) to etaMin along half a cosine over tMax
// epochs, then back up, periodically (torch.optim.lr_scheduler.
// CosineAnnealingLR, without restarts). Recursive form, at epoch e > 0:
//
//	if (e-1-tMax) % (2*tMax) == 0:
//	    lr = lr + (base - etaMin)*(1 - cos(pi/tMax))/2
//	else:
//	    lr = (1 + cos(pi*e/tMax)) / (1 + cos(pi*(e-1)/tMax)) * (lr - etaMin) + etaMin
//
// To resume a schedule, restore its SchedulerState with LoadState (and the
// optimizer's rate with the optimizer's LoadState).
type CosineAnnealingLR struct{ schedule }

// NewCosineAnnealingLR returns a CosineAnnealingLR over opt with period tMax
// epochs (positive) and floor etaMin.
func NewCosineAnnealingLR(opt Optimizer, tMax int, etaMin float64) (*CosineAnnealingLR, error) {
	if opt == nil {
		return nil, fmt.Errorf("optim: CosineAnnealingLR: nil optimizer: %w", ErrInvalidArgument)
	}
	if tMax <= 0 {
		return nil, fmt.Errorf("optim: CosineAnnealingLR: T_max must be positive, got %d: %w", tMax, ErrInvalidArgument)
	}
	if err := validFinite("CosineAnnealingLR", "eta_min", etaMin); err != nil {
		return nil, err
	}
	T := float64(tMax)
	rule := func(s *SchedulerState, lr float64) float64 {
		e := s.LastEpoch
		E := float64(e)
		switch {
		case e == 0:
			return lr
		case (e-1-tMax)%(2*tMax) == 0:
			c := 1 - cosRounded(math.Pi/T)
			return lr + float64(float64(s.BaseLR-etaMin)*c)/2
		}
		num := 1 + cosRounded(float64(math.Pi*E)/T)
		den := 1 + cosRounded(float64(math.Pi*float64(e-1))/T)
		return float64(float64(num/den)*(lr-etaMin)) + etaMin
	}
	return &CosineAnnealingLR{newSchedule("CosineAnnealingLR", opt, rule)}, nil
}
