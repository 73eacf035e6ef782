//go:build cgo

package mobile

// cgo reports whether this test binary was built with cgo.
const cgo = true
