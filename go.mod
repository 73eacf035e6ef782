module github.com/kvasir-ai/kvasir

go 1.26.0

require (
	fyne.io/fyne/v2 v2.7.1 // indirect
	github.com/coder/websocket v1.8.15 // indirect
	github.com/danieljoos/wincred v1.2.3 // indirect
	github.com/godbus/dbus/v5 v5.2.2 // indirect
	github.com/mattn/go-sqlite3 v1.14.53 // indirect
	github.com/prometheus/client_golang v1.25.0 // indirect
	github.com/zalando/go-keyring v0.2.8 // indirect
	go.uber.org/goleak v1.3.0 // indirect
	golang.org/x/mobile v0.0.0-20261011034528-197770444867 // indirect
	golang.org/x/sys v0.50.0 // indirect
)
