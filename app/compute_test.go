package app

import (
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	"fyne.io/fyne/v2/test"

	"github.com/kvasir-ai/kvasir/app/node"
	"github.com/kvasir-ai/kvasir/engine/vulkan"
	"github.com/kvasir-ai/kvasir/wallet"
)

// TestComputePicker: "Compute on" lists automatic, the CPU and every
// device found with its kind and memory; the choice is saved as its
// backend ("vulkan:1"), read back, and needs a restart of the worker
// (said in the message); a saved device no longer found keeps an option
// of its own; a listing error is said under the picker; a bad saved
// value does not validate.
func TestComputePicker(t *testing.T) {
	a := test.NewTempApp(t)
	var saved []Settings
	f := NewSettingsForm(a.Preferences(), func(s Settings) { saved = append(saved, s) })
	f.SetDevices(testDevices, nil)
	want := []string{"Automatic (a GPU if there is one, else the CPU)", "CPU only",
		"llvmpipe (LLVM 15.0.6, 256 bits) (software renderer on the CPU, 2.15 GB)",
		"NVIDIA GeForce RTX 4090 (discrete GPU, 25.8 GB)"}
	if strings.Join(f.compute.Options, "|") != strings.Join(want, "|") || f.compute.Selected != want[0] {
		t.Fatalf("options %q (selected %q), want %q with automatic selected", f.compute.Options, f.compute.Selected, want)
	}
	f.compute.SetSelected(want[3])
	if err := f.Submit(); err != nil {
		t.Fatal(err)
	}
	if len(saved) != 1 || saved[0].Backend != "vulkan:1" || LoadSettings(a.Preferences()).Backend != "vulkan:1" ||
		!NeedsRestart(DefaultSettings, saved[0]) || !strings.Contains(f.message.Text, "restarts to apply") {
		t.Fatalf("saved %+v, message %q", saved, f.message.Text)
	}
	// The GPU is gone: its choice stays shown, as not found.
	g := NewSettingsForm(a.Preferences(), nil)
	g.SetDevices(testDevices[:1], nil)
	if g.compute.Selected != "device 1 (not found now)" {
		t.Errorf("a saved device not found: selected %q of %q", g.compute.Selected, g.compute.Options)
	}
	g.SetDevices(nil, vulkan.ErrNoLoader)
	if g.computeHint.Text != "No GPU can be used: vulkan: no Vulkan loader." || !g.computeHint.Visible() || len(g.compute.Options) != 3 {
		t.Errorf("no loader: hint %q, options %q", g.computeHint.Text, g.compute.Options)
	}
	if err := (Settings{Backend: "cuda"}).Validate(); !errors.Is(err, ErrSettings) {
		t.Errorf("backend cuda validated: %v", err)
	}
}

// TestStartNodeFallsBackToCPU: a saved device that cannot be had
// (vulkan:99) starts the node on the CPU with a notice saying why; a
// working choice clears it (an empty text).
func TestStartNodeFallsBackToCPU(t *testing.T) {
	data := t.TempDir()
	cfg := node.Config{GatewayURL: "wss://127.0.0.1:1", SliceDir: t.TempDir(), QuotaBytes: 1 << 20, DataDir: data, Threads: 1,
		Backend: "vulkan:99", KeyStore: wallet.FileStore{Dir: data}, StoreName: "file", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	mgr := &node.Manager{}
	defer mgr.Stop()
	var notes []string
	notice := func(title, text string) { notes = append(notes, title+": "+text) }
	if err := StartNode(mgr, cfg, notice); err != nil {
		t.Fatal(err)
	}
	if len(notes) != 1 || !strings.HasPrefix(notes[0], "Computing on the CPU: the chosen compute device cannot be used (") ||
		!strings.Contains(notes[0], "vulkan:99") || mgr.Stats().Device != "CPU" {
		t.Fatalf("notices %q, device %q", notes, mgr.Stats().Device)
	}
	cfg.Backend = "cpu"
	if err := StartNode(mgr, cfg, notice); err != nil || len(notes) != 2 || notes[1] != ": " {
		t.Fatalf("cpu: %v, notices %q", err, notes)
	}
}
