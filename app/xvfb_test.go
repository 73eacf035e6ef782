package app

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"fyne.io/fyne/v2"
	fyneapp "fyne.io/fyne/v2/app"
	"fyne.io/fyne/v2/container"

	"github.com/kvasir-ai/kvasir/app/instance"
	"github.com/kvasir-ai/kvasir/app/node"
	"github.com/kvasir-ai/kvasir/app/status"
	"github.com/kvasir-ai/kvasir/backbone/swarmtest"
	"github.com/kvasir-ai/kvasir/wallet"
)

// TestMain runs the real-window check instead of the tests when
// KVASIR_XVFB_SHOT names a PNG path: Fyne's GL driver must own the main
// goroutine, which only TestMain has. Run it under a display, e.g.
//
//	KVASIR_XVFB_SHOT=/tmp/shot.png xvfb-run -a -s "-screen 0 1024x768x24" go test ./app/ -run XXX
//
// (app/xvfb.sh does this, also against a loopback swarm).
func TestMain(m *testing.M) {
	if shot := os.Getenv("KVASIR_XVFB_SHOT"); shot != "" {
		os.Exit(xvfbShot(shot))
	}
	os.Exit(m.Run())
}

// xvfbShot opens the real window over a fake backend that serves about
// 2,500 rows/s, lets it run for KVASIR_XVFB_SECONDS (default 12), takes a
// screenshot of the root window with ImageMagick's `import`, checks it
// (CheckScreenshot) and quits. It returns the exit code.
func xvfbShot(path string) int {
	secs := 12
	if s := os.Getenv("KVASIR_XVFB_SECONDS"); s != "" {
		fmt.Sscan(s, &secs)
	}
	if os.Getenv("KVASIR_XVFB_SWARM") != "" {
		return xvfbSwarmShot(path, secs)
	}
	a := fyneapp.NewWithID(AppID + ".xvfbtest")
	be := &fakeBackend{snap: status.Snapshot{State: status.Connected, Gateway: "127.0.0.1:8443", RTT: 1200 * time.Microsecond,
		Session: "demo-1", ConnectedSince: time.Now(), CPULimit: 50}, sum: sampleSummary(),
		slice: status.SliceInfo{Dir: "/var/lib/kvasir/slice", Layers: 2, Experts: 256, Bytes: 48 << 20, QuotaBytes: 4 << 30, Verified: true, VerifiedAt: time.Now()}}
	w := NewWindow(a, be, nil, nil, true)
	resizeFromEnv(w)
	stop := make(chan struct{})
	go w.Loop(stop)
	go func() { // a worker serving bursts: 2,000-3,000 rows/s, ~520 bytes per row
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			rows := uint64(500 + 250*(i%5))
			be.mu.Lock()
			be.snap.Rows += rows
			be.snap.Requests += 4
			be.snap.BytesIn += rows * 256
			be.snap.BytesOut += rows * 264
			served := be.snap.BytesIn + be.snap.BytesOut
			be.sum.BytesServed = served
			be.sum.MeteredNKVR = served * 7
			if i%8 == 7 { // the gateway credits what was served so far
				be.sum.CreditedBytes, be.sum.CreditedNKVR, be.sum.PendingNKVR = served, served*7, served*7
				be.sum.Statements++
				be.sum.History = append([]wallet.Event{{Time: time.Now().UTC(), State: wallet.StateCredited,
					Statement: be.sum.Statements, Bytes: served, NKVR: served * 7}}, be.sum.History...)
			}
			be.mu.Unlock()
		}
	}()
	code := 1
	go func() {
		time.Sleep(time.Duration(secs) * time.Second)
		out, err := exec.Command("import", "-window", "root", path).CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "import: %v: %s\n", err, out)
		} else if err := CheckScreenshot(path); err != nil {
			fmt.Fprintln(os.Stderr, "screenshot:", err)
		} else {
			fmt.Println("screenshot ok:", path)
			code = 0
		}
		if ws := os.Getenv("KVASIR_XVFB_WALLET_SHOT"); ws != "" {
			shootTab(w, 1, ws)
		}
		if ss := os.Getenv("KVASIR_XVFB_SETTINGS_SHOT"); ss != "" {
			shootTab(w, 3, ss)
		}
		settingsShot(w)
		fyne.Do(a.Quit)
	}()
	w.Win.ShowAndRun()
	close(stop)
	return code
}

// shootTab selects tab i of w's window, lets it draw and writes the
// screen to path (ImageMagick's import).
func shootTab(w *Window, i int, path string) {
	fyne.DoAndWait(func() { w.UI.Tabs.SelectIndex(i) })
	time.Sleep(2500 * time.Millisecond)
	if out, err := exec.Command("import", "-window", "root", path).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "import: %v: %s\n", err, out)
	}
}

// xvfbSwarmShot is xvfbShot against a real loopback swarm
// (backbone/swarmtest: TLS gateway, hub, ledger, crediting, dispatcher
// with load) and a real node (SQLite wallet, the default key store),
// started as a first run of the app: no saved settings (xvfb.sh gives it
// an empty XDG_CONFIG_HOME), the default gateway pointed at the swarm
// ($KVASIR_DEFAULT_GATEWAY) and trusted through the system roots
// (SSL_CERT_FILE, standing in for a public CA), the slice folder in the
// data folder, experts downloaded within the default quota. Besides the
// screenshot check it requires the window to show non-zero throughput,
// the live estimate and pending KVR, writes the wallet tab to
// $KVASIR_XVFB_WALLET_SHOT when set, and then closes the window as a user
// would: on this desktop, which has a session bus but no tray host, that
// must quit the app (after the work in flight) rather than hide it.
func xvfbSwarmShot(path string, secs int) int {
	dir, err := os.MkdirTemp("", "kvasir-xvfb-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	sw, err := swarmtest.Start(filepath.Join(dir, "swarm"), 500*time.Millisecond)
	if err != nil {
		fmt.Fprintln(os.Stderr, "swarm:", err)
		return 1
	}
	defer sw.Close()
	os.Setenv(node.EnvDefaultGateway, sw.URL)
	os.Setenv("SSL_CERT_FILE", sw.CAFile) // read once, at the first TLS verification: the node's dial
	os.Setenv("SSL_CERT_DIR", filepath.Join(dir, "no-certs"))

	a := fyneapp.NewWithID(AppID + ".xvfbtest")
	s := LoadSettings(a.Preferences())
	cfg, err := NodeConfig(s, "", os.Stderr)
	if err != nil || s.GatewayURL != "" || s.SliceDir != "" || cfg.GatewayURL != sw.URL {
		fmt.Fprintf(os.Stderr, "not a first run: settings %+v, config %+v, %v\n", s, cfg, err)
		return 1
	}
	// Credits follow the work by the hub's settle delay (its default,
	// 30 s), then within a second here.
	cfg.Threads, cfg.SyncEvery = 1, time.Second
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if b := os.Getenv("KVASIR_XVFB_BACKEND"); b != "" {
		// e.g. vulkan:0: lavapipe, which automatic never takes; saved as
		// `kvasir --backend` saves it, so that Settings shows the choice.
		cfg.Backend, s.Backend = b, b
		s.Save(a.Preferences())
	}
	lock, err := instance.Acquire(cfg.DataDir, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "instance:", err)
		return 1
	}
	defer lock.Release()
	mgr := &node.Manager{}
	if err := mgr.Start(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "node:", err)
		return 1
	}
	defer mgr.Stop()
	sw.Load(64, 25*time.Millisecond)

	w := NewWindow(a, mgr, nil, nil, true)
	resizeFromEnv(w)
	stop := make(chan struct{})
	go w.Loop(stop)
	code := 1
	go func() {
		time.Sleep(time.Duration(secs) * time.Second)
		var rows, est, pending, state string
		fyne.DoAndWait(func() {
			rows, est, pending, state = w.UI.rowsPS.Text, w.UI.estT.Text, w.UI.credT.Text, w.UI.state.Text
		})
		st := mgr.Stats()
		sum, _ := mgr.Summary()
		info := mgr.Slice()
		fmt.Printf("window: %s, %s, earned %s, pending %s; worker %d rows, %d requests; slice %s; wallet credited %d bytes; %s\n",
			state, rows, est, pending, st.Rows, st.Requests, info.Summary(), sum.CreditedBytes, w.TrayStatus())
		out, err := exec.Command("import", "-window", "root", path).CombinedOutput()
		switch {
		case err != nil:
			fmt.Fprintf(os.Stderr, "import: %v: %s\n", err, out)
		case rows == status.FormatRows(0) || pending == status.FormatKVR(0) || est == status.FormatKVR(0) || st.Rows == 0:
			fmt.Fprintln(os.Stderr, "the window shows no work served, no estimate or no pending KVR")
		case info.Experts == 0 || info.Dir != filepath.Join(cfg.DataDir, "slice"):
			fmt.Fprintf(os.Stderr, "the first run holds no experts in the data folder: %+v\n", info)
		default:
			if err := CheckScreenshot(path); err != nil {
				fmt.Fprintln(os.Stderr, "screenshot:", err)
			} else {
				fmt.Println("screenshot ok:", path)
				code = 0
			}
		}
		if ws := os.Getenv("KVASIR_XVFB_WALLET_SHOT"); ws != "" {
			fyne.DoAndWait(func() { w.UI.Tabs.SelectIndex(1) })
			time.Sleep(1500 * time.Millisecond)
			fyne.DoAndWait(func() { w.UI.history.OpenBranch(w.UI.historyChildren("")[0]) })
			time.Sleep(1500 * time.Millisecond)
			if out, err := exec.Command("import", "-window", "root", ws).CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "import: %v: %s\n", err, out)
			}
		}
		settingsShot(w)
		// Close the window as its close button does.
		if !strings.Contains(w.TrayStatus(), "closing the window quits") {
			fmt.Fprintf(os.Stderr, "no tray host on this desktop, yet: %q\n", w.TrayStatus())
			code = 1
		}
		fyne.Do(w.RequestClose)
		time.Sleep(QuitGrace + 10*time.Second)
		fmt.Fprintln(os.Stderr, "closing the window did not quit the app")
		os.Exit(1)
	}()
	w.Win.ShowAndRun()
	close(stop)
	if code == 0 {
		fmt.Println("closing the window quit the app:", w.TrayStatus())
	}
	return code
}

// settingsShot writes the settings tab to $KVASIR_XVFB_SETTINGS_SHOT when
// set (the "Compute on" picker and the device in use), scrolled to the
// top, again scrolled to the picker's row when the window is too short to
// show it (..._scrolled.png), and with the picker open (..._open.png).
func settingsShot(w *Window) {
	ss := os.Getenv("KVASIR_XVFB_SETTINGS_SHOT")
	if ss == "" {
		return
	}
	fyne.DoAndWait(func() { w.UI.Tabs.SelectIndex(3) })
	time.Sleep(2000 * time.Millisecond)
	if out, err := exec.Command("import", "-window", "root", ss).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "import: %v: %s\n", err, out)
	}
	var fits bool
	fyne.DoAndWait(func() {
		sc := w.UI.Settings.Content.(*container.Scroll)
		drv := fyne.CurrentApp().Driver()
		y := drv.AbsolutePositionForObject(w.UI.Settings.compute).Y - drv.AbsolutePositionForObject(sc).Y + sc.Offset.Y
		fits = y+180 < sc.Size().Height
		if !fits {
			sc.ScrollToOffset(fyne.NewPos(0, y-20))
		}
	})
	if !fits {
		time.Sleep(1000 * time.Millisecond)
		scrolled := strings.TrimSuffix(ss, ".png") + "_scrolled.png"
		if out, err := exec.Command("import", "-window", "root", scrolled).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "import: %v: %s\n", err, out)
		}
	}
	// The picker opened: the devices found.
	fyne.DoAndWait(func() { w.UI.Settings.compute.Tapped(&fyne.PointEvent{}) })
	time.Sleep(1000 * time.Millisecond)
	open := strings.TrimSuffix(ss, ".png") + "_open.png"
	if out, err := exec.Command("import", "-window", "root", open).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "import: %v: %s\n", err, out)
	}
}

// resizeFromEnv sizes the window to $KVASIR_XVFB_SIZE (WxH, e.g.
// 640x480), as app/xvfb.sh sets it with the screen.
func resizeFromEnv(w *Window) {
	var wd, ht float32
	if n, _ := fmt.Sscanf(os.Getenv("KVASIR_XVFB_SIZE"), "%fx%f", &wd, &ht); n == 2 {
		w.Win.Resize(fyne.NewSize(wd, ht))
	}
}

// CheckScreenshot decodes the PNG at path and fails when it looks blank:
// fewer than 64 distinct colours, or no pixel near the chart's rows/s
// blue and MB/s green (the live tiles and lines).
func CheckScreenshot(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		return err
	}
	colors := map[color.RGBA]bool{}
	var rowsPx, mbPx int
	near := func(c color.RGBA, w color.NRGBA) bool {
		d := func(a, b uint8) int {
			if a > b {
				return int(a - b)
			}
			return int(b - a)
		}
		return d(c.R, w.R)+d(c.G, w.G)+d(c.B, w.B) < 24
	}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bb, _ := img.At(x, y).RGBA()
			c := color.RGBA{uint8(r >> 8), uint8(g >> 8), uint8(bb >> 8), 0xff}
			colors[c] = true
			if near(c, rowsColor) {
				rowsPx++
			}
			if near(c, mbColor) {
				mbPx++
			}
		}
	}
	if len(colors) < 64 {
		return fmt.Errorf("looks blank: %d distinct colours in %v", len(colors), b)
	}
	if rowsPx < 200 || mbPx < 200 {
		return fmt.Errorf("no live throughput drawn: %d rows/s-blue and %d MB/s-green pixels", rowsPx, mbPx)
	}
	return nil
}

func TestCheckScreenshotRejectsBlank(t *testing.T) {
	p := t.TempDir() + "/blank.png"
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := png.Encode(f, image.NewRGBA(image.Rect(0, 0, 64, 64))); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := CheckScreenshot(p); err == nil {
		t.Error("a black image passed")
	}
	if err := CheckScreenshot("testdata/status_connected.png"); err != nil {
		t.Errorf("the rendered master failed: %v", err)
	}
}
