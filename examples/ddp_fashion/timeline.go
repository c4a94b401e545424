package main

import (
	"context"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

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
	tlWidth = 1000 // pixels
	tlLaneH = 22   // pixels a lane
	tlExtra = 130  // pixels of title, time axis and margins
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
// all-reduce), over a shared time axis in milliseconds, with a legend in
// the margin on the right.
func renderTimeline(tr ddp.Trace, steps int) image.Image {
	first := int64(math.MaxInt64)
	for _, e := range tr.TraceEvents {
		if e.Ph == "X" {
			first = min(first, e.Args["step"])
		}
	}
	bars := &timelineBars{lane: map[[2]int]int{}}
	var evs []ddp.TraceEvent
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
	pids := slices.Sorted(maps.Keys(lanesOf))
	// Lanes from the top: rank 0's compute lane, its buckets, rank 1's...
	// gonum/plot counts y upwards, so the first lane gets the highest y.
	var labels []string
	for _, p := range pids {
		slices.Sort(lanesOf[p])
		for _, l := range lanesOf[p] {
			bars.lane[[2]int{p, l}] = len(labels)
			label := fmt.Sprintf("rank %d compute", p)
			if l >= ddp.LaneBucket0 {
				label = fmt.Sprintf("rank %d bucket %d", p, l-ddp.LaneBucket0)
			}
			labels = append(labels, label)
		}
	}
	bars.lanes = len(labels)
	slices.Reverse(labels)
	for _, e := range evs {
		bars.bars = append(bars.bars, timelineBar{
			lane: bars.lane[[2]int{e.Pid, e.Tid}], name: e.Name,
			from: float64(e.Ts-t0) / 1000, to: float64(e.Ts+e.Dur-t0) / 1000,
		})
	}

	p := plot.New()
	p.Title.Text = fmt.Sprintf("DDP timeline: %d ranks, steps %d-%d", len(pids), first, first+int64(steps)-1)
	p.X.Label.Text = "ms"
	p.Add(plotter.NewGrid())
	p.Add(bars)
	if len(labels) > 0 {
		p.NominalY(labels...)
	}
	// The legend sits in a margin a fifth of the time span wide.
	span := max(float64(t1-t0)/1000, 1e-3)
	p.X.Min, p.X.Max = 0, span*1.25
	if len(evs) == 0 {
		p.X.Min, p.X.Max = 0, 1
	}
	p.Legend.Top = true
	for _, name := range timelineLegend {
		p.Legend.Add(name, swatch{timelineColors[name]})
	}
	h := tlExtra + tlLaneH*max(len(labels), len(timelineLegend))
	c := vgimg.NewWith(vgimg.UseWH(pixels(tlWidth), pixels(float64(h))), vgimg.UseDPI(plotDPI), vgimg.UseBackgroundColor(color.White))
	p.Draw(draw.Crop(draw.New(c), pixels(10), -pixels(20), pixels(10), -pixels(10)))
	return c.Image()
}

// timelineBar is one event of the timeline: its lane, its name (which
// gives its colour) and its span in milliseconds from the window's start.
type timelineBar struct {
	lane     int
	name     string
	from, to float64
}

// timelineBars draws the timeline's events as bars, one lane a row, lane
// 0 at the top. It is a gonum/plot Plotter and DataRanger.
type timelineBars struct {
	lanes int
	lane  map[[2]int]int // (pid, tid) -> lane
	bars  []timelineBar
}

// Plot draws the bars, each at least a pixel wide so that short events
// still show.
func (b *timelineBars) Plot(c draw.Canvas, p *plot.Plot) {
	trX, trY := p.Transforms(&c)
	for _, bar := range b.bars {
		col, ok := timelineColors[bar.name]
		if !ok {
			col = colOther
		}
		y := float64(b.lanes - 1 - bar.lane)
		x0, x1 := trX(bar.from), trX(bar.to)
		x1 = max(x1, x0+pixels(1))
		y0, y1 := trY(y-0.4), trY(y+0.4)
		c.FillPolygon(col, c.ClipPolygonXY([]vg.Point{{X: x0, Y: y0}, {X: x1, Y: y0}, {X: x1, Y: y1}, {X: x0, Y: y1}}))
	}
}

// DataRange is the time span and the lanes.
func (b *timelineBars) DataRange() (xmin, xmax, ymin, ymax float64) {
	xmin, xmax = math.Inf(1), math.Inf(-1)
	for _, bar := range b.bars {
		xmin, xmax = min(xmin, bar.from), max(xmax, bar.to)
	}
	if xmin > xmax {
		xmin, xmax = 0, 1
	}
	return xmin, xmax, -0.5, float64(b.lanes) - 0.5
}

// swatch is a legend's square of colour.
type swatch struct{ color color.Color }

// Thumbnail fills the legend entry's box.
func (s swatch) Thumbnail(c *draw.Canvas) {
	r := c.Rectangle
	c.FillPolygon(s.color, []vg.Point{r.Min, {X: r.Max.X, Y: r.Min.Y}, r.Max, {X: r.Min.X, Y: r.Max.Y}})
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
