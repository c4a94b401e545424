package main

import (
	"image"
	"image/color"
	"strings"
)

// A tiny bitmap font for the plot's labels: every glyph is 5 pixels wide
// and 7 high, drawn on a 6-pixel advance. Each row is a string of five
// characters, '#' for ink. Lower-case letters are drawn as capitals.
const (
	glyphW       = 5
	glyphH       = 7
	glyphAdvance = glyphW + 1
)

var glyphs = map[rune][glyphH]string{
	'0': {" ### ", "#   #", "#  ##", "# # #", "##  #", "#   #", " ### "},
	'1': {"  #  ", " ##  ", "  #  ", "  #  ", "  #  ", "  #  ", " ### "},
	'2': {" ### ", "#   #", "    #", "   # ", "  #  ", " #   ", "#####"},
	'3': {"#####", "   # ", "  #  ", "   # ", "    #", "#   #", " ### "},
	'4': {"   # ", "  ## ", " # # ", "#  # ", "#####", "   # ", "   # "},
	'5': {"#####", "#    ", "#### ", "    #", "    #", "#   #", " ### "},
	'6': {"  ## ", " #   ", "#    ", "#### ", "#   #", "#   #", " ### "},
	'7': {"#####", "    #", "   # ", "  #  ", " #   ", " #   ", " #   "},
	'8': {" ### ", "#   #", "#   #", " ### ", "#   #", "#   #", " ### "},
	'9': {" ### ", "#   #", "#   #", " ####", "    #", "   # ", " ##  "},
	'A': {" ### ", "#   #", "#   #", "#####", "#   #", "#   #", "#   #"},
	'B': {"#### ", "#   #", "#   #", "#### ", "#   #", "#   #", "#### "},
	'C': {" ### ", "#   #", "#    ", "#    ", "#    ", "#   #", " ### "},
	'D': {"###  ", "#  # ", "#   #", "#   #", "#   #", "#  # ", "###  "},
	'E': {"#####", "#    ", "#    ", "#### ", "#    ", "#    ", "#####"},
	'F': {"#####", "#    ", "#    ", "#### ", "#    ", "#    ", "#    "},
	'G': {" ### ", "#   #", "#    ", "# ###", "#   #", "#   #", " ####"},
	'H': {"#   #", "#   #", "#   #", "#####", "#   #", "#   #", "#   #"},
	'I': {" ### ", "  #  ", "  #  ", "  #  ", "  #  ", "  #  ", " ### "},
	'J': {"  ###", "   # ", "   # ", "   # ", "   # ", "#  # ", " ##  "},
	'K': {"#   #", "#  # ", "# #  ", "##   ", "# #  ", "#  # ", "#   #"},
	'L': {"#    ", "#    ", "#    ", "#    ", "#    ", "#    ", "#####"},
	'M': {"#   #", "## ##", "# # #", "# # #", "#   #", "#   #", "#   #"},
	'N': {"#   #", "#   #", "##  #", "# # #", "#  ##", "#   #", "#   #"},
	'O': {" ### ", "#   #", "#   #", "#   #", "#   #", "#   #", " ### "},
	'P': {"#### ", "#   #", "#   #", "#### ", "#    ", "#    ", "#    "},
	'Q': {" ### ", "#   #", "#   #", "#   #", "# # #", "#  # ", " ## #"},
	'R': {"#### ", "#   #", "#   #", "#### ", "# #  ", "#  # ", "#   #"},
	'S': {" ####", "#    ", "#    ", " ### ", "    #", "    #", "#### "},
	'T': {"#####", "  #  ", "  #  ", "  #  ", "  #  ", "  #  ", "  #  "},
	'U': {"#   #", "#   #", "#   #", "#   #", "#   #", "#   #", " ### "},
	'V': {"#   #", "#   #", "#   #", "#   #", "#   #", " # # ", "  #  "},
	'W': {"#   #", "#   #", "#   #", "# # #", "# # #", "# # #", " # # "},
	'X': {"#   #", "#   #", " # # ", "  #  ", " # # ", "#   #", "#   #"},
	'Y': {"#   #", "#   #", " # # ", "  #  ", "  #  ", "  #  ", "  #  "},
	'Z': {"#####", "    #", "   # ", "  #  ", " #   ", "#    ", "#####"},
	'.': {"     ", "     ", "     ", "     ", "     ", " ##  ", " ##  "},
	',': {"     ", "     ", "     ", "     ", " ##  ", "  #  ", " #   "},
	':': {"     ", " ##  ", " ##  ", "     ", " ##  ", " ##  ", "     "},
	'-': {"     ", "     ", "     ", "#####", "     ", "     ", "     "},
	'+': {"     ", "  #  ", "  #  ", "#####", "  #  ", "  #  ", "     "},
	'%': {"##   ", "##  #", "   # ", "  #  ", " #   ", "#  ##", "   ##"},
	'/': {"     ", "    #", "   # ", "  #  ", " #   ", "#    ", "     "},
	'(': {"   # ", "  #  ", " #   ", " #   ", " #   ", "  #  ", "   # "},
	')': {" #   ", "  #  ", "   # ", "   # ", "   # ", "  #  ", " #   "},
	'=': {"     ", "     ", "#####", "     ", "#####", "     ", "     "},
	' ': {"     ", "     ", "     ", "     ", "     ", "     ", "     "},
}

// unknownGlyph stands in for characters the font lacks.
var unknownGlyph = [glyphH]string{"#####", "#   #", "#   #", "#   #", "#   #", "#   #", "#####"}

// glyphFor returns the rows of r's glyph.
func glyphFor(r rune) [glyphH]string {
	if g, ok := glyphs[r]; ok {
		return g
	}
	if g, ok := glyphs[[]rune(strings.ToUpper(string(r)))[0]]; ok {
		return g
	}
	return unknownGlyph
}

// textWidth is the width in pixels of s drawn at scale (without the
// trailing gap after the last glyph).
func textWidth(s string, scale int) int {
	n := len([]rune(s))
	if n == 0 {
		return 0
	}
	return (n*glyphAdvance - 1) * scale
}

// textHeight is the height in pixels of a line drawn at scale.
func textHeight(scale int) int { return glyphH * scale }

// drawText draws s with its top-left corner at (x, y), each font pixel a
// scale×scale square of colour c.
func drawText(img *image.RGBA, x, y int, s string, scale int, c color.Color) {
	for _, r := range s {
		g := glyphFor(r)
		for row := range glyphH {
			for col := range glyphW {
				if g[row][col] != '#' {
					continue
				}
				fillRect(img, x+col*scale, y+row*scale, scale, scale, c)
			}
		}
		x += glyphAdvance * scale
	}
}

// drawTextUp draws s rotated a quarter turn anticlockwise (reading bottom to
// top), with the bottom-left corner of its first glyph at (x, y): for a
// vertical axis title.
func drawTextUp(img *image.RGBA, x, y int, s string, scale int, c color.Color) {
	for _, r := range s {
		g := glyphFor(r)
		for row := range glyphH {
			for col := range glyphW {
				if g[row][col] != '#' {
					continue
				}
				// Font pixel (col, row) goes to (x+row, y-col).
				fillRect(img, x+row*scale, y-(col+1)*scale, scale, scale, c)
			}
		}
		y -= glyphAdvance * scale
	}
}

// fillRect paints the w×h rectangle at (x, y), clipped to the image.
func fillRect(img *image.RGBA, x, y, w, h int, c color.Color) {
	r := image.Rect(x, y, x+w, y+h).Intersect(img.Bounds())
	for py := r.Min.Y; py < r.Max.Y; py++ {
		for px := r.Min.X; px < r.Max.X; px++ {
			img.Set(px, py, c)
		}
	}
}
