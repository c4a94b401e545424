package comm

import (
	"context"
	"fmt"

	"github.com/tandemml/tandem/internal/errs"
)

// Work is the handle of an operation in flight, returned at once by every
// asynchronous call of a ProcessGroup.
type Work interface {
	// Wait blocks until the operation finished on this rank and returns its
	// error, or until ctx is done: then it returns an error wrapping
	// ErrTimeout and context.DeadlineExceeded after a deadline,
	// context.Canceled after a cancellation, and the operation goes on,
	// bounded by the context it was started with. A nil ctx is refused with
	// ErrInvalidArgument.
	Wait(ctx context.Context) error
	// Done is closed when the operation finished on this rank.
	Done() <-chan struct{}
	// Err returns the operation's error once Done is closed, nil before.
	Err() error
}

// work is the one implementation of Work.
type work struct {
	desc  string
	seq   int64 // collective sequence number, -1 for other operations
	group string
	done  chan struct{}
	err   error
}

func newWork(desc string) *work { return &work{desc: desc, seq: -1, done: make(chan struct{})} }

func (w *work) String() string {
	if w.seq >= 0 {
		return fmt.Sprintf("%s #%d on group %q", w.desc, w.seq, w.group)
	}
	return w.desc
}

// failedWork returns a Work that is already finished with err.
func failedWork(desc string, err error) *work {
	w := newWork(desc)
	w.finish(err)
	return w
}

func (w *work) finish(err error) {
	w.err = err
	close(w.done)
}

func (w *work) Done() <-chan struct{} { return w.done }

func (w *work) Err() error {
	select {
	case <-w.done:
		return w.err
	default:
		return nil
	}
}

func (w *work) Wait(ctx context.Context) error {
	if err := errs.CheckContext(ctx, "comm", "wait"); err != nil {
		return err
	}
	select {
	case <-w.done:
		return w.err
	default:
	}
	select {
	case <-w.done:
		return w.err
	case <-ctx.Done():
		return errs.FromContext(ctx, "comm: wait for "+w.String())
	}
}

// multiWork completes when all of its parts have.
func joinWork(desc string, parts []*work) *work {
	w := newWork(desc)
	go func() {
		var first error
		for _, p := range parts {
			<-p.done
			if p.err != nil && first == nil {
				first = p.err
			}
		}
		w.finish(first)
	}()
	return w
}
