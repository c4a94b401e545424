package main

import (
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"testing"

	"gonum.org/v1/plot/plotter"

	"github.com/tandemml/tandem/ddp"
)

func TestEpochTicks(t *testing.T) {
	ticks := epochTicks{}.Ticks(0.5, 4.5)
	if len(ticks) != 4 {
		t.Fatalf("ticks over 4 epochs: %+v", ticks)
	}
	for i, tk := range ticks {
		if tk.Value != float64(i+1) || tk.Label != string(rune('1'+i)) {
			t.Errorf("tick %d = %+v, want epoch %d labelled", i, tk, i+1)
		}
	}
	// Thirty epochs: every epoch ticked, every third labelled.
	ticks = epochTicks{}.Ticks(0.5, 30.5)
	labelled := 0
	for _, tk := range ticks {
		if tk.Label != "" {
			labelled++
		}
	}
	if len(ticks) != 30 || labelled != 10 || ticks[3].Label != "4" || ticks[1].Label != "" {
		t.Errorf("ticks over 30 epochs: %d, %d labelled: %+v", len(ticks), labelled, ticks)
	}
}

func TestFiniteRuns(t *testing.T) {
	runs := finiteRuns([]float64{1, math.NaN(), 2, 3, math.Inf(1)})
	want := []plotter.XYs{{{X: 1, Y: 1}}, {{X: 3, Y: 2}, {X: 4, Y: 3}}}
	if len(runs) != len(want) {
		t.Fatalf("runs %v, want %v", runs, want)
	}
	for i := range want {
		if len(runs[i]) != len(want[i]) {
			t.Fatalf("runs %v, want %v", runs, want)
		}
		for j := range want[i] {
			if runs[i][j] != want[i][j] {
				t.Errorf("runs %v, want %v", runs, want)
			}
		}
	}
	if finiteRuns(nil) != nil || finiteRuns([]float64{math.NaN()}) != nil {
		t.Error("no finite value should give no run")
	}
}

// near reports whether c is within a small distance of want in every
// channel: the plots are anti-aliased, so only the middle of a line has
// its exact colour.
func near(c color.Color, want color.RGBA) bool {
	r, g, b, _ := c.RGBA()
	d := func(x uint32, y uint8) bool { return math.Abs(float64(x>>8)-float64(y)) <= 24 }
	return d(r, want.R) && d(g, want.G) && d(b, want.B)
}

// inkOf returns the pixels of img in r near colour c: their count and the
// mean of their x and y.
func inkOf(img image.Image, r image.Rectangle, c color.RGBA) (n int, meanX, meanY float64) {
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			if near(img.At(x, y), c) {
				n++
				meanX += float64(x)
				meanY += float64(y)
			}
		}
	}
	if n > 0 {
		meanX, meanY = meanX/float64(n), meanY/float64(n)
	}
	return n, meanX, meanY
}

func TestRenderPlot(t *testing.T) {
	hist := []epochStats{
		{Epoch: 1, TrainLoss: 0.62, TestLoss: 0.45, TestAcc: 0.84},
		{Epoch: 2, TrainLoss: 0.38, TestLoss: 0.36, TestAcc: 0.87},
		{Epoch: 3, TrainLoss: 0.31, TestLoss: 0.31, TestAcc: 0.89},
		{Epoch: 4, TrainLoss: 0.28, TestLoss: 0.29, TestAcc: 0.90},
	}
	img := renderPlot(hist)
	if b := img.Bounds(); b.Dx() != plotW || b.Dy() != plotH {
		t.Fatalf("picture %v, want %dx%d", b, plotW, plotH)
	}
	left := image.Rect(0, 0, plotW/2, plotH)
	right := image.Rect(plotW/2, 0, plotW, plotH)
	// Loss curves on the left only, the accuracy curve on the right only.
	if n, _, _ := inkOf(img, left, colTrain); n < 100 {
		t.Errorf("the loss chart lacks the train series (%d pixels)", n)
	}
	if n, _, _ := inkOf(img, left, colTest); n < 100 {
		t.Errorf("the loss chart lacks the test series (%d pixels)", n)
	}
	if n, _, _ := inkOf(img, right, colAcc); n < 100 {
		t.Errorf("the accuracy chart lacks its series (%d pixels)", n)
	}
	if n, _, _ := inkOf(img, right, colTrain); n != 0 {
		t.Errorf("the train loss is drawn in the accuracy chart (%d pixels)", n)
	}
	if n, _, _ := inkOf(img, left, colAcc); n != 0 {
		t.Errorf("the accuracy is drawn in the loss chart (%d pixels)", n)
	}
	if n, _, _ := inkOf(img, img.Bounds(), color.RGBA{0, 0, 0, 255}); n < 300 {
		t.Errorf("too little black ink (%d pixels): axes or labels missing", n)
	}
	// The accuracy line rises: its ink in the chart's top half lies to the
	// right of its ink in the bottom half (the legend's sample, top right,
	// is left out).
	mid := plotH / 2
	_, top, _ := inkOf(img, image.Rect(plotW/2, 60, plotW-150, mid), colAcc)
	_, bottom, _ := inkOf(img, image.Rect(plotW/2, mid, plotW, plotH), colAcc)
	if !(top > bottom) {
		t.Errorf("accuracy ink: top half at x=%.0f, bottom half at x=%.0f; a rising line has the top to the right", top, bottom)
	}

	// No data, a single epoch and a diverged epoch still draw.
	_ = renderPlot(nil)
	_ = renderPlot(hist[:1])
	_ = renderPlot([]epochStats{{Epoch: 1, TrainLoss: math.NaN(), TestLoss: math.Inf(1)}, hist[1]})

	path := filepath.Join(t.TempDir(), "curves.png")
	if err := writePlot(path, hist); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Fatal(err)
	}
}

// The timeline's picture puts rank 0's lanes above rank 1's, each event in
// its colour, and grows a lane's height for every lane.
func TestRenderTimeline(t *testing.T) {
	ev := func(name string, pid, tid int, ts, dur, step int64) ddp.TraceEvent {
		return ddp.TraceEvent{Name: name, Ph: "X", Pid: pid, Tid: tid, Ts: ts, Dur: dur, Args: map[string]int64{"step": step}}
	}
	tr := ddp.Trace{TraceEvents: []ddp.TraceEvent{
		{Name: "process_name", Ph: "M", Pid: 0, Label: "rank 0"},
		ev(ddp.EventStep, 0, ddp.LaneCompute, 1000, 9000, 3),
		ev(ddp.EventForward, 0, ddp.LaneCompute, 1000, 4000, 3),
		ev(ddp.EventBackward, 1, ddp.LaneCompute, 1000, 4000, 3),
		ev(ddp.EventAllReduce, 1, ddp.LaneBucket0, 5000, 3000, 3),
		ev(ddp.EventForward, 0, ddp.LaneCompute, 20000, 4000, 9), // past the window of 2 steps
	}}
	img := renderTimeline(tr, 2)
	b := img.Bounds()
	if b.Dx() != tlWidth || b.Dy() != tlExtra+tlLaneH*len(timelineLegend) {
		t.Fatalf("picture %v", b)
	}
	// The bars lie left of the legend's margin (the last fifth).
	bars := image.Rect(0, 0, tlWidth*3/4, b.Dy())
	nF, xF, yF := inkOf(img, bars, timelineColors[ddp.EventForward])
	nB, _, yB := inkOf(img, bars, timelineColors[ddp.EventBackward])
	nA, xA, _ := inkOf(img, bars, timelineColors[ddp.EventAllReduce])
	if nF < 200 || nB < 200 || nA < 200 {
		t.Fatalf("bars missing: forward %d, backward %d, all-reduce %d pixels", nF, nB, nA)
	}
	if !(yF < yB) {
		t.Errorf("rank 0's forward (y=%.0f) is not above rank 1's backward (y=%.0f)", yF, yB)
	}
	if !(xA > xF) {
		t.Errorf("the all-reduce (x=%.0f) does not follow the forward (x=%.0f)", xA, xF)
	}
	// Forward and backward take as long: as many pixels, give or take the
	// edges; the step 9 forward outside the window is not drawn.
	if math.Abs(float64(nF-nB)) > 0.1*float64(nB) {
		t.Errorf("forward %d pixels, backward %d: the event past the window was drawn?", nF, nB)
	}

	// Many lanes make a taller picture; no events still draw.
	for i := range 8 {
		tr.TraceEvents = append(tr.TraceEvents, ev(ddp.EventAllReduce, 0, ddp.LaneBucket0+i, 5000, 1000, 3))
	}
	if h := renderTimeline(tr, 2).Bounds().Dy(); h != tlExtra+tlLaneH*(1+8+2) {
		t.Errorf("11 lanes: %d pixels high, want %d", h, tlExtra+tlLaneH*11)
	}
	_ = renderTimeline(ddp.Trace{}, 5)
}
