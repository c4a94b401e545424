package rpc

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tandemml/tandem/internal/testlog"
	"github.com/tandemml/tandem/launch"
)

// At INFO the agents log their rendezvous; at DETAIL also every call made
// and every request served, failed ones with their error; at OFF neither.
func TestDebugLevelLogs(t *testing.T) {
	for _, level := range []launch.DebugLevel{launch.DebugOff, launch.DebugInfo, launch.DebugDetail} {
		t.Run(level.String(), func(t *testing.T) {
			var logs testlog.Buffer
			agents := startGroup(t, 2, registerBasics, WithLogger(logs.Logger()), WithDebugLevel(level))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if v, err := Sync[int](ctx, agents[0], "w1", "add", [2]int{2, 3}); err != nil || v != 5 {
				t.Fatalf("add: %v, %v", v, err)
			}
			if _, err := Sync[int](ctx, agents[1], "w0", "fail", "no luck"); err == nil {
				t.Fatal("fail succeeded")
			}
			// A callee logs a request it served after it has replied: at
			// DETAIL give the second one a moment to appear.
			out := logs.String()
			for deadline := time.Now().Add(5 * time.Second); level == launch.DebugDetail &&
				strings.Count(out, `msg="rpc: request served"`) < 2 && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
				out = logs.String()
			}
			lines := func(prefix string) []string {
				var got []string
				for l := range strings.Lines(out) {
					if strings.Contains(l, `msg="`+prefix+`"`) {
						got = append(got, l)
					}
				}
				return got
			}
			met, calls, served := lines("rpc: workers met"), lines("rpc: call"), lines("rpc: request served")
			if level == launch.DebugOff {
				if len(met)+len(calls)+len(served) != 0 {
					t.Fatalf("at OFF the agents logged:\n%s", out)
				}
				return
			}
			if len(met) != 2 {
				t.Fatalf("%d rendezvous lines, want one per worker:\n%s", len(met), out)
			}
			for _, l := range met {
				if !strings.Contains(l, "world_size=2") || !strings.Contains(l, "workers=\"[w0 w1]\"") || !strings.Contains(l, "took=") {
					t.Errorf("rendezvous line without world size, workers or duration: %s", l)
				}
			}
			if level == launch.DebugInfo {
				if len(calls)+len(served) != 0 {
					t.Fatalf("at INFO the agents logged calls:\n%s", out)
				}
				return
			}
			if len(calls) != 2 || len(served) != 2 {
				t.Fatalf("%d call and %d request lines, want 2 of each:\n%s", len(calls), len(served), out)
			}
			want := []struct{ line, has string }{
				{strings.Join(calls, ""), "worker=w0 to=w1 fn=add took="},
				{strings.Join(calls, ""), "worker=w1 to=w0 fn=fail took="},
				{strings.Join(calls, ""), "no luck"},
				{strings.Join(served, ""), "worker=w1 from=w0 fn=add err=<nil>"},
				{strings.Join(served, ""), "worker=w0 from=w1 fn=fail err="},
			}
			for _, w := range want {
				if !strings.Contains(w.line, w.has) {
					t.Errorf("no %q in:\n%s", w.has, w.line)
				}
			}
		})
	}
}
