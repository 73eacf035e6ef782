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
	"testing"
	"time"

	"fyne.io/fyne/v2"
	fyneapp "fyne.io/fyne/v2/app"

	"github.com/kvasir-ai/kvasir/app/node"
	"github.com/kvasir-ai/kvasir/app/status"
	"github.com/kvasir-ai/kvasir/app/swarmtest"
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
		Session: "demo-1", ConnectedSince: time.Now()}, sum: sampleSummary(),
		slice: status.SliceInfo{Dir: "/var/lib/kvasir/slice", Layers: 2, Experts: 256, Bytes: 48 << 20, QuotaBytes: 4 << 30, Verified: true, VerifiedAt: time.Now()}}
	w := NewWindow(a, be, nil, nil, true)
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
		fyne.Do(a.Quit)
	}()
	w.Win.ShowAndRun()
	close(stop)
	return code
}

// xvfbSwarmShot is xvfbShot against a real loopback swarm
// (app/swarmtest: TLS gateway, hub, ledger, crediting, dispatcher
// with load) and a real node (slice directory, SQLite wallet, file key
// store) run by node.Manager, as the app runs it. Besides the screenshot
// check it requires the window to show non-zero throughput and pending KVR.
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
	data := filepath.Join(dir, "data")
	mgr := &node.Manager{}
	err = mgr.Start(node.Config{GatewayURL: sw.URL, CAFile: sw.CAFile, SliceDir: sw.SliceDir, DataDir: data, Threads: 1,
		KeyStore: wallet.FileStore{Dir: data}, StoreName: "file", SyncEvery: time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		fmt.Fprintln(os.Stderr, "node:", err)
		return 1
	}
	defer mgr.Stop()
	sw.Load(64, 25*time.Millisecond)

	a := fyneapp.NewWithID(AppID + ".xvfbtest")
	w := NewWindow(a, mgr, nil, nil, true)
	stop := make(chan struct{})
	go w.Loop(stop)
	code := 1
	go func() {
		time.Sleep(time.Duration(secs) * time.Second)
		var rows, pending, state string
		fyne.DoAndWait(func() { rows, pending, state = w.UI.rowsPS.Text, w.UI.pendingT.Text, w.UI.state.Text })
		st := mgr.Stats()
		sum, _ := mgr.Summary()
		fmt.Printf("window: %s, %s, pending %s; worker %d rows, %d requests; wallet credited %d bytes\n",
			state, rows, pending, st.Rows, st.Requests, sum.CreditedBytes)
		out, err := exec.Command("import", "-window", "root", path).CombinedOutput()
		switch {
		case err != nil:
			fmt.Fprintf(os.Stderr, "import: %v: %s\n", err, out)
		case rows == status.FormatRows(0) || pending == status.FormatKVR(0) || st.Rows == 0:
			fmt.Fprintln(os.Stderr, "the window shows no work served or no pending KVR")
		default:
			if err := CheckScreenshot(path); err != nil {
				fmt.Fprintln(os.Stderr, "screenshot:", err)
			} else {
				fmt.Println("screenshot ok:", path)
				code = 0
			}
		}
		fyne.Do(a.Quit)
	}()
	w.Win.ShowAndRun()
	close(stop)
	return code
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
