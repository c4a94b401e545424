package floodtest

import "testing"

// Memory is what a flood test measured of its child: RSS before the flood,
// at its peak and after it, and the bytes the Go runtime held for live
// objects and stacks before and after (the before and after figures taken
// by RSSAfterFree).
type Memory struct {
	Base, Peak, After   int64
	BaseHeld, AfterHeld int64
}

// Check logs the figures and fails the test where the growth passes
// PeakGrowth, AfterGrowth or HeldGrowth; who names the child in messages.
func (m Memory) Check(t testing.TB, who string) {
	t.Helper()
	t.Logf("%s: RSS baseline %.1f MiB, peak %.1f MiB, %.1f MiB after the flood; Go heap and stacks in use %.1f MiB before, %.1f MiB after "+
		"(both once it freed its unused memory)",
		who, MiB(m.Base), MiB(m.Peak), MiB(m.After), MiB(m.BaseHeld), MiB(m.AfterHeld))
	if m.Peak-m.Base > PeakGrowth {
		t.Errorf("%s: RSS grew by %.1f MiB under the flood; want at most %.0f MiB",
			who, MiB(m.Peak-m.Base), MiB(PeakGrowth))
	}
	if m.After-m.Base > AfterGrowth() {
		t.Errorf("%s: RSS stayed %.1f MiB above its baseline after the flood; want at most %.0f MiB",
			who, MiB(m.After-m.Base), MiB(AfterGrowth()))
	}
	if m.AfterHeld-m.BaseHeld > HeldGrowth {
		t.Errorf("%s holds %.1f MiB more live memory after the flood than before; want at most %.0f MiB",
			who, MiB(m.AfterHeld-m.BaseHeld), MiB(HeldGrowth))
	}
}
