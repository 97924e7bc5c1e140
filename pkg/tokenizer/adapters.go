package tokenizer

// The adapters below give a Tokenizer the shapes its consumers declare:
// the engine's Detokenizer (pkg/engine) and the server's Tokenizer and
// SpecialDecoder (pkg/server). Those interfaces are met structurally, so this
// package imports neither the engine nor the server.

// Detokenizer adapts a Tokenizer to engine.Detokenizer: generated text is
// shown without special tokens, unless KeepSpecial (chat output keeps
// </think>, <tool_call>, ... for the chat parser).
type Detokenizer struct {
	Tok         Tokenizer
	KeepSpecial bool
}

// Decode implements engine.Detokenizer.
func (d Detokenizer) Decode(ids []int32) (string, error) { return d.Tok.Decode(ids, !d.KeepSpecial) }

// ServerTokenizer adapts a Tokenizer to server.Tokenizer (and
// server.SpecialDecoder): prompts are encoded without adding special tokens
// (rendered chat prompts carry their own markers), generated text is decoded
// without them.
type ServerTokenizer struct{ Tok Tokenizer }

// Encode implements server.Tokenizer.
func (t ServerTokenizer) Encode(text string) ([]int32, error) { return t.Tok.Encode(text, false) }

// Decode implements server.Tokenizer: special tokens are dropped.
func (t ServerTokenizer) Decode(ids []int32) (string, error) { return t.Tok.Decode(ids, true) }

// DecodeWithSpecial keeps special tokens, for /detokenize (server.SpecialDecoder).
func (t ServerTokenizer) DecodeWithSpecial(ids []int32) (string, error) {
	return t.Tok.Decode(ids, false)
}

// TokenText implements server.Tokenizer: one token as text, special tokens
// included; "" when it cannot be decoded.
func (t ServerTokenizer) TokenText(id int32) string {
	s, err := t.Tok.Decode([]int32{id}, false)
	if err != nil {
		return ""
	}
	return s
}
