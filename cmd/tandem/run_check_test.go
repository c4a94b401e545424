package main

// Small assertion helpers for the tests of `tandem run`: check* report and
// go on, must* report and stop the test. An optional message is a format
// string and its arguments.

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

func msgOf(msg []any) string {
	if len(msg) == 0 {
		return ""
	}
	if f, ok := msg[0].(string); ok {
		return ": " + fmt.Sprintf(f, msg[1:]...)
	}
	return ": " + fmt.Sprint(msg...)
}

func mustNoErr(t *testing.T, err error, msg ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("unexpected error %v%s", err, msgOf(msg))
	}
}

func mustErr(t *testing.T, err error, msg ...any) {
	t.Helper()
	if err == nil {
		t.Fatalf("expected an error, got none%s", msgOf(msg))
	}
}

func checkEqual[T any](t *testing.T, want, got T, msg ...any) bool {
	t.Helper()
	if !reflect.DeepEqual(want, got) {
		t.Errorf("got  %#v\nwant %#v%s", got, want, msgOf(msg))
		return false
	}
	return true
}

func mustEqual[T any](t *testing.T, want, got T, msg ...any) {
	t.Helper()
	if !checkEqual(t, want, got, msg...) {
		t.FailNow()
	}
}

func checkNotEqual[T any](t *testing.T, a, b T, msg ...any) {
	t.Helper()
	if reflect.DeepEqual(a, b) {
		t.Errorf("both are %#v%s", a, msgOf(msg))
	}
}

func checkMatch(t *testing.T, re any, s string, msg ...any) bool {
	t.Helper()
	var r *regexp.Regexp
	switch v := re.(type) {
	case *regexp.Regexp:
		r = v
	case string:
		r = regexp.MustCompile(v)
	default:
		t.Fatalf("checkMatch: pattern of type %T", re)
	}
	if !r.MatchString(s) {
		t.Errorf("%q does not match %s%s", s, r, msgOf(msg))
		return false
	}
	return true
}

func mustMatch(t *testing.T, re any, s string, msg ...any) {
	t.Helper()
	if !checkMatch(t, re, s, msg...) {
		t.FailNow()
	}
}

func checkTrue(t *testing.T, ok bool, msg ...any) {
	t.Helper()
	if !ok {
		t.Errorf("condition is false%s", msgOf(msg))
	}
}

func mustTrue(t *testing.T, ok bool, msg ...any) {
	t.Helper()
	if !ok {
		t.Fatalf("condition is false%s", msgOf(msg))
	}
}

func checkContains(t *testing.T, s, sub string, msg ...any) {
	t.Helper()
	if !strings.Contains(s, sub) {
		t.Errorf("%q does not contain %q%s", s, sub, msgOf(msg))
	}
}

func checkNotContains(t *testing.T, s, sub string, msg ...any) {
	t.Helper()
	if strings.Contains(s, sub) {
		t.Errorf("%q contains %q%s", s, sub, msgOf(msg))
	}
}

func checkErrorIs(t *testing.T, err, target error, msg ...any) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Errorf("error %v is not %v%s", err, target, msgOf(msg))
	}
}

func checkErrorContains(t *testing.T, err error, sub string, msg ...any) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), sub) {
		t.Errorf("error %v does not contain %q%s", err, sub, msgOf(msg))
	}
}
