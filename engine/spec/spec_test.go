package spec

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestNGram(t *testing.T) {
	cases := []struct {
		hist []int32
		max  int
		want []int32
	}{
		{[]int32{1, 2, 3, 4, 1, 2, 3}, 4, []int32{4, 1, 2, 3}},          // 3-gram 1 2 3 recurs
		{[]int32{1, 2, 3, 4, 1, 2, 3}, 2, []int32{4, 1}},                // capped by max
		{[]int32{5, 9, 7, 8, 9, 1, 2, 9}, 3, []int32{1, 2, 9}},          // 1-gram: the latest 9
		{[]int32{1, 2, 3, 4}, 4, nil},                                   // nothing recurs
		{[]int32{7, 7}, 5, []int32{7}},                                  // runs into the suffix
		{[]int32{1, 2, 9, 3, 1, 2, 8, 0, 2, 8, 1, 2}, 2, []int32{8, 0}}, // 2-gram 1 2: the latest
		{[]int32{4}, 3, nil},
		{[]int32{1, 1, 1}, 0, nil},
	}
	for _, c := range cases {
		if got := NGram(nil, c.hist, c.max); !slices.Equal(got, c.want) && !(len(got) == 0 && len(c.want) == 0) {
			t.Errorf("NGram(%v, %d) = %v, want %v", c.hist, c.max, got, c.want)
		}
	}
}

func TestParseMode(t *testing.T) {
	for in, want := range map[string]Mode{"": ModeNone, "none": ModeNone, "ngram": ModeNGram, "mtp": ModeMTP} {
		if got, err := ParseMode(in); err != nil || got != want {
			t.Errorf("ParseMode(%q) = %v, %v", in, got, err)
		}
	}
	for _, bad := range []string{"eagle", "NGram", "MTP", " ngram", "mtp ", "None"} {
		if _, err := ParseMode(bad); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", bad)) {
			t.Errorf("ParseMode(%q): %v, want an error naming it", bad, err)
		}
	}
}
