package main

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
)

func TestPrefixWriterJoinsPiecesIntoLines(t *testing.T) {
	var buf bytes.Buffer
	w := newPrefixWriter(&lockedWriter{w: &buf}, "[7] ")
	for _, piece := range []string{"he", "llo\nwor", "ld\n\nfirst\nsecond\nunfin", "ished"} {
		n, err := w.Write([]byte(piece))
		mustNoErr(t, err)
		mustEqual(t, len(piece), n)
	}
	checkEqual(t, "[7] hello\n[7] world\n[7] \n[7] first\n[7] second\n", buf.String(), "the unfinished line waits")
	mustNoErr(t, w.Flush())
	checkEqual(t, "[7] hello\n[7] world\n[7] \n[7] first\n[7] second\n[7] unfinished\n", buf.String())
	mustNoErr(t, w.Flush())
	checkEqual(t, "[7] hello\n[7] world\n[7] \n[7] first\n[7] second\n[7] unfinished\n", buf.String(), "a second flush adds nothing")
}

func TestPrefixWriterSplitsOverlongLines(t *testing.T) {
	var buf bytes.Buffer
	w := newPrefixWriter(&lockedWriter{w: &buf}, "[0] ")
	w.max = 4
	_, err := w.Write([]byte("abcdefghij"))
	mustNoErr(t, err)
	_, err = w.Write([]byte("k\nxy"))
	mustNoErr(t, err)
	mustNoErr(t, w.Flush())
	checkEqual(t, "[0] abcd\n[0] efgh\n[0] ijk\n[0] xy\n", buf.String())
}

// errWriter fails every write.
type errWriter struct{}

func (errWriter) Write([]byte) (int, error) { return 0, fmt.Errorf("disk full") }

func TestPrefixWriterReportsDestinationErrors(t *testing.T) {
	w := newPrefixWriter(&lockedWriter{w: errWriter{}}, "[0] ")
	_, err := w.Write([]byte("line\n"))
	checkErrorContains(t, err, "disk full")
}

func TestPrefixWritersOfManyRanksNeverMixInsideALine(t *testing.T) {
	var buf bytes.Buffer
	dst := &lockedWriter{w: &buf}
	const ranks, lines = 8, 300
	var wg sync.WaitGroup
	for r := 0; r < ranks; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := newPrefixWriter(dst, fmt.Sprintf("[%d] ", r))
			w.max = 1000
			line := strings.Repeat(fmt.Sprint(r), 1+r*97) + "\n"
			data := []byte(strings.Repeat(line, lines))
			// Odd-sized pieces, so lines are cut everywhere.
			for len(data) > 0 {
				n := min(len(data), 1+(r*131)%517)
				if _, err := w.Write(data[:n]); err != nil {
					panic(err)
				}
				data = data[n:]
			}
			if err := w.Flush(); err != nil {
				panic(err)
			}
		}()
	}
	wg.Wait()
	count := map[string]int{}
	for _, l := range strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n") {
		mustMatch(t, `^\[\d\] \d+$`, l)
		r := l[1:2]
		mustEqual(t, strings.Repeat(r, len(l)-4), l[4:])
		count[r]++
	}
	for r := 0; r < ranks; r++ {
		checkEqual(t, lines, count[fmt.Sprint(r)], "rank %d", r)
	}
}

func FuzzPrefixWriter(f *testing.F) {
	f.Add([]byte("hello\nworld"), uint8(3), uint8(5))
	f.Add([]byte("\n\n\n"), uint8(1), uint8(1))
	f.Add([]byte(strings.Repeat("x", 100)), uint8(7), uint8(2))
	f.Add([]byte("00000\n"), uint8(20), uint8(67)) // a whole overlong line in one write
	f.Fuzz(func(t *testing.T, data []byte, chunk, max uint8) {
		var buf bytes.Buffer
		w := newPrefixWriter(&lockedWriter{w: &buf}, "[3] ")
		w.max = int(max%32) + 1
		step := int(chunk%64) + 1
		for rest := data; len(rest) > 0; {
			n := min(step, len(rest))
			if k, err := w.Write(rest[:n]); err != nil || k != n {
				t.Fatalf("Write = %d, %v", k, err)
			}
			rest = rest[n:]
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		out := buf.String()
		var whole bytes.Buffer
		w2 := newPrefixWriter(&lockedWriter{w: &whole}, "[3] ")
		w2.max = w.max
		if _, err := w2.Write(data); err != nil {
			t.Fatal(err)
		}
		if err := w2.Flush(); err != nil {
			t.Fatal(err)
		}
		if whole.String() != out {
			t.Fatalf("output depends on how the input was cut: %q in pieces of %d, %q whole", out, step, whole.String())
		}
		if len(data) == 0 {
			if out != "" {
				t.Fatalf("no input gave output %q", out)
			}
			return
		}
		if !strings.HasSuffix(out, "\n") {
			t.Fatalf("output %q does not end a line", out)
		}
		var body strings.Builder
		for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
			if !strings.HasPrefix(line, "[3] ") {
				t.Fatalf("line %q lacks the prefix", line)
			}
			if len(line)-4 > w.max {
				t.Fatalf("line %q is longer than the limit %d", line, w.max)
			}
			body.WriteString(line[4:])
		}
		if want := strings.ReplaceAll(string(data), "\n", ""); body.String() != want {
			t.Fatalf("the bytes changed: got %q, want %q", body.String(), want)
		}
		if got, want := strings.Count(out, "\n"), strings.Count(string(data), "\n"); got < want {
			t.Fatalf("%d newlines out for %d in", got, want)
		}
	})
}
