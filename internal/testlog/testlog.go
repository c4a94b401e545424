// Package testlog holds a log sink for tests that read back what a server
// logged: a buffer that loggers in several goroutines, or a child process's
// stderr, may write to while the test reads it.
//
//	var logs testlog.Buffer
//	srv := NewServer(addr, WithLogger(logs.Logger()))
//	// ...
//	if !strings.Contains(logs.String(), "wrong token") { ... }
package testlog

import (
	"bytes"
	"log/slog"
	"sync"
)

// Buffer is a bytes.Buffer safe for concurrent writers and readers. Its
// zero value is empty and ready to use; it must not be copied after first
// use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p to the buffer.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Logger returns a logger that writes text records (slog.TextHandler, at
// Info and above) into the buffer.
func (b *Buffer) Logger() *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }
