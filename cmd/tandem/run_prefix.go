package main

import (
	"bytes"
	"io"
	"sync"
)

// maxPrefixedLine is the longest line a prefixWriter passes on whole; a
// longer line goes out in pieces of this size, each on its own prefixed line,
// so memory stays bounded and the output does not depend on how the worker's
// writes were cut.
const maxPrefixedLine = 64 << 10

// lockedWriter is a destination shared by several workers' streams; the lock
// makes every line reach it in one piece.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// prefixWriter puts a prefix (the worker's "[rank] ") before every line
// written to it and passes whole lines on to a shared lockedWriter, so lines
// of different workers never mix. It keeps an unfinished line until its
// newline arrives or Flush is called. One goroutine writes to it at a time.
type prefixWriter struct {
	dst     *lockedWriter
	prefix  []byte
	partial []byte // the current line so far, without prefix
	max     int    // longest partial line held back
	out     []byte // reused output buffer
}

func newPrefixWriter(dst *lockedWriter, prefix string) *prefixWriter {
	return &prefixWriter{dst: dst, prefix: []byte(prefix), max: maxPrefixedLine}
}

// Write takes any bytes, complete lines or not; the complete lines it now has
// go to the destination in one write.
func (w *prefixWriter) Write(p []byte) (int, error) {
	n := len(p)
	w.out = w.out[:0]
	for len(p) > 0 {
		room := w.max - len(w.partial)
		if i := bytes.IndexByte(p, '\n'); i >= 0 && i <= room {
			w.emit(p[:i+1], false) // the line ends within the limit
			p = p[i+1:]
			continue
		}
		if len(p) <= room {
			w.partial = append(w.partial, p...)
			break
		}
		// The line goes on past the limit: send a limit's worth now.
		w.emit(p[:room], true)
		p = p[room:]
	}
	if len(w.out) == 0 {
		return n, nil
	}
	if _, err := w.dst.Write(w.out); err != nil {
		return 0, err
	}
	return n, nil
}

// emit appends one output line, made of the held partial line and piece, to
// w.out; addNewline ends a piece of an overlong line.
func (w *prefixWriter) emit(piece []byte, addNewline bool) {
	w.out = append(w.out, w.prefix...)
	w.out = append(w.out, w.partial...)
	w.out = append(w.out, piece...)
	if addNewline {
		w.out = append(w.out, '\n')
	}
	w.partial = w.partial[:0]
}

// Flush sends the unfinished last line, if any, ending it with a newline.
func (w *prefixWriter) Flush() error {
	if len(w.partial) == 0 {
		return nil
	}
	w.out = w.out[:0]
	w.emit(nil, true)
	_, err := w.dst.Write(w.out)
	return err
}
