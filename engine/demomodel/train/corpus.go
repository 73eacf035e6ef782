// Package train holds the by-hand steps that made the embedded demo model
// (engine/demomodel) apart from the training itself
// (scripts/train/train_demo.py): reading the King James Bible as Debian's
// bible-kjv prints it, splitting off the held-out book, training the BPE
// vocabulary with the project's own trainer (tokenizer.Train), encoding the
// corpus to token ids for the training script, and writing the trained
// float32 weights as a GGUF file (modelgen.BuildFrom). Its command is
// scripts/train/demomodel; docs/demo-model.md tells the whole recipe.
package train

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
)

// ErrCorpus reports a corpus that is not the text ParseKJV expects.
var ErrCorpus = errors.New("train: bad corpus")

// Chapter is one chapter of a book: its verses' texts, verse numbers
// dropped (Verses[i] is verse i+1).
type Chapter struct {
	Book   string // e.g. "Genesis", "1 Samuel", "Song of Solomon"
	Number int    // 1-based
	Verses []string
}

// Text returns the chapter as one line: its verses joined by single spaces.
func (c Chapter) Text() string { return strings.Join(c.Verses, " ") }

// KJVVerses is the number of verses of the King James Version (Genesis 1:1
// to Revelation 22:21): pass it to ParseKJV as wantVerses to check a whole
// Bible.
const KJVVerses = 31102

var (
	headingRE = regexp.MustCompile(`^([1-3] )?[A-Z][A-Za-z ]* ([0-9]+)$`)
	verseRE   = regexp.MustCompile(`^ +([0-9]+) (.+)$`)
)

// ParseKJV reads the text that `bible -l100000 gen1:1-rev22:21` (Debian's
// bible-kjv, reading bible-kjv-text's data) prints: for each chapter an
// empty line, a heading "<Book> <chapter>", an empty line, then one line
// per verse, "  <n> <text>" (indented, numbered from 1, not wrapped). It
// returns the chapters in order. Errors wrap ErrCorpus: an unexpected line,
// a verse number out of sequence, a chapter with no verse or a line over
// 64 KiB; and when wantVerses > 0, a total verse count other than it (use
// KJVVerses for the whole Bible).
func ParseKJV(r io.Reader, wantVerses int) ([]Chapter, error) {
	var chs []Chapter
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<16), 1<<16)
	verses := 0
	for line := 1; sc.Scan(); line++ {
		s := strings.TrimRight(sc.Text(), " \r")
		if s == "" {
			continue
		}
		if m := headingRE.FindStringSubmatch(s); m != nil {
			n, _ := strconv.Atoi(m[2])
			book := strings.TrimSuffix(s, " "+m[2])
			if len(chs) > 0 && len(chs[len(chs)-1].Verses) == 0 {
				return nil, fmt.Errorf("%w: line %d: %s %d has no verse", ErrCorpus, line, chs[len(chs)-1].Book,
					chs[len(chs)-1].Number)
			}
			chs = append(chs, Chapter{Book: book, Number: n})
			continue
		}
		m := verseRE.FindStringSubmatch(s)
		if m == nil {
			return nil, fmt.Errorf("%w: line %d: %.60q is neither a heading nor a verse", ErrCorpus, line, s)
		}
		if len(chs) == 0 {
			return nil, fmt.Errorf("%w: line %d: a verse before the first heading", ErrCorpus, line)
		}
		c := &chs[len(chs)-1]
		n, _ := strconv.Atoi(m[1])
		if n != len(c.Verses)+1 {
			return nil, fmt.Errorf("%w: line %d: %s %d:%d follows verse %d", ErrCorpus, line, c.Book, c.Number, n,
				len(c.Verses))
		}
		c.Verses = append(c.Verses, strings.TrimSpace(m[2]))
		verses++
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorpus, err)
	}
	if len(chs) == 0 || len(chs[len(chs)-1].Verses) == 0 {
		return nil, fmt.Errorf("%w: no chapter, or the last one has no verse", ErrCorpus)
	}
	if wantVerses > 0 && verses != wantVerses {
		return nil, fmt.Errorf("%w: %d verses, want %d", ErrCorpus, verses, wantVerses)
	}
	return chs, nil
}

// HeldOutBook is the book left out of the training text: the demo model's
// tests measure it on text it never saw.
const HeldOutBook = "Ruth"

// Split returns the training text, every chapter but heldOut's, and the
// held-out text, heldOut's chapters: each chapter one line (Chapter.Text)
// ending in "\n". Errors wrap ErrCorpus when no chapter is heldOut's or
// every one is.
func Split(chs []Chapter, heldOut string) (trainText, heldOutText string, err error) {
	var tr, ho strings.Builder
	for _, c := range chs {
		b := &tr
		if c.Book == heldOut {
			b = &ho
		}
		b.WriteString(c.Text())
		b.WriteByte('\n')
	}
	if ho.Len() == 0 || tr.Len() == 0 {
		return "", "", fmt.Errorf("%w: book %q holds none or all of the %d chapters", ErrCorpus, heldOut, len(chs))
	}
	return tr.String(), ho.String(), nil
}
