package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// fakeClock advances by step on every call.
func fakeClock(step time.Duration) func() time.Time {
	t := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	return func() time.Time {
		t = t.Add(step)
		return t
	}
}

func TestProgressLines(t *testing.T) {
	var buf bytes.Buffer
	// One second per step: after 10 of 40 steps, 30 s remain.
	p := newProgress(&buf, progressLines, 25, "epoch 1/3", 40, fakeClock(time.Second))
	for i := 1; i <= 40; i++ {
		p.update(i, 2.0/float64(i))
	}
	p.finish()
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("got %d lines, want one per 25%%:\n%s", len(lines), buf.String())
	}
	want := []string{
		"epoch 1/3  25% 10/40 loss 0.2000  1.0 step/s  elapsed 0:10  ETA 0:30",
		"epoch 1/3  50% 20/40",
		"epoch 1/3  75% 30/40",
		"epoch 1/3 100% 40/40 loss 0.0500  1.0 step/s  elapsed 0:40  ETA 0:00",
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d = %q, want prefix %q", i, lines[i], w)
		}
	}
	if strings.Contains(buf.String(), "\r") {
		t.Error("line mode wrote a carriage return")
	}
}

func TestProgressBar(t *testing.T) {
	var buf bytes.Buffer
	p := newProgress(&buf, progressBar, 10, "epoch 2/3", 4, fakeClock(time.Second))
	for i := 1; i <= 4; i++ {
		p.update(i, 1)
	}
	p.finish()
	out := buf.String()
	if n := strings.Count(out, "\r"); n != 4 {
		t.Errorf("%d redraws, want 4 (steps a second apart):\n%q", n, out)
	}
	if !strings.Contains(out, "[=======>                      ]  25% 1/4") {
		t.Errorf("no quarter-full bar in %q", out)
	}
	if !strings.Contains(out, "[==============================] 100% 4/4") || !strings.HasSuffix(out, "\n") {
		t.Errorf("no full bar and final newline in %q", out)
	}
}

func TestProgressBarThrottles(t *testing.T) {
	var buf bytes.Buffer
	p := newProgress(&buf, progressBar, 10, "e", 1000, fakeClock(time.Millisecond))
	for i := 1; i <= 1000; i++ {
		p.update(i, 1)
	}
	// A step per millisecond, a redraw per 100 ms at most, plus the last.
	if n := strings.Count(buf.String(), "\r"); n > 12 {
		t.Errorf("%d redraws for 1000 steps in one second", n)
	}
}

func TestProgressOff(t *testing.T) {
	var buf bytes.Buffer
	p := newProgress(&buf, progressOff, 10, "e", 3, nil)
	p.update(1, 1)
	p.update(3, 1)
	p.finish()
	if buf.Len() != 0 {
		t.Errorf("wrote %q", buf.String())
	}
}

func TestParseProgressMode(t *testing.T) {
	var buf bytes.Buffer
	for in, want := range map[string]progressMode{"auto": progressLines, "bar": progressBar, "lines": progressLines, "off": progressOff} {
		got, err := parseProgressMode(in, &buf) // a buffer is no terminal
		if err != nil || got != want {
			t.Errorf("%q: got %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := parseProgressMode("loud", &buf); err == nil {
		t.Error("unknown mode accepted")
	}
}

func TestClock(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                      "0:00",
		59 * time.Second:       "0:59",
		61*time.Second + 400e6: "1:01",
		3*time.Hour + 2*time.Minute + 5*time.Second: "3:02:05",
		-time.Second: "0:00",
	} {
		if got := clock(d); got != want {
			t.Errorf("clock(%v) = %q, want %q", d, got, want)
		}
	}
}
