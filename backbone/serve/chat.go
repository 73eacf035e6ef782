package serve

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kvasir-ai/kvasir/engine/tokenizer"
)

// ErrChatTemplate reports a chat template this server cannot apply: a
// tokenizer.chat_template that is not ChatML, or no template and no ChatML
// special tokens in the vocabulary.
var ErrChatTemplate = errors.New("serve: unsupported chat template")

// Message is one chat message: Role is "system", "user", "assistant" (or
// any role name the template accepts), Content its text.
type Message struct {
	Role    string
	Content string
}

// ChatTemplate turns chat messages into prompt tokens.
type ChatTemplate interface {
	// Name identifies the template ("chatml").
	Name() string
	// Apply returns the prompt tokens for msgs followed by the opening of
	// the assistant's turn: at least one token per message and one for
	// the opening (the server refuses more messages than the context
	// holds before applying the template). Errors wrap ErrChatTemplate.
	Apply(msgs []Message) ([]int32, error)
}

// chatML is the ChatML form of Qwen's templates:
//
//	<|im_start|>{role}\n{content}<|im_end|>\n ... <|im_start|>assistant\n
//
// The markers are the control tokens <|im_start|> and <|im_end|>; every
// other piece is encoded as plain text (special-token text inside a message
// stays text, so a user cannot forge a turn). Because the GPT-2 style
// pre-tokenizer never merges across the markers, the tokens equal those of
// the rendered string tokenized with special-token parsing (llama.cpp's
// common_chat_templates_apply followed by tokenize with parse_special), for
// content without special-token text.
type chatML struct {
	tok        *tokenizer.Tokenizer
	start, end int32
	bos        []int32 // BOS when the tokenizer adds one
}

func (c *chatML) Name() string { return "chatml" }

func (c *chatML) Apply(msgs []Message) ([]int32, error) {
	if len(msgs) == 0 {
		return nil, fmt.Errorf("%w: no messages", ErrChatTemplate)
	}
	out := append([]int32(nil), c.bos...)
	for _, m := range msgs {
		if m.Role == "" || strings.ContainsAny(m.Role, "\n") {
			return nil, fmt.Errorf("%w: role %q", ErrChatTemplate, m.Role)
		}
		out = append(out, c.start)
		out = append(out, c.tok.Encode(m.Role+"\n"+m.Content, false)...)
		out = append(out, c.end)
		out = append(out, c.tok.Encode("\n", false)...)
	}
	out = append(out, c.start)
	out = append(out, c.tok.Encode("assistant\n", false)...)
	return out, nil
}

// ChatTemplateFor chooses the chat template for a model from its
// tokenizer.chat_template text (the Jinja source; "" when the GGUF has none)
// and its vocabulary. force is "" or "auto" to recognise the template,
// "chatml" to use ChatML whatever the text says, "none" to disable chat.
//
// Recognised: any template that uses the <|im_start|> / <|im_end|> markers
// (Qwen, ChatML) becomes ChatML; with no template text, ChatML is used when
// the vocabulary has both markers as tokens (as llama.cpp falls back to
// chatml). Errors wrap ErrChatTemplate: another template (e.g. Llama 3's
// <|start_header_id|>), or ChatML without the marker tokens.
func ChatTemplateFor(tok *tokenizer.Tokenizer, template, force string) (ChatTemplate, error) {
	switch force {
	case "", "auto":
		if template != "" && !(strings.Contains(template, "<|im_start|>") && strings.Contains(template, "<|im_end|>")) {
			return nil, fmt.Errorf("%w: the model's tokenizer.chat_template is not ChatML (only the ChatML form "+
				"<|im_start|>role\\ncontent<|im_end|> is implemented; start with --chat-template chatml to force it)", ErrChatTemplate)
		}
	case "chatml":
	case "none":
		return nil, fmt.Errorf("%w: chat disabled", ErrChatTemplate)
	default:
		return nil, fmt.Errorf("%w: unknown template name %q (auto, chatml, none)", ErrChatTemplate, force)
	}
	start, ok1 := tok.TokenID("<|im_start|>")
	end, ok2 := tok.TokenID("<|im_end|>")
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("%w: ChatML needs <|im_start|> and <|im_end|> tokens, which the vocabulary lacks", ErrChatTemplate)
	}
	c := &chatML{tok: tok, start: start, end: end}
	if b := tok.Tokenize("", true, false); len(b) > 0 && b[0] == tok.BOS() {
		c.bos = b[:1]
	}
	return c, nil
}
