package rref

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tandemml/tandem/rpc"
)

// How an RRef travels: the owner's id, the RRef's id, the fork id made for
// the receiver, the sender (the fork's parent) and the value's type name.
//
// The fork protocol (PyTorch's RRefContext, in this package's terms):
//   - The owner sends its reference: it registers the new fork before
//     sending, so the receiving user is confirmed at once.
//   - A user sends its reference: it keeps the new fork as a pending child,
//     which holds its own reference alive (a Release waits for the
//     children). A receiving user registers as pending and asks the owner
//     to add the fork; once the owner confirms, the user tells the parent,
//     which drops the pending child. A receiving owner finds its value and
//     tells the parent at once.
//   - The owner deletes a value when every registered fork is released and
//     only owner references on the owner itself remain. A delete that
//     overtakes its fork's registration is remembered (a tombstone), so
//     message order does not matter.

// MarshalRPC writes the reference for the worker it is sent to, forking it.
func (r *RRef[T]) MarshalRPC(e *rpc.Encoder) error {
	st := r.st
	a := e.Agent()
	if rc, err := contextOf(a); err != nil || rc != st.rc {
		return fmt.Errorf("%w: rref: %s can only be sent through the agent that holds it", rpc.ErrInvalidArgument, st.id)
	}
	rc := st.rc
	fork := rc.newID()
	if st.entry != nil {
		rc.addFork(st.entry, fork)
		e.OnUnsent(func() { rc.delFork(st.id, fork) })
	} else {
		if st.released.Load() {
			return fmt.Errorf("%w: rref: sending %s after Release", rpc.ErrInvalidArgument, st.id)
		}
		rc.mu.Lock()
		st.pendingChildren++
		rc.children[fork] = st
		rc.mu.Unlock()
		// A child that is never accepted (the receiver died, the call was
		// never delivered) stops holding the parent after a while.
		time.AfterFunc(rc.childTimeout(), func() { rc.childDone(fork) })
		e.OnUnsent(func() { rc.childDone(fork) })
	}
	e.Uvarint(uint64(st.owner.ID))
	writeID(e, st.id)
	writeID(e, fork)
	e.Uvarint(uint64(rc.agent.Self().ID))
	e.String(st.typeName)
	return nil
}

func writeID(e *rpc.Encoder, id ID) {
	e.Uvarint(uint64(id.Worker))
	e.Uvarint(id.Seq)
}

func readID(d *rpc.Decoder) (ID, error) {
	w, err := d.Uvarint()
	if err != nil {
		return ID{}, err
	}
	s, err := d.Uvarint()
	return ID{Worker: int(w), Seq: s}, err
}

// UnmarshalRPC reads a reference sent to this worker and runs the receiving
// side of the fork protocol.
func (r *RRef[T]) UnmarshalRPC(d *rpc.Decoder) error {
	a := d.Agent()
	if a == nil {
		return fmt.Errorf("%w: rref: an RRef can only be received by an agent", rpc.ErrInvalidArgument)
	}
	rc, err := contextOf(a)
	if err != nil {
		return err
	}
	ownerID, err := d.Uvarint()
	if err != nil {
		return err
	}
	id, err := readID(d)
	if err != nil {
		return err
	}
	fork, err := readID(d)
	if err != nil {
		return err
	}
	parentID, err := d.Uvarint()
	if err != nil {
		return err
	}
	tn, err := d.String()
	if err != nil {
		return err
	}
	if want := typeNameOf[T](); tn != want {
		return fmt.Errorf("%w: rref: received an RRef[%s] where an RRef[%s] was expected", rpc.ErrWrongType, tn, want)
	}
	owner, err := a.WorkerByID(int(ownerID))
	if err != nil {
		return err
	}
	parent, err := a.WorkerByID(int(parentID))
	if err != nil {
		return err
	}
	self := a.Self()
	if owner.ID == self.ID {
		var e *ownerEntry
		if parent.ID == self.ID {
			if e = rc.lookup(id); e == nil {
				return fmt.Errorf("%w: rref: %s is not (or no longer) owned by %s", rpc.ErrInvalidArgument, id, self)
			}
			// Sent by the owner to itself: the fork it registered is not needed.
			rc.delFork(id, fork)
		} else {
			// The parent's fork keeps the value listed (or its creation is
			// still on the way).
			e = rc.entry(id)
			rc.tellParent(parent, fork)
		}
		*r = RRef[T]{st: &state{rc: rc, owner: self, id: id, entry: e, typeName: tn, created: rpc.Ready(struct{}{}, nil)}}
		r.st.confirmed.Store(true)
		return nil
	}
	st := &state{rc: rc, owner: owner, id: id, fork: fork, typeName: tn, created: rpc.NewFuture[struct{}]()}
	rc.mu.Lock()
	rc.users[fork] = st
	rc.mu.Unlock()
	if parent.ID == owner.ID {
		st.confirmed.Store(true)
		st.created.Complete(struct{}{}, nil)
	} else {
		started := a.Go(func(ctx context.Context) {
			ctx, cancel := context.WithTimeout(ctx, a.DefaultTimeout())
			defer cancel()
			_, err := rpc.Sync[struct{}](ctx, a, owner.Name, fnFork, forkReq{ID: id, Fork: fork})
			if err != nil {
				a.Logger().Warn("rref: the owner did not confirm a fork", "rref", id.String(), "owner", owner.Name, "err", err)
				st.created.Complete(struct{}{}, fmt.Errorf("rref: owner %s did not confirm %s: %w", owner, id, err))
				return
			}
			st.confirmed.Store(true)
			st.created.Complete(struct{}{}, nil)
			rc.tellParent(parent, fork)
		})
		if !started {
			st.created.Complete(struct{}{}, fmt.Errorf("%w: rref: worker %s closed before the owner %s confirmed %s", rpc.ErrClosed, a.Self(), owner, id))
		}
	}
	r.bind(st)
	return nil
}

// tellParent tells a fork's parent that the fork is accepted.
func (rc *refContext) tellParent(parent rpc.WorkerInfo, fork ID) {
	if parent.ID == rc.agent.Self().ID {
		rc.childDone(fork)
		return
	}
	rc.agent.Go(func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, rc.agent.DefaultTimeout())
		defer cancel()
		if _, err := rpc.Sync[struct{}](ctx, rc.agent, parent.Name, fnAccept, acceptReq{Fork: fork}); err != nil && !errors.Is(err, rpc.ErrClosed) && !errors.Is(err, context.Canceled) {
			rc.agent.Logger().Warn("rref: telling a parent its fork was accepted failed", "parent", parent.Name, "fork", fork.String(), "err", err)
		}
	})
}

// childDone drops a pending child; a parent whose release waited for its
// children sends its delete now.
func (rc *refContext) childDone(fork ID) {
	rc.mu.Lock()
	st := rc.children[fork]
	delete(rc.children, fork)
	send := false
	if st != nil {
		st.pendingChildren--
		send = st.pendingChildren == 0 && st.releaseWanted
	}
	rc.mu.Unlock()
	if !send {
		return
	}
	rc.agent.Go(func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, rc.agent.DefaultTimeout())
		defer cancel()
		if err := st.sendDelete(ctx); err != nil && !errors.Is(err, rpc.ErrClosed) && !errors.Is(err, context.Canceled) {
			rc.agent.Logger().Warn("rref: delayed release failed", "rref", st.id.String(), "err", err)
		}
	})
}
