package tokenizer

import (
	"fmt"
	"unicode/utf8"
)

// buildPieces renders every token once, as llama.cpp's token_to_piece does
// for a BPE vocabulary (llama_vocab::impl::token_to_piece, llama_decode_text):
// normal tokens map their GPT-2 alphabet characters back to bytes; control,
// user-defined and unknown tokens are their text verbatim; other types
// (undefined, unused, byte) render as nothing.
func (t *Tokenizer) buildPieces() {
	t.pieceOff = make([]uint32, len(t.tokens)+1)
	for i, s := range t.tokens {
		switch t.types[i] {
		case TypeNormal:
			t.pieceData = appendDecodedText(t.pieceData, s)
		case TypeControl, TypeUserDefined, TypeUnknown:
			t.pieceData = append(t.pieceData, s...)
		}
		t.pieceOff[i+1] = uint32(len(t.pieceData))
	}
}

// appendDecodedText maps each character of a normal token's text back to
// its byte. A character outside the alphabet becomes
// "[UNK_BYTE_0x<hex of its UTF-8>" + text + "]", as in llama_decode_text.
func appendDecodedText(dst []byte, text string) []byte {
	for i := 0; i < len(text); {
		r, size, ok := decodeRune(text, i)
		i += size
		if !ok || r > utf8.MaxRune {
			r = utf8.RuneError
		}
		if b, ok := runeToByte[r]; ok {
			dst = append(dst, b)
			continue
		}
		dst = append(dst, "[UNK_BYTE_0x"...)
		for _, c := range appendRune(nil, r) {
			dst = fmt.Appendf(dst, "%02x", c)
		}
		dst = append(dst, text...)
		dst = append(dst, ']')
	}
	return dst
}

// AppendPiece appends the bytes of token id to dst (llama_token_to_piece
// with lstrip 0): a normal token's bytes (possibly part of a UTF-8
// sequence), a user-defined token's text, and a control token's text only
// when special is true. An id outside [0, VocabSize()) appends nothing.
func (t *Tokenizer) AppendPiece(dst []byte, id int32, special bool) []byte {
	if !t.valid(id) || (!special && t.types[id] == TypeControl) {
		return dst
	}
	return append(dst, t.pieceData[t.pieceOff[id]:t.pieceOff[id+1]]...)
}

// Piece returns a copy of the bytes of token id, control tokens rendering as
// nothing (llama_token_to_piece with special=false). See AppendPiece.
func (t *Tokenizer) Piece(id int32) []byte { return t.AppendPiece(nil, id, false) }

// Decode concatenates the pieces of ids, control tokens rendering as
// nothing: Detokenize(ids, false, false). The result is raw bytes and may
// be invalid UTF-8 (use ToValidUTF8 or a Decoder for display).
func (t *Tokenizer) Decode(ids []int32) string { return t.Detokenize(ids, false, false) }

// Detokenize is llama_detokenize: with removeSpecial, a leading BOS and a
// trailing EOS are dropped when Config.AddBOS / AddEOS are set; with
// unparseSpecial, control tokens render as their text. For the "gpt-2"
// pre-tokenizer, llama.cpp's clean-up of tokenization spaces is applied
// (" ?" " !" " ." " ," lose the space, " ' " becomes "'", " 's" " 'm" " 're"
// " 've" lose the space); "qwen2" and "qwen35" leave the text alone. Ids
// outside the vocabulary render as nothing.
func (t *Tokenizer) Detokenize(ids []int32, removeSpecial, unparseSpecial bool) string {
	if removeSpecial && t.addBOS && len(ids) > 0 && ids[0] == t.bos {
		ids = ids[1:]
	}
	if removeSpecial && t.addEOS && len(ids) > 0 && ids[len(ids)-1] == t.eos {
		ids = ids[:len(ids)-1]
	}
	var b []byte
	for _, id := range ids {
		b = t.AppendPiece(b, id, unparseSpecial)
	}
	if t.cleanSpaces {
		b = cleanSpaces(b)
	}
	return string(b)
}

// cleanSpaces applies the three passes of llama_vocab::impl::detokenize's
// clean_spaces block, in place.
func cleanSpaces(in []byte) []byte {
	// Pass 1: " ?", " !", " .", " ," lose the space.
	out := in[:0:0]
	for i, x := range in {
		if i > 0 && in[i-1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',') {
			out = out[:len(out)-1]
		}
		out = append(out, x)
	}
	// Pass 2: " ' " becomes "'" (the next space is consumed; llama.cpp
	// overwrites it with NUL, which then counts as the previous byte).
	in = out
	out = nil
	for i := 0; i < len(in); i++ {
		x := in[i]
		if i > 0 && x == '\'' && i+1 < len(in) && in[i-1] == ' ' && in[i+1] == ' ' {
			out = out[:len(out)-1]
			in[i+1] = 0
			out = append(out, x)
			i++
			continue
		}
		out = append(out, x)
	}
	// Pass 3: " 's", " 'm", " 're", " 've" lose the space.
	in = out
	out = nil
	for i, x := range in {
		if i > 0 && in[i-1] == ' ' && x == '\'' && i+1 < len(in) {
			x1 := in[i+1]
			switch {
			case x1 == 's' || x1 == 'm':
				out = out[:len(out)-1]
			case x1 == 't' || x1 == 'd':
			case i+2 < len(in) && ((x1 == 'r' && in[i+2] == 'e') || (x1 == 'v' && in[i+2] == 'e')):
				out = out[:len(out)-1]
			}
		}
		out = append(out, x)
	}
	return out
}

// Decoder turns a stream of token ids into text that is always valid UTF-8:
// bytes of a character split across tokens are held until the character is
// complete. Invalid bytes become U+FFFD, one per maximal ill-formed
// subsequence (Unicode 15.0 §3.9, "U+FFFD Substitution of Maximal Subparts",
// the convention of Python's bytes.decode(errors="replace") used for the
// fixtures' gen_text). No space clean-up is applied. Not safe for
// concurrent use.
type Decoder struct {
	t       *Tokenizer
	special bool
	pending []byte
}

// NewDecoder returns a streaming decoder; special selects whether control
// tokens render as their text.
func (t *Tokenizer) NewDecoder(special bool) *Decoder { return &Decoder{t: t, special: special} }

// Add appends the piece of id and returns the text completed so far (valid
// UTF-8, possibly empty). An incomplete trailing sequence (at most 3 bytes)
// is held for the next call.
func (d *Decoder) Add(id int32) string {
	d.pending = d.t.AppendPiece(d.pending, id, d.special)
	out, rest := validPrefix(d.pending, false)
	d.pending = append(d.pending[:0], rest...)
	return out
}

// Flush returns the held bytes, an incomplete sequence becoming U+FFFD, and
// resets the decoder.
func (d *Decoder) Flush() string {
	out, _ := validPrefix(d.pending, true)
	d.pending = d.pending[:0]
	return out
}

// ToValidUTF8 returns b with each maximal ill-formed subsequence replaced by
// U+FFFD (see Decoder).
func ToValidUTF8(b []byte) string {
	out, _ := validPrefix(b, true)
	return out
}

// validPrefix converts b to valid UTF-8. Unless final, an incomplete but so
// far well-formed sequence at the end is returned as rest instead.
func validPrefix(b []byte, final bool) (string, []byte) {
	if utf8.Valid(b) {
		return string(b), nil
	}
	out := make([]byte, 0, len(b)+8)
	for i := 0; i < len(b); {
		c := b[i]
		if c < 0x80 {
			out = append(out, c)
			i++
			continue
		}
		// Well-formed sequences (Unicode Table 3-7): the allowed range of
		// the second byte depends on the lead; later bytes are 80..BF.
		need, lo, hi := 0, byte(0x80), byte(0xBF)
		switch {
		case c >= 0xC2 && c <= 0xDF:
			need = 1
		case c == 0xE0:
			need, lo = 2, 0xA0
		case c >= 0xE1 && c <= 0xEC, c == 0xEE, c == 0xEF:
			need = 2
		case c == 0xED:
			need, hi = 2, 0x9F
		case c == 0xF0:
			need, lo = 3, 0x90
		case c >= 0xF1 && c <= 0xF3:
			need = 3
		case c == 0xF4:
			need, hi = 3, 0x8F
		default: // 80..C1, F5..FF: never part of a well-formed sequence
			out = utf8.AppendRune(out, utf8.RuneError)
			i++
			continue
		}
		j := i + 1
		for k := 0; k < need; k++ {
			if j >= len(b) {
				if !final {
					return string(out), b[i:]
				}
				break
			}
			l, h := byte(0x80), byte(0xBF)
			if k == 0 {
				l, h = lo, hi
			}
			if b[j] < l || b[j] > h {
				break
			}
			j++
		}
		if j-i == need+1 {
			out = append(out, b[i:j]...)
		} else {
			out = utf8.AppendRune(out, utf8.RuneError)
		}
		i = j
	}
	return string(out), nil
}
