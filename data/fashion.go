package data

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tandemml/tandem/internal/errs"
)

// FashionMNISTDebianDir is where Debian's dataset-fashion-mnist package
// installs the four gzip files.
const FashionMNISTDebianDir = "/usr/share/datasets/fashion-mnist"

// FashionMNISTMirrors returns the canonical download locations of
// Fashion-MNIST, tried in order.
func FashionMNISTMirrors() []string {
	return []string{
		"http://fashion-mnist.s3-website.eu-central-1.amazonaws.com",
		"https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion",
	}
}

// FashionMNISTClass names class label (0 to 9) of Fashion-MNIST.
func FashionMNISTClass(label int) string {
	names := [10]string{"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
		"Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"}
	if label < 0 || label >= len(names) {
		return fmt.Sprintf("label %d", label)
	}
	return names[label]
}

// fashionFiles returns the base names (without .gz) of a split's files.
func fashionFiles(split string) (images, labels string, err error) {
	switch split {
	case "train":
		return "train-images-idx3-ubyte", "train-labels-idx1-ubyte", nil
	case "test":
		return "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", nil
	}
	return "", "", fmt.Errorf("data: Fashion-MNIST split %q (want \"train\" or \"test\"): %w", split, ErrInvalidArgument)
}

// FashionMNIST loads the "train" (60000 images) or "test" (10000 images)
// split of Zalando's Fashion-MNIST as 28x28 float32 images with pixels in
// [0, 1] (or normalised, with Normalize) and labels 0 to 9.
//
// The files (train-images-idx3-ubyte.gz and so on, gzip or not) are looked
// for, in order, in $TANDEM_DATA/fashion-mnist, $TANDEM_DATA,
// /usr/share/datasets/fashion-mnist (Debian's dataset-fashion-mnist package)
// and the cache folder (<user cache dir>/tandem/fashion-mnist, or CacheDir).
// If none holds them, they are downloaded from the canonical mirrors into the
// cache folder, bounded by DownloadTimeout and ctx; downloads are checked by
// decoding them (gzip checksum, IDX header, 28x28 images, labels below 10),
// not by a digest, since mirrors recompress the files. With Dir, only that
// folder is searched (and downloaded into).
//
// Options: Normalize, Flatten, Dir, CacheDir, NoDownload, DownloadFrom,
// DownloadTimeout. When the files cannot be found or fetched the error wraps
// fs.ErrNotExist and says how to install them.
func FashionMNIST(ctx context.Context, split string, opts ...Option) (*InMemory, error) {
	o := options{dlTimeout: 2 * time.Minute}
	allowed := []string{"Normalize", "Flatten", "Dir", "CacheDir", "NoDownload", "DownloadFrom", "DownloadTimeout"}
	if err := o.apply("FashionMNIST", allowed, opts); err != nil {
		return nil, err
	}
	imagesName, labelsName, err := fashionFiles(split)
	if err != nil {
		return nil, err
	}
	var search []string
	cache := o.cacheDir
	if o.dir != "" {
		search, cache = []string{o.dir}, o.dir
	} else {
		if env := os.Getenv("TANDEM_DATA"); env != "" {
			search = append(search, filepath.Join(env, "fashion-mnist"), env)
		}
		search = append(search, FashionMNISTDebianDir)
		if cache == "" {
			if uc, err := os.UserCacheDir(); err == nil {
				cache = filepath.Join(uc, "tandem", "fashion-mnist")
			}
		}
		if cache != "" {
			search = append(search, cache)
		}
	}
	loadOpts := make([]Option, 0, 2)
	if o.set["Normalize"] {
		loadOpts = append(loadOpts, Normalize(o.mean, o.std))
	}
	if o.flatten {
		loadOpts = append(loadOpts, Flatten())
	}
	for _, dir := range search {
		img, lab := findIDX(dir, imagesName), findIDX(dir, labelsName)
		if img != "" && lab != "" {
			return loadFashion(img, lab, loadOpts)
		}
	}
	howTo := fmt.Sprintf("install Debian's package (apt-get install dataset-fashion-mnist, files in %s), "+
		"or put %s.gz and %s.gz in a folder and set TANDEM_DATA to it", FashionMNISTDebianDir, imagesName, labelsName)
	if o.noDownload || cache == "" {
		return nil, fmt.Errorf("data: Fashion-MNIST %s split not found in %s; %s: %w",
			split, strings.Join(search, ", "), howTo, fs.ErrNotExist)
	}
	mirrors := FashionMNISTMirrors()
	if o.set["DownloadFrom"] {
		mirrors = o.mirrors
	}
	dctx, cancel := context.WithTimeout(ctx, o.dlTimeout)
	defer cancel()
	var paths [2]string
	for i, name := range []string{imagesName, labelsName} {
		if p := findIDX(cache, name); p != "" {
			paths[i] = p
			continue
		}
		p, err := download(dctx, mirrors, cache, name+".gz")
		if err != nil && errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w: %w", errs.Timeout, err)
		}
		if err != nil {
			return nil, fmt.Errorf("data: Fashion-MNIST %s split not found in %s and the download failed (%w); %s: %w",
				split, strings.Join(search, ", "), err, howTo, fs.ErrNotExist)
		}
		paths[i] = p
	}
	return loadFashion(paths[0], paths[1], loadOpts)
}

// findIDX returns the path of name.gz or name in dir, or "".
func findIDX(dir, name string) string {
	for _, n := range []string{name + ".gz", name} {
		p := filepath.Join(dir, n)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p
		}
	}
	return ""
}

func loadFashion(images, labels string, opts []Option) (*InMemory, error) {
	ds, err := LoadIDX(images, labels, opts...)
	if err != nil {
		return nil, err
	}
	if err := checkFashion(ds); err != nil {
		return nil, fmt.Errorf("data: %s, %s: %w", images, labels, err)
	}
	return ds, nil
}

// checkFashion verifies what a Fashion-MNIST split must look like.
func checkFashion(ds *InMemory) error {
	sh := ds.Shape()
	if n := len(ds.x) / max(1, ds.Len()); n != 28*28 {
		return fmt.Errorf("images of shape %v, Fashion-MNIST's are 28x28: %w", sh, ErrInvalidArgument)
	}
	for i, y := range ds.labels {
		if y < 0 || y > 9 {
			return fmt.Errorf("label %d of example %d, Fashion-MNIST's are 0 to 9: %w", y, i, ErrInvalidArgument)
		}
	}
	return nil
}

// download fetches file from the first mirror that serves it, checks that it
// decodes as an IDX file, and moves it into dir. It returns its path.
func download(ctx context.Context, mirrors []string, dir, file string) (string, error) {
	if len(mirrors) == 0 {
		return "", errors.New("no mirror to download from")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	client := &http.Client{Transport: &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 15 * time.Second,
	}}
	defer client.CloseIdleConnections()
	var failures []error
	for _, base := range mirrors {
		url := strings.TrimSuffix(base, "/") + "/" + file
		p, err := fetch(ctx, client, url, dir, file)
		if err == nil {
			return p, nil
		}
		failures = append(failures, fmt.Errorf("%s: %w", url, err))
		if ctx.Err() != nil {
			break
		}
	}
	return "", errors.Join(failures...)
}

func fetch(ctx context.Context, client *http.Client, url, dir, file string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("HTTP %s", resp.Status)
	}
	tmp, err := os.CreateTemp(dir, file+".part-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := io.Copy(tmp, resp.Body); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if _, err := ReadIDXFile(tmp.Name()); err != nil {
		return "", fmt.Errorf("downloaded file is not a valid IDX file: %w", err)
	}
	final := filepath.Join(dir, file)
	if err := os.Rename(tmp.Name(), final); err != nil {
		return "", err
	}
	return final, nil
}
