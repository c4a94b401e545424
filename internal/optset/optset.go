// Package optset records which functional options a caller set, so that a
// constructor sharing an option type with others can refuse the options that
// do not apply to it, naming them (optim's and data's constructors do).
package optset

import (
	"slices"
	"sort"
)

// Set is the names of the options that were applied.
type Set map[string]bool

// Mark records that the option name was applied.
func (s *Set) Mark(name string) {
	if *s == nil {
		*s = Set{}
	}
	(*s)[name] = true
}

// Foreign returns, sorted, the names in s that are not in allowed.
func (s Set) Foreign(allowed []string) []string {
	var out []string
	for name := range s {
		if !slices.Contains(allowed, name) {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}
