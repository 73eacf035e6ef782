package app

import (
	"testing"

	"fyne.io/fyne/v2"

	"github.com/kvasir-ai/kvasir/app/status"
)

// TestFitsSmallScreen: the window's content (every tab, the tab bar) fits
// the smallest screen the app supports, 640x480, whether the worker earns
// or not (the status tab's "Not earning" card shown), with the device
// line on the status tab and the "Compute on" picker in the settings.
func TestFitsSmallScreen(t *testing.T) {
	u, be, w := newTestUI(t)
	w.Resize(fyne.NewSize(640, 480))
	for _, c := range []struct {
		name string
		snap status.Snapshot
	}{
		{"earning", status.Snapshot{State: status.Connected, Device: "llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan)"}},
		{"not earning", status.Snapshot{State: status.Offline, Reason: "the gateway refused the connection; retrying in 4 s", Device: "CPU"}},
	} {
		be.snap = c.snap
		u.Poll(t0, true)()
		if m := u.Tabs.MinSize(); m.Width > 640 || m.Height > 480 {
			t.Errorf("%s: the window needs %v, more than 640x480", c.name, m)
		}
		t.Logf("%s: min size %v (status tab %v)", c.name, u.Tabs.MinSize(), u.statusTab.MinSize())
	}
	u.SetNotice("Identity key not in a keyring", "stored in a plain file")
	t.Logf("not earning, with a notice: min size %v", u.Tabs.MinSize())
}
