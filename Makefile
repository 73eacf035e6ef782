# kvasir — common tasks. README.md gives the two set-up commands; these are shortcuts.
GO ?= go

.PHONY: run test bench lint app backbone android ios bind-android bind-ios fuzz

run: ## the main job on the embedded default: a loopback swarm decoding with the tiny model
	$(GO) run ./backbone demo

test: ## everything CI runs
	bash scripts/test.sh

bench: ## benchmarks recorded in docs/BENCHMARKS.md
	bash scripts/bench.sh

lint: ## gofmt, vet, staticcheck
	test -z "$$(gofmt -l $$(git ls-files '*.go'))"
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@latest ./...

backbone: ## the headless server binary (no GUI libraries needed)
	$(GO) build -o bin/backbone ./backbone

app: ## the desktop contributor app (needs cgo + X11/GL headers)
	$(GO) build -o bin/kvasir .

android: ## needs the Android SDK + NDK (ANDROID_NDK_HOME) and the fyne tool
	$(GO) run fyne.io/tools/cmd/fyne@v1.7.4 package -os android -app-id ai.kvasir.contributor

ios: ## needs macOS with Xcode and the fyne tool
	$(GO) run fyne.io/tools/cmd/fyne@v1.7.4 package -os ios -app-id ai.kvasir.contributor

bind-android: ## the gomobile-bindable API as an .aar for a native Android shell (needs the Android SDK + NDK)
	$(GO) tool gomobile bind -target=android -o bin/kvasir.aar ./mobile/

bind-ios: ## the same as an .xcframework for iOS (needs macOS with Xcode)
	$(GO) tool gomobile bind -target=ios -o bin/Kvasir.xcframework ./mobile/

fuzz: ## a short fuzzing pass over every parser
	bash scripts/fuzz.sh
