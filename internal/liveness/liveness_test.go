package liveness

import (
	"strings"
	"testing"
	"time"
)

func TestResolve(t *testing.T) {
	c := Config{}.Resolve()
	if c.Timeout != Timeout || c.Interval != Interval {
		t.Fatalf("zero config resolved to %+v", c)
	}
	c = Config{Timeout: 600 * time.Millisecond}.Resolve()
	if c.Interval != 200*time.Millisecond {
		t.Fatalf("interval %v for a 600ms timeout, want a third of it", c.Interval)
	}
	if (Config{Timeout: -1}).Enabled() {
		t.Fatal("a negative timeout must turn the check off")
	}
}

func TestUnresponsiveText(t *testing.T) {
	s := Unresponsive(time.Now().Add(-2 * time.Second))
	if !strings.Contains(s, "unresponsive") || !strings.Contains(s, "2s") {
		t.Fatalf("message %q", s)
	}
}
