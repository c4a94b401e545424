package main

import (
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"testing"
)

func TestGlyphsWellFormed(t *testing.T) {
	for r, g := range glyphs {
		for i, row := range g {
			if len(row) != glyphW {
				t.Errorf("glyph %q row %d is %q, want %d characters", r, i, row, glyphW)
			}
		}
	}
	// Every digit and capital has a glyph of its own, with some ink.
	for _, r := range "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ.%-" {
		g, ok := glyphs[r]
		if !ok {
			t.Errorf("no glyph for %q", r)
			continue
		}
		ink := 0
		for _, row := range g {
			for _, c := range row {
				if c == '#' {
					ink++
				}
			}
		}
		if ink == 0 {
			t.Errorf("glyph %q is blank", r)
		}
	}
	if glyphFor('e') != glyphs['E'] {
		t.Error("lower case is not drawn as upper case")
	}
	if glyphFor('~') != unknownGlyph {
		t.Error("a missing character is not drawn as the box")
	}
}

func TestDrawText(t *testing.T) {
	img := image.NewRGBA(image.Rect(0, 0, 20, 10))
	ink := color.RGBA{255, 0, 0, 255}
	drawText(img, 1, 1, "1", 1, ink)
	// '1' = "  #  " / " ##  " / ... / " ### ": its stem is column 2.
	for row := range glyphH {
		if img.RGBAAt(1+2, 1+row) != ink {
			t.Errorf("stem pixel of '1' at row %d not inked", row)
		}
	}
	if img.RGBAAt(1, 1) == ink || img.RGBAAt(1+4, 1) == ink {
		t.Error("pixels outside the glyph inked")
	}
	if w := textWidth("12", 2); w != (2*glyphAdvance-1)*2 {
		t.Errorf("textWidth = %d", w)
	}
}

func TestNiceTicks(t *testing.T) {
	cases := []struct {
		lo, hi, step float64
		first, last  float64
	}{
		{0.23, 0.71, 0.1, 0.2, 0.8},
		{72.4, 91.3, 5, 70, 95},
		{0.5, 0.5, 0.01, 0.47, 0.53}, // a flat series gets a small range
		{1, 2000, 500, 0, 2000},
	}
	for _, c := range cases {
		ticks, step := niceTicks(c.lo, c.hi, 5)
		if math.Abs(step-c.step) > 1e-12 {
			t.Errorf("niceTicks(%v, %v): step %v, want %v", c.lo, c.hi, step, c.step)
		}
		if math.Abs(ticks[0]-c.first) > 1e-9 || math.Abs(ticks[len(ticks)-1]-c.last) > 1e-9 {
			t.Errorf("niceTicks(%v, %v) = %v, want %v..%v", c.lo, c.hi, ticks, c.first, c.last)
		}
		if ticks[0] > c.lo || ticks[len(ticks)-1] < c.hi {
			t.Errorf("niceTicks(%v, %v) = %v does not cover the range", c.lo, c.hi, ticks)
		}
	}
}

// countColor counts the pixels of colour c in the rectangle r of img.
func countColor(img *image.RGBA, r image.Rectangle, c color.RGBA) int {
	n := 0
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			if img.RGBAAt(x, y) == c {
				n++
			}
		}
	}
	return n
}

func TestRenderPlot(t *testing.T) {
	hist := []epochStats{
		{Epoch: 1, TrainLoss: 0.62, TestLoss: 0.45, TestAcc: 0.84},
		{Epoch: 2, TrainLoss: 0.38, TestLoss: 0.36, TestAcc: 0.87},
		{Epoch: 3, TrainLoss: 0.31, TestLoss: 0.31, TestAcc: 0.89},
		{Epoch: 4, TrainLoss: 0.28, TestLoss: 0.29, TestAcc: 0.90},
	}
	img := renderPlot(hist)
	left := image.Rect(0, 0, plotW/2, plotH)
	right := image.Rect(plotW/2, 0, plotW, plotH)
	// Loss curves on the left only, the accuracy curve on the right only.
	if countColor(img, left, colTrain) < 100 || countColor(img, left, colTest) < 100 {
		t.Error("the loss panel lacks a series")
	}
	if countColor(img, right, colAcc) < 100 {
		t.Error("the accuracy panel lacks its series")
	}
	if countColor(img, right, colTrain) != 0 || countColor(img, left, colAcc) != 0 {
		t.Error("a series is drawn in the wrong panel")
	}
	if countColor(img, img.Bounds(), colText) < 500 {
		t.Error("too little text: labels missing")
	}
	// The accuracy line rises: its ink in the area's top half lies to the
	// right of its ink in the bottom half.
	meanX := func(r image.Rectangle) float64 {
		var sum, n float64
		for y := r.Min.Y; y < r.Max.Y; y++ {
			for x := r.Min.X; x < r.Max.X; x++ {
				if img.RGBAAt(x, y) == colAcc {
					sum += float64(x)
					n++
				}
			}
		}
		return sum / n
	}
	mid := plotH / 2
	if top, bottom := meanX(image.Rect(plotW/2, 40, plotW-120, mid)), meanX(image.Rect(plotW/2, mid, plotW, plotH)); !(top > bottom) {
		t.Errorf("accuracy ink: top half at x=%.0f, bottom half at x=%.0f; a rising line has the top to the right", top, bottom)
	}

	// No data (and a single epoch) still draw without trouble.
	_ = renderPlot(nil)
	_ = renderPlot(hist[:1])

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
