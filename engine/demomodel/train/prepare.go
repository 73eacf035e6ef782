package train

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kvasir-ai/kvasir/engine/tokenizer"
)

// Files of a training folder: Prepare writes the first four, the training
// script the weights and hyperparameters, Export reads them all.
const (
	FileTokenizer   = "tokenizer.json" // tokenizer.Config as JSON
	FileTrainIDs    = "train.u16"      // the training text's token ids, uint16 little-endian
	FileHeldOutIDs  = "heldout.u16"    // the held-out text's token ids, uint16 little-endian
	FileHeldOutText = "heldout.txt"    // the held-out text itself
	FileHParams     = "hparams.json"   // HParams, written by the training script
	FileWeights     = "weights.bin"    // float32 little-endian tensors, written by the training script
	FileIndex       = "weights.json"   // name -> Entry, written by the training script
)

// Stats describes what Prepare wrote.
type Stats struct {
	Vocab        int // tokens in the vocabulary, specials included
	TrainBytes   int // bytes of the training text
	TrainTokens  int // its tokens
	HeldOutBytes int // bytes of the held-out text
	HeldOutToks  int // its tokens
}

// Vocab trains the demo model's vocabulary on text: tokenizer.Train with
// tokenizer.DefaultSpecials (ids 0..255 the bytes, then the merges, then
// <|endoftext|>, <|im_start|>, <|im_end|>), size tokens in all.
func Vocab(text string, size int) tokenizer.Config {
	return tokenizer.Train(text, size, tokenizer.DefaultSpecials)
}

// Prepare trains a vocabulary of vocab tokens on trainText (Vocab), encodes
// trainText and heldOutText with it (no special token added or parsed) and
// writes dir's FileTokenizer, FileTrainIDs, FileHeldOutIDs and
// FileHeldOutText (dir is created). Errors: vocab outside 256+3..65536
// (ids must fit uint16), the tokenizer's (tokenizer.New) and the file
// system's.
func Prepare(trainText, heldOutText string, vocab int, dir string) (Stats, error) {
	if vocab < 256+len(tokenizer.DefaultSpecials) || vocab > 1<<16 {
		return Stats{}, fmt.Errorf("train: vocabulary of %d tokens: want %d..%d", vocab,
			256+len(tokenizer.DefaultSpecials), 1<<16)
	}
	c := Vocab(trainText, vocab)
	tok, err := tokenizer.New(c)
	if err != nil {
		return Stats{}, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Stats{}, err
	}
	js, err := json.MarshalIndent(c, "", " ")
	if err != nil {
		return Stats{}, err
	}
	if err := os.WriteFile(filepath.Join(dir, FileTokenizer), js, 0o644); err != nil {
		return Stats{}, err
	}
	st := Stats{Vocab: tok.VocabSize(), TrainBytes: len(trainText), HeldOutBytes: len(heldOutText)}
	for _, f := range []struct {
		name, text string
		n          *int
	}{{FileTrainIDs, trainText, &st.TrainTokens}, {FileHeldOutIDs, heldOutText, &st.HeldOutToks}} {
		ids := tok.Encode(f.text, false)
		*f.n = len(ids)
		b := make([]byte, 2*len(ids))
		for i, id := range ids {
			binary.LittleEndian.PutUint16(b[2*i:], uint16(id))
		}
		if err := os.WriteFile(filepath.Join(dir, f.name), b, 0o644); err != nil {
			return Stats{}, err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, FileHeldOutText), []byte(heldOutText), 0o644); err != nil {
		return Stats{}, err
	}
	return st, nil
}

// ReadTokenizer reads dir's FileTokenizer. Errors: the file system's and
// encoding/json's.
func ReadTokenizer(dir string) (tokenizer.Config, error) {
	var c tokenizer.Config
	b, err := os.ReadFile(filepath.Join(dir, FileTokenizer))
	if err != nil {
		return c, err
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("train: %s: %w", FileTokenizer, err)
	}
	return c, nil
}
