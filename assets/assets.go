// Package assets holds the contributor app's embedded images: the app
// icon (512 x 512 PNG, also named by FyneApp.toml) and one 64 x 64 PNG
// tray icon per connection state. They are drawn by ./gen; regenerate
// with `go generate ./assets/`.
package assets

import _ "embed" // go:embed of the PNGs below

//go:generate go run ./gen -o .

// Icon is the app icon, 512 x 512 PNG.
//
//go:embed icon.png
var Icon []byte

// Tray icons, 64 x 64 PNG, one per connection state: a ring and expert
// dots in green (connected), amber (dialing), grey (paused), red (offline).
var (
	//go:embed tray-connected.png
	TrayConnected []byte
	//go:embed tray-dialing.png
	TrayDialing []byte
	//go:embed tray-paused.png
	TrayPaused []byte
	//go:embed tray-offline.png
	TrayOffline []byte
)
