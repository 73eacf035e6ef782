// Command hello (scripts/measure-app.sh): the smallest Fyne
// window, for the toolkit's own idle cost.
package main

import (
	"fyne.io/fyne/v2"
	"fyne.io/fyne/v2/app"
	"fyne.io/fyne/v2/widget"
)

func main() {
	a := app.NewWithID("ai.kvasir.hello")
	w := a.NewWindow("hello")
	w.SetContent(widget.NewLabel("hello"))
	w.Resize(fyne.NewSize(1280, 800))
	w.ShowAndRun()
}
