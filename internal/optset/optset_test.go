package optset

import (
	"slices"
	"testing"
)

func TestForeign(t *testing.T) {
	var s Set
	if got := s.Foreign([]string{"a"}); len(got) != 0 {
		t.Fatalf("empty set: %v", got)
	}
	s.Mark("lr")
	s.Mark("zeta")
	s.Mark("beta")
	s.Mark("lr")
	if got, want := s.Foreign([]string{"lr"}), []string{"beta", "zeta"}; !slices.Equal(got, want) {
		t.Fatalf("Foreign = %v, want %v", got, want)
	}
	if got := s.Foreign([]string{"beta", "lr", "zeta"}); len(got) != 0 {
		t.Fatalf("all allowed: %v", got)
	}
}
