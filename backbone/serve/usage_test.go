package serve

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// TestStreamUsageNull parses every SSE chunk of both endpoints as JSON:
// with stream_options.include_usage each content chunk (the chat role
// chunk and the finish_reason chunk included) has the key "usage" with
// the value null, and the last chunk before [DONE] has empty choices and
// a usage object with the request's counts, as OpenAI sends them; without
// include_usage no chunk has the key.
func TestStreamUsageNull(t *testing.T) {
	srv := newTestServer(t, nil)
	const n = 6
	for _, c := range []struct{ path, input string }{
		{"/v1/completions", `"prompt":"The swarm streams"`},
		{"/v1/chat/completions", `"messages":[{"role":"user","content":"The swarm streams"}]`},
	} {
		for _, include := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/include_usage=%v", c.path, include), func(t *testing.T) {
				body := fmt.Sprintf(`{%s,"max_tokens":%d,"temperature":0,"stream":true,"stream_options":{"include_usage":%v}}`, c.input, n, include)
				resp, raw := srv.post(t, c.path, body)
				if resp.StatusCode != 200 {
					t.Fatalf("status %d: %s", resp.StatusCode, raw)
				}
				events, err := sseEvents(strings.NewReader(string(raw)))
				if err != nil {
					t.Fatal(err)
				}
				if len(events) < 3 || events[len(events)-1] != "[DONE]" {
					t.Fatalf("events %q", events)
				}
				chunks := events[:len(events)-1]
				content := chunks
				if include {
					content = chunks[:len(chunks)-1]
					var last struct {
						Choices []json.RawMessage `json:"choices"`
						Usage   *usage            `json:"usage"`
					}
					if err := json.Unmarshal([]byte(chunks[len(chunks)-1]), &last); err != nil {
						t.Fatal(err)
					}
					if last.Choices == nil || len(last.Choices) != 0 || last.Usage == nil ||
						last.Usage.CompletionTokens < 1 || last.Usage.CompletionTokens > n || last.Usage.PromptTokens < 1 ||
						last.Usage.TotalTokens != last.Usage.PromptTokens+last.Usage.CompletionTokens {
						t.Errorf("usage chunk %s", chunks[len(chunks)-1])
					}
				}
				finished := false
				for i, e := range content {
					var m map[string]json.RawMessage
					if err := json.Unmarshal([]byte(e), &m); err != nil {
						t.Fatalf("chunk %d %s: %v", i, e, err)
					}
					u, ok := m["usage"]
					switch {
					case include && (!ok || string(u) != "null"):
						t.Errorf("chunk %d %s: want \"usage\": null", i, e)
					case !include && ok:
						t.Errorf("chunk %d %s: a usage key without include_usage", i, e)
					}
					var ch []struct {
						Finish *string `json:"finish_reason"`
					}
					if err := json.Unmarshal(m["choices"], &ch); err != nil || len(ch) != 1 {
						t.Errorf("chunk %d %s: want one choice (%v)", i, e, err)
						continue
					}
					if ch[0].Finish != nil {
						finished = i == len(content)-1
					}
				}
				if !finished {
					t.Error("the last content chunk has no finish_reason")
				}
			})
		}
	}
}
