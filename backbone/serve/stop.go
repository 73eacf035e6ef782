package serve

import "strings"

// stopMatcher trims generated text at stop strings, as the OpenAI API does:
// generation ends at the first token after which the text contains a stop
// string, and the output is that text cut before the earliest occurrence of
// any stop string in it (so it contains neither the stop string nor
// anything after it; llama.cpp's server applies the same rule). While streaming, it holds back the longest
// tail of the text that is still a prefix of some stop string, so no byte
// that a later stop match would remove is ever released.
//
// A released position i can never become the start of a match: the text from
// i neither contains a stop string at i nor is a prefix of one, so the two
// already differ at some byte. Searching from the first held byte therefore
// finds the earliest match.
type stopMatcher struct {
	stops []string
	held  string // text not yet released
}

// feed appends text and returns the text that may be released now and
// whether a stop string matched (then out is the text before the match and
// the matcher must not be fed again).
func (m *stopMatcher) feed(text string) (out string, stopped bool) {
	m.held += text
	if len(m.stops) == 0 {
		out, m.held = m.held, ""
		return out, false
	}
	first := -1
	for _, s := range m.stops {
		if i := strings.Index(m.held, s); i >= 0 && (first < 0 || i < first) {
			first = i
		}
	}
	if first >= 0 {
		out, m.held = m.held[:first], ""
		return out, true
	}
	keep := 0 // length of the longest held suffix that is a proper prefix of a stop
	for _, s := range m.stops {
		for n := min(len(s)-1, len(m.held)); n > keep; n-- {
			if strings.HasSuffix(m.held, s[:n]) {
				keep = n
				break
			}
		}
	}
	cut := len(m.held) - keep
	out, m.held = m.held[:cut], m.held[cut:]
	return out, false
}

// flush releases the held text (generation ended without a match).
func (m *stopMatcher) flush() string {
	out := m.held
	m.held = ""
	return out
}
