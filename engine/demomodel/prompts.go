package demomodel

// DefaultPrompt is the prompt of `backbone demo` and `backbone generate`
// when none is given: the start of a sentence in the style of the demo
// model's corpus.
const DefaultPrompt = "And the king said unto"

// Prompts are the demo model's reference prompts: DefaultPrompt and two
// others. Its tests check the greedy continuations of these (readable
// English, and the same tokens from engine/model, the training script's
// PyTorch forward and llama.cpp; testdata/README.md).
var Prompts = []string{DefaultPrompt, "Now it came to pass", "And the LORD spake unto Moses, saying,"}
