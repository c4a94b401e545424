package data

import (
	"context"
	"errors"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tandemml/tandem/internal/errs"
)

// mirror serves a tiny Fashion-MNIST-shaped data set (n 28x28 images per
// split) over HTTP on 127.0.0.1, counting requests.
func mirror(t *testing.T, n int) (*httptest.Server, *atomic.Int64) {
	dir := t.TempDir()
	writeSet(t, dir, "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", n, 28, 28, true)
	writeSet(t, dir, "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", n/2, 28, 28, true)
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		http.ServeFile(w, r, filepath.Join(dir, filepath.Base(r.URL.Path)))
	}))
	t.Cleanup(srv.Close)
	return srv, &hits
}

func TestFashionMNISTDownload(t *testing.T) {
	srv, hits := mirror(t, 6)
	broken := httptest.NewServer(http.NotFoundHandler())
	defer broken.Close()
	dir := t.TempDir()
	ctx := context.Background()
	// The first mirror fails; the second serves the files.
	ds, err := FashionMNIST(ctx, "train", Dir(dir), DownloadFrom(broken.URL, srv.URL), Flatten())
	if err != nil {
		t.Fatal(err)
	}
	if ds.Len() != 6 || ds.Shape()[0] != 784 || hits.Load() != 2 {
		t.Fatalf("%d examples of shape %v after %d requests", ds.Len(), ds.Shape(), hits.Load())
	}
	for _, f := range []string{"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("downloaded file not kept: %v", err)
		}
	}
	// Now cached: no more requests.
	if _, err := FashionMNIST(ctx, "train", Dir(dir), DownloadFrom(srv.URL)); err != nil || hits.Load() != 2 {
		t.Fatalf("second load: %v after %d requests", err, hits.Load())
	}
	test, err := FashionMNIST(ctx, "test", Dir(dir), DownloadFrom(srv.URL))
	if err != nil || test.Len() != 3 || len(test.Shape()) != 3 {
		t.Fatalf("test split: %v, %v", test, err)
	}
}

func TestFashionMNISTSearchOrder(t *testing.T) {
	data := t.TempDir()
	sub := filepath.Join(data, "fashion-mnist")
	os.Mkdir(sub, 0o755)
	// Plain (not gzipped) files in $TANDEM_DATA/fashion-mnist.
	writeSet(t, sub, "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", 4, 28, 28, false)
	t.Setenv("TANDEM_DATA", data)
	ds, err := FashionMNIST(context.Background(), "test", NoDownload(), CacheDir(t.TempDir()))
	if err != nil || ds.Len() != 4 {
		t.Fatalf("from TANDEM_DATA: %v, %v", ds, err)
	}
}

func TestFashionMNISTNotFound(t *testing.T) {
	dir := t.TempDir()
	_, err := FashionMNIST(context.Background(), "train", Dir(dir), NoDownload())
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "apt-get install dataset-fashion-mnist") ||
		!strings.Contains(err.Error(), "TANDEM_DATA") {
		t.Fatalf("err = %v; want fs.ErrNotExist and instructions", err)
	}
	// A mirror serving garbage: the download is refused and nothing is kept.
	junk := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("<html>not a data set</html>"))
	}))
	defer junk.Close()
	_, err = FashionMNIST(context.Background(), "train", Dir(dir), DownloadFrom(junk.URL))
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "not a valid IDX file") {
		t.Fatalf("garbage download: %v", err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Fatalf("garbage download left %d files", len(left))
	}
	if _, err := FashionMNIST(context.Background(), "validation", Dir(dir)); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("unknown split: %v", err)
	}
	if _, err := FashionMNIST(context.Background(), "test", Shuffle(1)); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("loader option: %v", err)
	}
}

func TestFashionMNISTDownloadTimeout(t *testing.T) {
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer slow.Close()
	defer close(release)
	_, err := FashionMNIST(context.Background(), "train", Dir(t.TempDir()), DownloadFrom(slow.URL), DownloadTimeout(50*time.Millisecond))
	if !errors.Is(err, errs.Timeout) || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("err = %v; want errs.Timeout and fs.ErrNotExist", err)
	}
}

// TestFashionMNISTReal checks the real data set where one is installed
// (TANDEM_DATA or Debian's dataset-fashion-mnist); elsewhere the tests above
// cover the same code on generated files.
func TestFashionMNISTReal(t *testing.T) {
	found := false
	for _, d := range []string{os.Getenv("TANDEM_DATA"), FashionMNISTDebianDir} {
		if d != "" && (findIDX(d, "t10k-images-idx3-ubyte") != "" || findIDX(filepath.Join(d, "fashion-mnist"), "t10k-images-idx3-ubyte") != "") {
			found = true
		}
	}
	if !found {
		t.Skip("Fashion-MNIST not installed (apt-get install dataset-fashion-mnist, or set TANDEM_DATA)")
	}
	// The whole test split; the training split's labels only (decoding its
	// 47 MB of pixels takes half a minute under the race detector).
	for split, n := range map[string]int{"train": 60000, "test": 10000} {
		var ds interface {
			Len() int
			Label(int) int
		}
		if split == "test" {
			d, err := FashionMNIST(context.Background(), split, NoDownload())
			if err != nil {
				t.Fatal(err)
			}
			ds = d
		} else {
			dir := os.Getenv("TANDEM_DATA")
			if dir == "" || findIDX(dir, "train-labels-idx1-ubyte") == "" && findIDX(filepath.Join(dir, "fashion-mnist"), "train-labels-idx1-ubyte") == "" {
				dir = FashionMNISTDebianDir
			}
			if p := filepath.Join(dir, "fashion-mnist"); findIDX(p, "train-labels-idx1-ubyte") != "" {
				dir = p
			}
			x, err := ReadIDXFile(findIDX(dir, "train-labels-idx1-ubyte"))
			if err != nil {
				t.Fatal(err)
			}
			ds = labelsOnly(x.Data)
		}
		var counts [10]int
		for i := 0; i < ds.Len(); i++ {
			counts[ds.Label(i)]++
		}
		if ds.Len() != n {
			t.Fatalf("%s: %d examples, want %d", split, ds.Len(), n)
		}
		for c, k := range counts {
			if k != n/10 {
				t.Fatalf("%s: class %d (%s) has %d examples, want %d", split, c, FashionMNISTClass(c), k, n/10)
			}
		}
	}
}

type labelsOnly []byte

func (l labelsOnly) Len() int        { return len(l) }
func (l labelsOnly) Label(i int) int { return int(l[i]) }
