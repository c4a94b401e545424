package main

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strconv"
)

// The training curves are drawn with the standard library alone: an RGBA
// image, axes, tick marks and labels in the 5×7 font of font.go, and line
// series drawn pixel by pixel, saved with image/png.

var (
	colBackground = color.RGBA{255, 255, 255, 255}
	colAxis       = color.RGBA{40, 40, 40, 255}
	colGrid       = color.RGBA{225, 225, 225, 255}
	colText       = color.RGBA{20, 20, 20, 255}
	colTrain      = color.RGBA{31, 119, 180, 255} // blue
	colTest       = color.RGBA{255, 127, 14, 255} // orange
	colAcc        = color.RGBA{44, 160, 44, 255}  // green
)

const (
	plotW     = 1000
	plotH     = 440
	textScale = 2
)

// series is one line of a panel: a label, a colour and a y value per epoch.
type series struct {
	label string
	color color.RGBA
	y     []float64
}

// panel is one chart: a title, an x axis of epochs 1..n, and its series.
type panel struct {
	title  string
	series []series
}

// writePlot draws the loss and accuracy curves of hist into a PNG file at
// path, written to a temporary file first and renamed, so a reader never
// sees half an image.
func writePlot(path string, hist []epochStats) error {
	img := renderPlot(hist)
	tmp, err := os.CreateTemp(filepath.Dir(path), ".plot-*.png")
	if err != nil {
		return fmt.Errorf("writing the plot: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if err := png.Encode(tmp, img); err != nil {
		tmp.Close()
		return fmt.Errorf("encoding the plot: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing the plot: %w", err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("writing the plot: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("writing the plot: %w", err)
	}
	return nil
}

// renderPlot draws two panels side by side: train and test loss on the
// left, test accuracy in percent on the right.
func renderPlot(hist []epochStats) *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, plotW, plotH))
	fillRect(img, 0, 0, plotW, plotH, colBackground)
	n := len(hist)
	trainLoss, testLoss, acc := make([]float64, n), make([]float64, n), make([]float64, n)
	for i, h := range hist {
		trainLoss[i], testLoss[i], acc[i] = h.TrainLoss, h.TestLoss, 100*h.TestAcc
	}
	loss := panel{title: "LOSS", series: []series{
		{label: "TRAIN", color: colTrain, y: trainLoss},
		{label: "TEST", color: colTest, y: testLoss},
	}}
	accuracy := panel{title: "TEST ACCURACY %", series: []series{
		{label: "TEST", color: colAcc, y: acc},
	}}
	half := plotW / 2
	drawPanel(img, image.Rect(0, 0, half, plotH), loss)
	drawPanel(img, image.Rect(half, 0, plotW, plotH), accuracy)
	return img
}

// drawPanel draws p inside r: the title above, the axes with ticks and
// labels, a light grid, the series with a marker per epoch, and a legend.
func drawPanel(img *image.RGBA, r image.Rectangle, p panel) {
	th := textHeight(textScale)
	// Plot area, leaving room for the title, the y labels and the x labels.
	area := image.Rect(r.Min.X+90, r.Min.Y+20+th+16, r.Max.X-24, r.Max.Y-(2*th+36))
	drawText(img, area.Min.X+(area.Dx()-textWidth(p.title, textScale))/2, r.Min.Y+16, p.title, textScale, colText)

	n := 0
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range p.series {
		n = max(n, len(s.y))
		for _, v := range s.y {
			if !math.IsNaN(v) && !math.IsInf(v, 0) {
				lo, hi = min(lo, v), max(hi, v)
			}
		}
	}
	if lo > hi { // no data yet
		lo, hi = 0, 1
	}
	yTicks, yStep := niceTicks(lo, hi, 5)
	yMin, yMax := yTicks[0], yTicks[len(yTicks)-1]

	// x: epochs 1..n; a single epoch sits in the middle of [0, 2].
	xMin, xMax := 1.0, float64(max(n, 2))
	if n <= 1 {
		xMin = 0
	}
	// Points keep a margin from the left and right edges of the area.
	const inset = 20
	px := func(x float64) int {
		return area.Min.X + inset + int(math.Round((x-xMin)/(xMax-xMin)*float64(area.Dx()-2*inset)))
	}
	py := func(y float64) int {
		return area.Max.Y - int(math.Round((y-yMin)/(yMax-yMin)*float64(area.Dy())))
	}

	// Grid and y ticks with labels.
	decimals := max(0, -int(math.Floor(math.Log10(yStep)+1e-9)))
	for _, t := range yTicks {
		y := py(t)
		fillRect(img, area.Min.X, y, area.Dx(), 1, colGrid)
		fillRect(img, area.Min.X-6, y, 6, 1, colAxis)
		label := strconv.FormatFloat(t, 'f', decimals, 64)
		drawText(img, area.Min.X-10-textWidth(label, textScale), y-th/2, label, textScale, colText)
	}
	// x ticks: at most ten integer epochs.
	xStep := max(1, int(math.Ceil(float64(int(xMax)-int(xMin))/10)))
	for e := int(math.Ceil(xMin)); e <= int(xMax); e += xStep {
		x := px(float64(e))
		fillRect(img, x, area.Min.Y, 1, area.Dy(), colGrid)
		fillRect(img, x, area.Max.Y, 1, 6, colAxis)
		label := strconv.Itoa(e)
		drawText(img, x-textWidth(label, textScale)/2, area.Max.Y+10, label, textScale, colText)
	}
	xTitle := "EPOCH"
	drawText(img, area.Min.X+(area.Dx()-textWidth(xTitle, textScale))/2, area.Max.Y+th+22, xTitle, textScale, colText)

	// Axes.
	fillRect(img, area.Min.X, area.Min.Y, 2, area.Dy()+1, colAxis)
	fillRect(img, area.Min.X, area.Max.Y, area.Dx()+1, 2, colAxis)

	// Series: segments between consecutive epochs, a square per point.
	for _, s := range p.series {
		prevOK := false
		var x0, y0 int
		for i, v := range s.y {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				prevOK = false
				continue
			}
			x, y := px(float64(i+1)), py(v)
			if prevOK {
				drawLine(img, x0, y0, x, y, s.color)
			}
			fillRect(img, x-3, y-3, 7, 7, s.color)
			x0, y0, prevOK = x, y, true
		}
	}

	// Legend in the top-right corner of the area.
	ly := area.Min.Y + 8
	for _, s := range p.series {
		lx := area.Max.X - 12 - textWidth(s.label, textScale)
		drawText(img, lx, ly, s.label, textScale, colText)
		fillRect(img, lx-30, ly+th/2-1, 22, 3, s.color)
		ly += th + 8
	}
}

// drawLine draws a 3-pixel-thick line from (x0, y0) to (x1, y1)
// (Bresenham's algorithm, a 3×3 square per step).
func drawLine(img *image.RGBA, x0, y0, x1, y1 int, c color.Color) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := 1, 1
	if x0 > x1 {
		sx = -1
	}
	if y0 > y1 {
		sy = -1
	}
	e := dx + dy
	for {
		fillRect(img, x0-1, y0-1, 3, 3, c)
		if x0 == x1 && y0 == y1 {
			return
		}
		if e2 := 2 * e; e2 >= dy {
			e += dy
			x0 += sx
		} else {
			e += dx
			y0 += sy
		}
	}
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// niceTicks returns about want+1 evenly spaced round tick values (steps of
// 1, 2 or 5 times a power of ten) covering [lo, hi], and the step.
func niceTicks(lo, hi float64, want int) ([]float64, float64) {
	if hi-lo < 1e-12*max(1, math.Abs(hi)) {
		pad := max(math.Abs(hi)*0.05, 1e-3)
		lo, hi = lo-pad, hi+pad
	}
	raw := (hi - lo) / float64(want)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 5, 10} {
		step = m * mag
		if step >= raw*(1-1e-9) {
			break
		}
	}
	first := math.Floor(lo/step) * step
	last := math.Ceil(hi/step) * step
	var ticks []float64
	for i := 0; ; i++ {
		t := first + float64(i)*step
		if t > last+step/2 {
			break
		}
		// Snap away float noise such as 0.30000000000000004.
		ticks = append(ticks, math.Round(t/step)*step)
	}
	return ticks, step
}
