package main

import (
	"context"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/ddp"
)

// The timeline (-timeline FILE) is ddp.Timeline's record of a window of
// steps on every rank, gathered on rank 0 and written there as one
// Chrome-trace JSON file, with a picture of its first steps beside it
// (FILE with .png for its extension), drawn like curves.png.

// Timeline colours, one per event.
var timelineColors = map[string]color.RGBA{
	ddp.EventForward:   {31, 119, 180, 255},  // blue
	ddp.EventBackward:  {255, 127, 14, 255},  // orange
	ddp.EventAllReduce: {44, 160, 44, 255},   // green
	ddp.EventWait:      {200, 200, 200, 255}, // grey
	ddp.EventOptimizer: {148, 103, 189, 255}, // purple
}

// timelineLegend is the legend's order.
var timelineLegend = []string{ddp.EventForward, ddp.EventBackward, ddp.EventAllReduce, ddp.EventWait, ddp.EventOptimizer}

const (
	tlWidth   = 1000
	tlLaneH   = 16
	tlLaneGap = 4
	tlRankGap = 14
	tlLeft    = 160
	tlRight   = 20
)

// writeTimeline gathers the ranks' timelines on rank 0, which writes the
// merged trace to path and its picture (at most pictureSteps steps) to path
// with .png for its extension. Every rank calls it.
func writeTimeline(ctx context.Context, pg *comm.ProcessGroup, tl *ddp.Timeline, path string, pictureSteps int) (string, error) {
	tr, err := tl.Gather(ctx, pg, 0)
	if err != nil {
		return "", err
	}
	if pg.Rank() != 0 {
		return "", nil
	}
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", fmt.Errorf("writing the timeline: %w", err)
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return "", fmt.Errorf("writing the timeline: %w", err)
	}
	if err := ddp.WriteTrace(f, tr); err != nil {
		f.Close()
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("writing the timeline: %w", err)
	}
	pic := strings.TrimSuffix(path, filepath.Ext(path)) + ".png"
	if err := writePNG(pic, renderTimeline(tr, pictureSteps)); err != nil {
		return "", err
	}
	return pic, nil
}

// renderTimeline draws the first steps steps of tr: per rank a compute
// lane (forward, backward, wait, optimizer) and a lane per bucket (its
// all-reduce), over a shared time axis in milliseconds.
func renderTimeline(tr ddp.Trace, steps int) *image.RGBA {
	type lane struct{ pid, tid int }
	var evs []ddp.TraceEvent
	first := int64(math.MaxInt64)
	for _, e := range tr.TraceEvents {
		if e.Ph == "X" {
			first = min(first, e.Args["step"])
		}
	}
	lanesOf := map[int][]int{}
	t0, t1 := int64(math.MaxInt64), int64(math.MinInt64)
	for _, e := range tr.TraceEvents {
		if e.Ph != "X" || e.Name == ddp.EventStep || e.Args["step"] >= first+int64(steps) {
			continue
		}
		evs = append(evs, e)
		if !slices.Contains(lanesOf[e.Pid], e.Tid) {
			lanesOf[e.Pid] = append(lanesOf[e.Pid], e.Tid)
		}
		t0, t1 = min(t0, e.Ts), max(t1, e.Ts+e.Dur)
	}
	var pids []int
	for p := range lanesOf {
		pids = append(pids, p)
		slices.Sort(lanesOf[p])
	}
	slices.Sort(pids)
	top := 20 + 2*textHeight(textScale) + 30
	y := top
	laneY := map[lane]int{}
	for _, p := range pids {
		for _, l := range lanesOf[p] {
			laneY[lane{p, l}] = y
			y += tlLaneH + tlLaneGap
		}
		y += tlRankGap
	}
	axisY := y
	h := axisY + 20 + textHeight(textScale) + 10
	img := image.NewRGBA(image.Rect(0, 0, tlWidth, h))
	fillRect(img, 0, 0, tlWidth, h, colBackground)
	title := fmt.Sprintf("DDP TIMELINE: %d RANKS, STEPS %d-%d", len(pids), first, first+int64(steps)-1)
	drawText(img, tlLeft, 12, title, textScale, colText)
	// Legend.
	lx := tlLeft
	ly := 12 + textHeight(textScale) + 10
	for _, name := range timelineLegend {
		fillRect(img, lx, ly, 14, textHeight(textScale), timelineColors[name])
		drawText(img, lx+20, ly, strings.ToUpper(name), textScale, colText)
		lx += 20 + textWidth(name, textScale) + 24
	}
	if len(evs) == 0 {
		return img
	}
	span := float64(max(t1-t0, 1))
	plotW := tlWidth - tlLeft - tlRight
	xOf := func(ts int64) int { return tlLeft + int(float64(ts-t0)/span*float64(plotW)) }
	// Grid and time axis in milliseconds.
	ticks, _ := niceTicks(0, span/1000, 8)
	for _, tk := range ticks {
		x := tlLeft + int(tk*1000/span*float64(plotW))
		if x > tlWidth-tlRight {
			break
		}
		for yy := top - 4; yy < axisY; yy++ {
			img.Set(x, yy, colGrid)
		}
		label := fmt.Sprintf("%g", tk)
		drawText(img, x-textWidth(label, textScale)/2, axisY+6, label, textScale, colText)
	}
	drawLine(img, tlLeft, axisY, tlWidth-tlRight, axisY, colAxis)
	drawText(img, 10, axisY+6, "MS", textScale, colText)
	// Lane labels.
	for _, p := range pids {
		for _, l := range lanesOf[p] {
			label := fmt.Sprintf("R%d COMPUTE", p)
			if l >= ddp.LaneBucket0 {
				label = fmt.Sprintf("R%d BUCKET %d", p, l-ddp.LaneBucket0)
			}
			drawText(img, 10, laneY[lane{p, l}]+(tlLaneH-textHeight(textScale))/2, label, textScale, colText)
		}
	}
	// Events, at least a pixel wide so short ones still show.
	for _, e := range evs {
		c, ok := timelineColors[e.Name]
		if !ok {
			c = colAxis
		}
		x0, x1 := xOf(e.Ts), xOf(e.Ts+e.Dur)
		fillRect(img, x0, laneY[lane{e.Pid, e.Tid}], max(x1-x0, 1), tlLaneH, c)
	}
	return img
}

// writePNG writes img to path through a temporary file renamed into place,
// so a reader never sees half an image.
func writePNG(path string, img image.Image) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".png-*.png")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if err := png.Encode(tmp, img); err != nil {
		tmp.Close()
		return fmt.Errorf("encoding %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
