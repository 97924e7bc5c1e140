package grammar_test

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/glmctl/glmctl/pkg/grammar"
	"github.com/glmctl/glmctl/pkg/tokenizer"
)

// Qwen3's real tokenizer (151,669 tokens; config vocab_size 151,936),
// standing in for GLM-4.7's (151,552) as a large vocabulary.
const qwenVocabSize = 151936

var qwenEOS = []int{151643, 151645} // <|endoftext|>, <|im_end|>

var (
	qwenOnce  sync.Once
	qwenVocab *grammar.Vocab
	qwenTok   *tokenizer.HF
	qwenErr   error
	qwenLoad  time.Duration
)

func qwen(b *testing.B) (*grammar.Vocab, *tokenizer.HF) {
	b.Helper()
	qwenOnce.Do(func() {
		var data []byte
		if data, qwenErr = gunzip(filepath.Join(testdata, "tokenizers", "qwen3", "tokenizer.json.gz")); qwenErr != nil {
			return
		}
		start := time.Now()
		if qwenVocab, qwenErr = grammar.NewVocab(data, qwenVocabSize, qwenEOS); qwenErr != nil {
			return
		}
		qwenLoad = time.Since(start)
		qwenTok, qwenErr = tokenizer.LoadBytes("qwen3", data)
	})
	if qwenErr != nil {
		b.Fatal(qwenErr)
	}
	return qwenVocab, qwenTok
}

func gunzip(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	return io.ReadAll(zr)
}

// A schema and a document it accepts; the benchmarks follow the document's
// canonical tokenization.
const (
	benchSchema = `{"type":"object","properties":{
		"name":{"type":"string","maxLength":40},
		"age":{"type":"integer","minimum":0,"maximum":150},
		"email":{"type":"string","pattern":"^[a-z.]+@[a-z]+\\.[a-z]{2,3}$"},
		"tags":{"type":"array","items":{"type":"string","enum":["math","poetry","engines","music"]},"maxItems":4},
		"address":{"type":"object","properties":{"city":{"type":"string"},"zip":{"type":"string"}},"required":["city"],"additionalProperties":false},
		"bio":{"type":"string"}},
		"required":["name","age","email","tags","address","bio"],"additionalProperties":false}`
	benchDoc = `{"name":"Ada Lovelace","age":36,"email":"ada.lovelace@example.org","tags":["math","poetry","engines"],` +
		`"address":{"city":"London","zip":"W1"},"bio":"English mathematician and writer, chiefly known for her work on ` +
		`Charles Babbage's proposed mechanical general-purpose computer, the Analytical Engine. She was the first to ` +
		`recognise that the machine had applications beyond pure calculation."}`
)

// BenchmarkFillMask: one op is one token: FillMask, then Accept of the
// document's next token, a fresh matcher (NewMatcher) per document.
// Reported: mask-µs (FillMask alone), accept-µs (Accept alone), new-µs
// (NewMatcher, per document), mask-p99-µs (99th percentile of FillMask).
func BenchmarkFillMask(b *testing.B) {
	specs := []struct {
		name string
		spec grammar.Spec
	}{
		{"json_schema", grammar.Spec{Kind: grammar.JSONSchema, Text: benchSchema}},
		{"json_object", grammar.Spec{Kind: grammar.JSONObject}},
	}
	vocabs := []struct {
		name string
		load func(*testing.B) (*grammar.Vocab, tokenizer.Tokenizer)
	}{
		{"tiny", func(b *testing.B) (*grammar.Vocab, tokenizer.Tokenizer) { f := tiny(b); return f.v, f.tok }},
		{"qwen3-151k", func(b *testing.B) (*grammar.Vocab, tokenizer.Tokenizer) { v, t := qwen(b); return v, t }},
	}
	for _, vc := range vocabs {
		for _, sc := range specs {
			b.Run(vc.name+"/"+sc.name, func(b *testing.B) {
				v, tok := vc.load(b)
				ids, err := tok.Encode(benchDoc, false)
				if err != nil {
					b.Fatal(err)
				}
				g, err := v.Compile(sc.spec)
				if err != nil {
					b.Fatal(err)
				}
				benchPath(b, v, g, ids)
			})
		}
	}
}

func benchPath(b *testing.B, v *grammar.Vocab, g *grammar.Grammar, ids []int32) {
	mask := make([]uint32, v.MaskWords())
	var m *grammar.Matcher
	var tMask, tAccept, tNew time.Duration
	nNew, pos := 0, 0
	perToken := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if m == nil || pos == len(ids) {
			if m != nil {
				if !m.Done() {
					b.Fatal("document does not complete the grammar")
				}
				m.Close()
			}
			t0 := time.Now()
			var err error
			if m, err = g.NewMatcher(); err != nil {
				b.Fatal(err)
			}
			tNew += time.Since(t0)
			nNew++
			pos = 0
		}
		t0 := time.Now()
		if err := m.FillMask(mask); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := m.Accept(int(ids[pos])); err != nil {
			b.Fatalf("token %d of the document: %v", pos, err)
		}
		tAccept += time.Since(t1)
		tMask += t1.Sub(t0)
		perToken = append(perToken, t1.Sub(t0))
		pos++
	}
	b.StopTimer()
	m.Close()
	b.ReportMetric(float64(tMask.Microseconds())/float64(b.N), "mask-µs")
	slices.Sort(perToken)
	b.ReportMetric(float64(perToken[len(perToken)*99/100].Microseconds()), "mask-p99-µs")
	b.ReportMetric(float64(tAccept.Microseconds())/float64(b.N), "accept-µs")
	b.ReportMetric(float64(tNew.Microseconds())/float64(nNew), "new-µs")
	b.ReportMetric(float64(len(ids)), "doc-tokens")
}

// BenchmarkCompile: compiling a new schema (cache miss) for the large
// vocabulary, first mask included.
func BenchmarkCompile(b *testing.B) {
	v, _ := qwen(b)
	b.ReportMetric(float64(qwenLoad.Milliseconds()), "vocab-load-ms")
	for i := 0; i < b.N; i++ {
		spec := grammar.Spec{Kind: grammar.JSONSchema, Text: fmt.Sprintf(`{"description":"%d",%s`, i, benchSchema[1:])}
		if _, err := v.Compile(spec); err != nil {
			b.Fatal(err)
		}
	}
}
