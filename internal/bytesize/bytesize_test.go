package bytesize

import (
	"errors"
	"testing"
)

func TestParse(t *testing.T) {
	for s, want := range map[string]int{"4": 4, "512K": 512 << 10, "16M": 16 << 20, "2G": 2 << 30, "32768K": 32 << 20} {
		if got, err := Parse(s); err != nil || got != want {
			t.Errorf("Parse(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"", "K", "0", "-4", "1.5M", "12k", "lots", "9999999999999G"} {
		if got, err := Parse(s); !errors.Is(err, ErrSyntax) {
			t.Errorf("Parse(%q) = %d, %v; want ErrSyntax", s, got, err)
		}
	}
}
