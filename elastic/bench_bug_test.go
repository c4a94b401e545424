package elastic_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
)

// A member that is stopped (SIGSTOP) long enough for the others to form a
// round without it, then continued, should find its round gone and join
// the running job again. It does not: its Quorum enters round latest+1 as
// an insider and never bumps the waiting counter, so the running members,
// which reconfigure only when a member fails or the waiting counter grows,
// never come to that round. With MinSize 2 the continued member waits
// until Config.JoinTimeout (or until some later fault makes the running
// members re-form); with MinSize 1 it decides round latest+1 by itself
// after LastCall and trains alone, beside the running job: two jobs with
// the same step numbers and diverging models.

// bugChildEnv makes the test binary a member process: "ADDR ID MINSIZE".
const bugChildEnv = "TANDEM_ELASTIC_BUG_MEMBER"

// TestHelperStoppedMember is a member process of TestStoppedMemberRejoins;
// in a normal run it does nothing. It trains until it is killed and prints
// "ROUND <size>" for every round it enters and "STEP <n>" for every
// committed step.
func TestHelperStoppedMember(t *testing.T) {
	spec := os.Getenv(bugChildEnv)
	if spec == "" {
		return
	}
	f := strings.Fields(spec)
	minSize, _ := strconv.Atoi(f[2])
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := store.NewTCP(ctx, f[0], false)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cfg := fastConfig()
	cfg.MinSize, cfg.MaxSize = minSize, 3
	mb := newMember(t, ctx, st, f[1], 1, cfg)
	defer mb.m.Close()
	seen := 0
	mb.beforeStep = func(int64) error {
		for _, ev := range mb.m.Events()[seen:] {
			fmt.Printf("ROUND %d\n", ev.Size)
		}
		seen = len(mb.m.Events())
		return nil
	}
	mb.afterCommit = func(step int64) {
		fmt.Printf("STEP %d\n", step)
		time.Sleep(15 * time.Millisecond)
	}
	mb.train(ctx, 1<<40)
}

// bugProc is a member process and its report lines.
type bugProc struct {
	cmd   *exec.Cmd
	lines chan string
}

func startBugMember(t *testing.T, addr, id string, minSize int) *bugProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperStoppedMember$", "-test.count=1")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %s %d", bugChildEnv, addr, id, minSize))
	if testing.Verbose() {
		cmd.Stderr = os.Stderr
	}
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &bugProc{cmd: cmd, lines: make(chan string, 1<<16)}
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return p
}

// next returns the next ROUND or STEP line within d, "" when none came.
func (p *bugProc) next(d time.Duration) string {
	select {
	case l := <-p.lines:
		return l
	case <-time.After(d):
		return ""
	}
}

// drain discards what p printed so far.
func (p *bugProc) drain() {
	for {
		select {
		case <-p.lines:
		default:
			return
		}
	}
}

// TestStoppedMemberRejoins stops one of three members for 2.5 s (the
// peer timeout is 1 s) and continues it: within 5 s it must be back in a
// round with the others and commit a step there.
func TestStoppedMemberRejoins(t *testing.T) {
	if testing.Short() {
		t.Skip("starts member processes")
	}
	for _, minSize := range []int{2, 1} {
		t.Run(fmt.Sprintf("MinSize %d", minSize), func(t *testing.T) {
			addr := serveStore(t)
			ps := []*bugProc{startBugMember(t, addr, "a", minSize), startBugMember(t, addr, "b", minSize), startBugMember(t, addr, "c", minSize)}
			c := ps[2]
			deadline := time.Now().Add(30 * time.Second)
			for {
				l := c.next(time.Until(deadline))
				if l == "" {
					t.Fatal("c committed no step 10 within 30s")
				}
				if n, ok := strings.CutPrefix(l, "STEP "); ok && n == "10" {
					break
				}
			}
			if err := c.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2500 * time.Millisecond)
			ps[0].drain()
			if err := c.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			cont := time.Now()
			c.drain() // what it had printed before the stop
			joined := false
			for {
				l := c.next(time.Until(cont.Add(5 * time.Second)))
				if l == "" {
					break
				}
				if s, ok := strings.CutPrefix(l, "ROUND "); ok {
					if s == "1" {
						t.Fatalf("after SIGCONT, c formed a round of its own (size 1) beside the running job %v after the SIGCONT: two jobs train apart", time.Since(cont).Round(time.Millisecond))
					}
					joined = true
				}
				if strings.HasPrefix(l, "STEP ") && joined {
					t.Logf("c trained again in a round of %d members %v after the SIGCONT", len(ps), time.Since(cont).Round(time.Millisecond))
					return
				}
			}
			// The premise: the others were training all along.
			if ps[0].next(time.Second) == "" {
				t.Fatal("a stopped training too (the test's premise failed)")
			}
			t.Fatal("c did not train again within 5s of the SIGCONT; the others train on in their round without it")
		})
	}
}
