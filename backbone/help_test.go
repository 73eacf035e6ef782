package main

import (
	"os"
	"testing"
)

// TestHelpExitsZero: "backbone <command> -h" prints the command's flags and
// exits 0 (asked-for help is not an error), while an unknown flag exits 2.
func TestHelpExitsZero(t *testing.T) {
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	stderr, stdout := os.Stderr, os.Stdout
	os.Stderr, os.Stdout = devnull, devnull // the commands print usage there
	defer func() { os.Stderr, os.Stdout = stderr, stdout }()
	for name, c := range commands {
		if name == "devices" { // takes no flags
			continue
		}
		if code := c.run([]string{"-h"}); code != 0 {
			t.Errorf("%s -h: exit %d, want 0", name, code)
		}
		if code := c.run([]string{"--no-such-flag"}); code != 2 {
			t.Errorf("%s --no-such-flag: exit %d, want 2", name, code)
		}
	}
}
