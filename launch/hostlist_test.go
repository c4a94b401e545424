package launch

import (
	"errors"
	"strings"
	"testing"

	"github.com/tandemml/tandem/internal/errs"
)

func TestExpandHostlist(t *testing.T) {
	for _, tc := range []struct {
		list string
		want string // hosts joined by spaces
	}{
		{"vm", "vm"},
		{"node[01-04,07]", "node01 node02 node03 node04 node07"},
		{"a,b[1-2],c", "a b1 b2 c"},
		{"n[8-10]", "n8 n9 n10"},
		{"n[08-10]", "n08 n09 n10"},
		{"n[001-002,10]", "n001 n002 n10"},
		{"rack[1-2]-n[1-2]", "rack1-n1 rack1-n2 rack2-n1 rack2-n2"},
		{"gpu[3]", "gpu3"},
		{"x[1-2].cluster,y", "x1.cluster x2.cluster y"},
		{"[1-2]", "1 2"},
		{"n[1-2],m[01-02]-ib", "n1 n2 m01-ib m02-ib"},
		{" a , b ", "a b"},
	} {
		got, err := ExpandHostlist(tc.list)
		if err != nil {
			t.Errorf("ExpandHostlist(%q): %v", tc.list, err)
			continue
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("ExpandHostlist(%q) = %q, want %q", tc.list, got, tc.want)
		}
		first, err := FirstHost(tc.list)
		if err != nil || first != got[0] {
			t.Errorf("FirstHost(%q) = %q, %v; want %q", tc.list, first, err, got[0])
		}
	}
}

func TestExpandHostlistErrors(t *testing.T) {
	for _, list := range []string{
		"", " ", "n[1-2", "n1-2]", "n[[1]]", "n[]", "a,,b", "n[2-1]", "n[a-b]", "n[1-]", "n[-1]",
		"n[1,]", ",a", "a,", "a b", "n[1-1000000000000000000]", "n[0-1048576]",
		"n[0-1023]m[0-1023]x[0-1]",
	} {
		got, err := ExpandHostlist(list)
		if !errors.Is(err, errs.InvalidArgument) {
			t.Errorf("ExpandHostlist(%q) = %d hosts, %v; want errs.InvalidArgument", list, len(got), err)
		}
	}
	// FirstHost checks syntax but does not expand: a list too long to
	// expand still has a first host.
	if h, err := FirstHost("n[0-1048576]"); err != nil || h != "n0" {
		t.Errorf("FirstHost of a long list = %q, %v", h, err)
	}
	if _, err := FirstHost("n[1-2"); err == nil {
		t.Error("FirstHost accepted an unclosed bracket")
	}
}

// FuzzHostlist: the parser never panics, FirstHost agrees with
// ExpandHostlist, and expanded names hold no list syntax.
func FuzzHostlist(f *testing.F) {
	for _, s := range []string{"node[01-04,07]", "a,b[1-2],c", "rack[1-2]-n[1-2]", "n[8-10]", "n[", "x]", "[0-3]", "a,,b", "n[1-2],m"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, list string) {
		first, ferr := FirstHost(list)
		hosts, err := ExpandHostlist(list)
		if err != nil {
			if !errors.Is(err, errs.InvalidArgument) {
				t.Fatalf("ExpandHostlist(%q): error %v does not wrap errs.InvalidArgument", list, err)
			}
			if ferr != nil && !errors.Is(ferr, errs.InvalidArgument) {
				t.Fatalf("FirstHost(%q): error %v does not wrap errs.InvalidArgument", list, ferr)
			}
			return
		}
		if ferr != nil {
			t.Fatalf("FirstHost(%q) failed (%v) where ExpandHostlist succeeded", list, ferr)
		}
		if len(hosts) == 0 || len(hosts) > MaxHostlist {
			t.Fatalf("ExpandHostlist(%q) gave %d hosts", list, len(hosts))
		}
		if hosts[0] != first {
			t.Fatalf("FirstHost(%q) = %q, ExpandHostlist's first is %q", list, first, hosts[0])
		}
		for _, h := range hosts {
			if h == "" || strings.ContainsAny(h, "[], \t\n") {
				t.Fatalf("ExpandHostlist(%q) gave host %q", list, h)
			}
		}
	})
}
