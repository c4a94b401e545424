package main

import (
	"image"
	"image/color"
	"math"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// The training curves and the timeline's picture are drawn with
// gonum.org/v1/plot, rendered to an image by its vgimg back end and saved
// as PNG (writePNG).

var (
	colTrain = color.RGBA{31, 119, 180, 255} // blue
	colTest  = color.RGBA{255, 127, 14, 255} // orange
	colAcc   = color.RGBA{44, 160, 44, 255}  // green
	colOther = color.RGBA{40, 40, 40, 255}   // an event without a colour of its own
)

const (
	plotW   = 1000 // pixels
	plotH   = 440
	plotDPI = 100
)

// pixels converts a length in pixels at plotDPI into gonum/plot's points.
func pixels(n float64) vg.Length { return vg.Length(n) * vg.Inch / plotDPI }

// series is one line of a chart: a label, a colour and a y value per epoch.
type series struct {
	label string
	color color.RGBA
	y     []float64
}

// writePlot draws the loss and accuracy curves of hist into a PNG file at
// path (through a temporary file, so a reader never sees half an image).
func writePlot(path string, hist []epochStats) error {
	return writePNG(path, renderPlot(hist))
}

// renderPlot draws two charts side by side: train and test loss on the
// left, test accuracy in percent on the right.
func renderPlot(hist []epochStats) image.Image {
	n := len(hist)
	trainLoss, testLoss, acc := make([]float64, n), make([]float64, n), make([]float64, n)
	for i, h := range hist {
		trainLoss[i], testLoss[i], acc[i] = h.TrainLoss, h.TestLoss, 100*h.TestAcc
	}
	loss := curvesPlot("Loss", "cross-entropy", n, []series{
		{label: "train", color: colTrain, y: trainLoss},
		{label: "test", color: colTest, y: testLoss},
	})
	accuracy := curvesPlot("Test accuracy", "%", n, []series{
		{label: "test", color: colAcc, y: acc},
	})
	c := vgimg.NewWith(vgimg.UseWH(pixels(plotW), pixels(plotH)), vgimg.UseDPI(plotDPI), vgimg.UseBackgroundColor(color.White))
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: pixels(40), PadTop: pixels(10), PadBottom: pixels(10), PadLeft: pixels(10), PadRight: pixels(20)}
	canvases := plot.Align([][]*plot.Plot{{loss, accuracy}}, tiles, draw.New(c))
	loss.Draw(canvases[0][0])
	accuracy.Draw(canvases[0][1])
	return c.Image()
}

// curvesPlot is one chart of per-epoch values over epochs 1..n: a line
// with a marker per epoch for each series (broken where a value is not
// finite), a grid, and a legend in the top-right corner.
func curvesPlot(title, yLabel string, n int, ss []series) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "epoch"
	p.Y.Label.Text = yLabel
	p.X.Tick.Marker = epochTicks{}
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	empty := true
	for _, s := range ss {
		var first *plotter.Line
		for _, run := range finiteRuns(s.y) {
			line, points, err := plotter.NewLinePoints(run)
			if err != nil { // finiteRuns keeps NaN and Inf out
				panic(err)
			}
			line.Color, line.Width = s.color, vg.Points(2)
			points.Color, points.Shape, points.Radius = s.color, draw.BoxGlyph{}, vg.Points(2.5)
			p.Add(line, points)
			if first == nil {
				first = line
				p.Legend.Add(s.label, line, points)
			}
			empty = false
		}
	}
	// Epochs 1..n, half an epoch of margin on either side; a single epoch
	// sits in the middle.
	p.X.Min, p.X.Max = 0.5, float64(max(n, 1))+0.5
	if empty {
		p.Y.Min, p.Y.Max = 0, 1
	}
	// A margin above and below, so that no marker sits on the frame.
	pad := 0.08 * (p.Y.Max - p.Y.Min)
	p.Y.Min, p.Y.Max = p.Y.Min-pad, p.Y.Max+pad
	return p
}

// finiteRuns splits y (epoch i+1's value at i) into runs of consecutive
// finite values.
func finiteRuns(y []float64) []plotter.XYs {
	var runs []plotter.XYs
	var cur plotter.XYs
	for i, v := range y {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			if len(cur) > 0 {
				runs, cur = append(runs, cur), nil
			}
			continue
		}
		cur = append(cur, plotter.XY{X: float64(i + 1), Y: v})
	}
	if len(cur) > 0 {
		runs = append(runs, cur)
	}
	return runs
}

// epochTicks marks whole epochs only, at most ten of them labelled.
type epochTicks struct{}

// Ticks returns the ticks of the epochs in [lo, hi].
func (epochTicks) Ticks(lo, hi float64) []plot.Tick {
	first, last := int(math.Ceil(lo)), int(math.Floor(hi))
	step := max(1, (last-first+9)/10)
	var ticks []plot.Tick
	for e := first; e <= last; e++ {
		t := plot.Tick{Value: float64(e)}
		if (e-first)%step == 0 {
			t.Label = strconv.Itoa(e)
		}
		ticks = append(ticks, t)
	}
	return ticks
}
