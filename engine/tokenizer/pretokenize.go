package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// byteToRune is GPT-2's byte alphabet: printable Latin-1 bytes ('!'..'~',
// '¡'..'¬', '®'..'ÿ') stand for themselves, the other 68 bytes map in order
// to U+0100.. (OpenAI GPT-2 encoder.py bytes_to_unicode; llama.cpp
// unicode.cpp unicode_byte_to_utf8_map). runeToByte is its inverse.
var (
	byteToRune [256]rune
	runeToByte = map[rune]byte{}
)

func init() {
	n := rune(0)
	for b := range 256 {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			byteToRune[b] = rune(b)
		} else {
			byteToRune[b] = 256 + n
			n++
		}
		runeToByte[byteToRune[b]] = byte(b)
	}
}

// decodeRune decodes one code point at s[i:] exactly as llama.cpp's
// unicode_cpt_from_utf8 does: it checks lead and continuation bits and the
// length but not overlong forms or surrogates, and reaches up to 0x1FFFFF.
// ok is false for an invalid sequence (the caller substitutes U+FFFD for one
// byte, as unicode_cpts_from_utf8 does).
func decodeRune(s string, i int) (r rune, size int, ok bool) {
	c := s[i]
	switch {
	case c < 0x80:
		return rune(c), 1, true
	case c < 0xC0:
		return 0, 1, false
	case c < 0xE0:
		if i+1 >= len(s) || s[i+1]&0xC0 != 0x80 {
			return 0, 1, false
		}
		return rune(c&0x1F)<<6 | rune(s[i+1]&0x3F), 2, true
	case c < 0xF0:
		if i+2 >= len(s) || s[i+1]&0xC0 != 0x80 || s[i+2]&0xC0 != 0x80 {
			return 0, 1, false
		}
		return rune(c&0x0F)<<12 | rune(s[i+1]&0x3F)<<6 | rune(s[i+2]&0x3F), 3, true
	case c < 0xF8:
		if i+3 >= len(s) || s[i+1]&0xC0 != 0x80 || s[i+2]&0xC0 != 0x80 || s[i+3]&0xC0 != 0x80 {
			return 0, 1, false
		}
		return rune(c&0x07)<<18 | rune(s[i+1]&0x3F)<<12 | rune(s[i+2]&0x3F)<<6 | rune(s[i+3]&0x3F), 4, true
	}
	return 0, 1, false
}

// appendRune appends the shortest encoding of r as llama.cpp's
// unicode_cpt_to_utf8 writes it: surrogates are written as 3 bytes (Go's
// utf8.AppendRune would write U+FFFD). r must be <= 0x10FFFF.
func appendRune(b []byte, r rune) []byte {
	switch {
	case r < 0x80:
		return append(b, byte(r))
	case r < 0x800:
		return append(b, 0xC0|byte(r>>6), 0x80|byte(r)&0x3F)
	case r < 0x10000:
		return append(b, 0xE0|byte(r>>12), 0x80|byte(r>>6)&0x3F, 0x80|byte(r)&0x3F)
	}
	return append(b, 0xF0|byte(r>>18), 0x80|byte(r>>12)&0x3F, 0x80|byte(r>>6)&0x3F, 0x80|byte(r)&0x3F)
}

// normalizeUTF8 returns s as llama.cpp sees it after decoding to code points
// and encoding back: each invalid byte becomes U+FFFD, overlong forms are
// shortened. Code points above U+10FFFF (where llama.cpp throws) become
// U+FFFD. Valid UTF-8 is returned unchanged without copying.
func normalizeUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	out := make([]byte, 0, len(s)+8)
	for i := 0; i < len(s); {
		r, size, ok := decodeRune(s, i)
		if !ok || r > unicode.MaxRune {
			r = utf8.RuneError
		}
		out = appendRune(out, r)
		i += size
	}
	return string(out)
}

// Character classes of the pre-tokenizer regexes: \p{L}, \p{N}, \s, \p{M}
// (combining marks: Mn, Mc, Me; llama.cpp's is_accent_mark), or none of them
// ("other", matched by [^\s\p{L}\p{N}], or by [^\s\p{L}\p{M}\p{N}] in
// qwen35). Whitespace is Unicode White_Space, as in llama.cpp's
// unicode_set_whitespace. Only qwen35 tells marks apart: split files them
// under clsOther for the other pre-tokenizers (see preKind.classOf).
const (
	clsOther  uint8 = 0
	clsLetter uint8 = 1
	clsNumber uint8 = 2
	clsSpace  uint8 = 3
	clsMark   uint8 = 4
)

var asciiClass [128]uint8

func init() {
	for c := range 128 {
		r := rune(c)
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z':
			asciiClass[c] = clsLetter
		case r >= '0' && r <= '9':
			asciiClass[c] = clsNumber
		case r == ' ', r >= '\t' && r <= '\r':
			asciiClass[c] = clsSpace
		}
	}
}

func classOf(r rune) uint8 {
	if r < 0x80 {
		return asciiClass[r]
	}
	switch {
	case unicode.IsLetter(r):
		return clsLetter
	case unicode.IsNumber(r):
		return clsNumber
	case unicode.IsSpace(r):
		return clsSpace
	case unicode.IsMark(r):
		return clsMark
	}
	return clsOther
}

// classOf is the class of r as pre-tokenizer p sees it: \p{M} is a class of
// its own only in the qwen35 regex.
func (p preKind) classOf(r rune) uint8 {
	k := classOf(r)
	if k == clsMark && p != preQwen35 {
		return clsOther
	}
	return k
}

// preKind selects the pre-tokenizer regex.
type preKind uint8

const (
	// preGPT2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
	// (llama.cpp unicode_regex_split_custom_gpt2).
	preGPT2 preKind = iota
	// preQwen2: (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|
	// [^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
	// (LLAMA_VOCAB_PRE_TYPE_QWEN2; the same matcher as llama.cpp's
	// unicode_regex_split_custom_llama3 with single digits).
	preQwen2
	// preQwen35: (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|
	// [^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
	// (LLAMA_VOCAB_PRE_TYPE_QWEN35, llama.cpp unicode_regex_split_custom_qwen35):
	// qwen2 with combining marks in the letter runs and out of the
	// punctuation runs. Matched by the qwen2 code with marks as clsMark.
	preQwen35
)

// wordBuf holds the decoded code points of a fragment, reused across calls.
type wordBuf struct {
	cps []rune
	cls []uint8
	off []int // byte offset of each code point, plus len(text)
}

// split cuts text (normalized by normalizeUTF8) into pre-tokens and calls
// emit for each, in order; the pre-tokens concatenate to text. The regex is
// matched by hand, alternative by alternative, with the leftmost-first
// semantics of a backtracking engine (the (?!\S) lookahead included).
func (p preKind) split(text string, wb *wordBuf, emit func(word string)) {
	if text == "" {
		return
	}
	wb.cps, wb.cls, wb.off = wb.cps[:0], wb.cls[:0], wb.off[:0]
	for i := 0; i < len(text); {
		r, size, ok := decodeRune(text, i)
		if !ok {
			r = utf8.RuneError // unreachable after normalizeUTF8
		}
		wb.cps = append(wb.cps, r)
		wb.cls = append(wb.cls, p.classOf(r))
		wb.off = append(wb.off, i)
		i += size
	}
	wb.off = append(wb.off, len(text))
	cps, cls, off := wb.cps, wb.cls, wb.off
	n := len(cps)
	word := func(a, b int) { emit(text[off[a]:off[b]]) }
	isRN := func(r rune) bool { return r == '\r' || r == '\n' }
	isLM := func(k uint8) bool { return k == clsLetter || k == clsMark }

	for pos := 0; pos < n; {
		c := cps[pos]
		// Contractions: 's 't 'm 'd 're 've 'll (qwen2, qwen35: either case).
		if c == '\'' && pos+1 < n {
			nx := cps[pos+1]
			if p != preGPT2 {
				nx = asciiLower(nx)
			}
			if nx == 's' || nx == 't' || nx == 'm' || nx == 'd' {
				word(pos, pos+2)
				pos += 2
				continue
			}
			if pos+2 < n {
				nn := cps[pos+2]
				if p != preGPT2 {
					nn = asciiLower(nn)
				}
				if (nx == 'r' && nn == 'e') || (nx == 'v' && nn == 'e') || (nx == 'l' && nn == 'l') {
					word(pos, pos+3)
					pos += 3
					continue
				}
			}
		}
		if p == preGPT2 {
			// ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': the optional
			// space joins a run of one class.
			q := pos
			if c == ' ' {
				q = pos + 1
			}
			if q < n && cls[q] != clsSpace {
				k := cls[q]
				end := q + 1
				for end < n && cls[end] == k {
					end++
				}
				word(pos, end)
				pos = end
				continue
			}
		} else {
			// qwen2 '[^\r\n\p{L}\p{N}]?\p{L}+', qwen35
			// '[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+' (clsMark occurs only in
			// qwen35; a mark may also be the optional first character).
			if !isRN(c) && cls[pos] != clsNumber &&
				(isLM(cls[pos]) || (pos+1 < n && isLM(cls[pos+1]))) {
				end := pos + 1
				for end < n && isLM(cls[end]) {
					end++
				}
				word(pos, end)
				pos = end
				continue
			}
			// '\p{N}': one digit at a time.
			if cls[pos] == clsNumber {
				word(pos, pos+1)
				pos++
				continue
			}
			// qwen2 ' ?[^\s\p{L}\p{N}]+[\r\n]*', qwen35
			// ' ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*': a run of clsOther.
			q := pos
			if c == ' ' {
				q = pos + 1
			}
			if q < n && cls[q] == clsOther {
				end := q + 1
				for end < n && cls[end] == clsOther {
					end++
				}
				for end < n && isRN(cps[end]) {
					end++
				}
				word(pos, end)
				pos = end
				continue
			}
		}
		// Whitespace: the run starting here, and (qwen2, qwen35) its last \r
		// or \n.
		ws, lastRN := 0, -1
		for pos+ws < n && cls[pos+ws] == clsSpace {
			if isRN(cps[pos+ws]) {
				lastRN = pos + ws
			}
			ws++
		}
		switch {
		case p != preGPT2 && lastRN >= 0: // '\s*[\r\n]+'
			word(pos, lastRN+1)
			pos = lastRN + 1
		case ws > 1 && pos+ws < n: // '\s+(?!\S)': leave one space for the next word
			word(pos, pos+ws-1)
			pos += ws - 1
		case ws > 0: // '\s+'
			word(pos, pos+ws)
			pos += ws
		default: // no alternative matches (cannot happen with these classes)
			word(pos, pos+1)
			pos++
		}
	}
}

func asciiLower(r rune) rune {
	if r >= 'A' && r <= 'Z' {
		return r + ('a' - 'A')
	}
	return r
}
