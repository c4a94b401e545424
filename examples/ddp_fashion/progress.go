package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// The progress display is written here rather than with a progress-bar
// library (github.com/schollz/progressbar/v3 was weighed): under tandem run,
// the way this example is meant to run, stdout is a pipe that the launcher
// prefixes line by line, and what is wanted there is a compact line every
// few percent, which no such library prints (they redraw one line with
// '\r'); they also read the wall clock themselves, where these tests give
// the display a fake one to check its rate and ETA exactly. The bar itself
// is one Fprintf.

// progressMode says how training progress is shown.
type progressMode int

const (
	progressOff   progressMode = iota // nothing
	progressBar                       // one line redrawn in place with '\r'
	progressLines                     // a compact line every few percent
)

// parseProgressMode reads the -progress flag: auto (a bar on a terminal,
// lines otherwise), bar, lines or off.
func parseProgressMode(s string, w io.Writer) (progressMode, error) {
	switch s {
	case "auto":
		if isTerminal(w) {
			return progressBar, nil
		}
		return progressLines, nil
	case "bar":
		return progressBar, nil
	case "lines":
		return progressLines, nil
	case "off", "none":
		return progressOff, nil
	}
	return progressOff, fmt.Errorf("-progress %q: want auto, bar, lines or off", s)
}

// isTerminal reports whether w is a character device (a terminal). Under
// tandem run, a worker's stdout is a pipe to the launcher, which prefixes
// every line with the rank, so carriage-return redraws would be garbled.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// progress shows how far an epoch is, its running loss, speed and estimated
// time left. It is used by one goroutine (rank 0's training loop).
type progress struct {
	w       io.Writer
	mode    progressMode
	every   int // percent between lines in progressLines mode
	label   string
	total   int
	now     func() time.Time
	start   time.Time
	lastBar time.Time
	nextPct int // next percentage that prints a line
	width   int // characters of the bar
}

// newProgress starts the display of one epoch of total steps.
func newProgress(w io.Writer, mode progressMode, everyPct int, label string, total int, now func() time.Time) *progress {
	if now == nil {
		now = time.Now
	}
	everyPct = min(max(everyPct, 1), 100)
	p := &progress{w: w, mode: mode, every: everyPct, label: label, total: max(total, 1), now: now, width: 30}
	p.start = now()
	p.nextPct = everyPct
	return p
}

// update reports that done of total steps are finished, with the mean loss
// so far.
func (p *progress) update(done int, meanLoss float64) {
	if p.mode == progressOff || done <= 0 {
		return
	}
	t := p.now()
	pct := 100 * done / p.total
	switch p.mode {
	case progressBar:
		// Redraw at most ten times a second, and always at the end.
		if done < p.total && t.Sub(p.lastBar) < 100*time.Millisecond {
			return
		}
		p.lastBar = t
		filled := p.width * done / p.total
		bar := strings.Repeat("=", filled)
		if filled < p.width {
			bar += ">" + strings.Repeat(" ", p.width-filled-1)
		}
		fmt.Fprintf(p.w, "\r%s [%s] %3d%% %d/%d %s\x1b[K", p.label, bar, pct, done, p.total, p.stats(t, done, meanLoss))
	case progressLines:
		if pct < p.nextPct && done < p.total {
			return
		}
		for p.nextPct <= pct {
			p.nextPct += p.every
		}
		fmt.Fprintf(p.w, "%s %3d%% %d/%d %s\n", p.label, pct, done, p.total, p.stats(t, done, meanLoss))
	}
}

// stats formats the loss, the speed and the time left.
func (p *progress) stats(t time.Time, done int, meanLoss float64) string {
	elapsed := t.Sub(p.start)
	rate := float64(done) / max(elapsed.Seconds(), 1e-9)
	eta := time.Duration(float64(p.total-done) / rate * float64(time.Second))
	return fmt.Sprintf("loss %.4f  %.1f step/s  elapsed %s  ETA %s", meanLoss, rate, clock(elapsed), clock(eta))
}

// finish ends the epoch's display: the bar gets its newline.
func (p *progress) finish() {
	if p.mode == progressBar {
		fmt.Fprintln(p.w)
	}
}

// clock formats d as m:ss, or h:mm:ss from an hour up.
func clock(d time.Duration) string {
	s := int(d.Round(time.Second).Seconds())
	if s < 0 {
		s = 0
	}
	if s >= 3600 {
		return fmt.Sprintf("%d:%02d:%02d", s/3600, s/60%60, s%60)
	}
	return fmt.Sprintf("%d:%02d", s/60, s%60)
}
