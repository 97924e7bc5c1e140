package tokenizer_test

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/glmctl/glmctl/pkg/engine"
	"github.com/glmctl/glmctl/pkg/server"
	"github.com/glmctl/glmctl/pkg/tokenizer"
)

// The adapters meet the interfaces their consumers declare.
var (
	_ engine.Detokenizer    = tokenizer.Detokenizer{}
	_ server.Tokenizer      = tokenizer.ServerTokenizer{}
	_ server.SpecialDecoder = tokenizer.ServerTokenizer{}
)

func TestAdapters(t *testing.T) {
	b, err := tokenizer.Load(filepath.Join("..", "..", "testdata", "tokenizers", "tiny-glm"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const text = "<|user|>Hi</think>there"
	want, err := b.Encode(text, false)
	if err != nil {
		t.Fatal(err)
	}
	withSpecial, err := b.Decode(want, false)
	if err != nil {
		t.Fatal(err)
	}
	without, err := b.Decode(want, true)
	if err != nil {
		t.Fatal(err)
	}
	if withSpecial == without {
		t.Fatalf("test text %q has no special tokens to drop", text)
	}

	st := tokenizer.ServerTokenizer{Tok: b}
	ids, err := st.Encode(text)
	if err != nil || !slices.Equal(ids, want) {
		t.Errorf("ServerTokenizer.Encode = %v, %v; want %v (no special tokens added)", ids, err, want)
	}
	if s, err := st.Decode(ids); err != nil || s != without {
		t.Errorf("ServerTokenizer.Decode = %q, %v; want %q", s, err, without)
	}
	if s, err := st.DecodeWithSpecial(ids); err != nil || s != withSpecial {
		t.Errorf("ServerTokenizer.DecodeWithSpecial = %q, %v; want %q", s, err, withSpecial)
	}
	if s := st.TokenText(ids[0]); s != "<|user|>" {
		t.Errorf("ServerTokenizer.TokenText(%d) = %q, want <|user|>", ids[0], s)
	}
	if s := st.TokenText(-1); s != "" {
		t.Errorf("ServerTokenizer.TokenText(-1) = %q, want \"\"", s)
	}

	if s, err := (tokenizer.Detokenizer{Tok: b}).Decode(ids); err != nil || s != without {
		t.Errorf("Detokenizer.Decode = %q, %v; want %q", s, err, without)
	}
	if s, err := (tokenizer.Detokenizer{Tok: b, KeepSpecial: true}).Decode(ids); err != nil || s != withSpecial {
		t.Errorf("Detokenizer{KeepSpecial}.Decode = %q, %v; want %q", s, err, withSpecial)
	}
}
