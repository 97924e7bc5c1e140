package grammar_test

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/glmctl/glmctl/pkg/grammar"
	"github.com/glmctl/glmctl/pkg/tokenizer"
)

// The tiny GLM-style tokenizer of the tiny test models: 1000 BPE tokens,
// 36 added tokens from id 1000 (specials and GLM's tag tokens), and a model
// vocabulary of 1040 (4 padding ids). TestTinyFacts checks these against
// testdata.
const (
	testdata      = "../../testdata"
	tinyVocabSize = 1040
	tinyTokSize   = 1036
	firstAdded    = 1000
	tokNoThink    = 1031 // "/nothink": an added token that is plain text
)

var tinyEOS = []int{1000, 1007, 1009}

// Token ids of the tiny tokenizer's added tokens used below.
const (
	tokToolCall    = 1023 // <tool_call>
	tokToolCallEnd = 1024 // </tool_call>
	tokArgKey      = 1027 // <arg_key>
	tokArgKeyEnd   = 1028
	tokArgValue    = 1029 // <arg_value>
	tokArgValueEnd = 1030
)

type fixture struct {
	v     *grammar.Vocab
	tok   *tokenizer.HF
	texts []string // each token's text, special tokens included
}

var (
	tinyOnce sync.Once
	tinyFix  *fixture
	tinyErr  error
)

func tiny(t testing.TB) *fixture {
	t.Helper()
	tinyOnce.Do(func() {
		path := filepath.Join(testdata, "tokenizers", "tiny-glm", "tokenizer.json")
		f := &fixture{}
		if f.v, tinyErr = grammar.NewVocabFromTokenizerJSON(path, tinyVocabSize, tinyEOS); tinyErr != nil {
			return
		}
		if f.tok, tinyErr = tokenizer.LoadFile(path); tinyErr != nil {
			return
		}
		f.texts = make([]string, tinyTokSize)
		for id := range f.texts {
			if f.texts[id], tinyErr = f.tok.Decode([]int32{int32(id)}, false); tinyErr != nil {
				return
			}
		}
		tinyFix = f
	})
	if tinyErr != nil {
		t.Fatal(tinyErr)
	}
	return tinyFix
}

func (f *fixture) isEOS(id int) bool { return slices.Contains(f.v.EOS(), id) }

// decode returns the text of ids (EOS ids are never in them).
func (f *fixture) decode(t testing.TB, ids []int) string {
	t.Helper()
	ids32 := make([]int32, len(ids))
	for i, id := range ids {
		ids32[i] = int32(id)
	}
	s, err := f.tok.Decode(ids32, false)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// tokenID finds the ordinary token whose text is s.
func (f *fixture) tokenID(t testing.TB, s string) int {
	t.Helper()
	for id, text := range f.texts[:firstAdded] {
		if text == s {
			return id
		}
	}
	t.Fatalf("no token %q", s)
	return -1
}

func allowedIDs(mask []uint32, n int) []int {
	var ids []int
	for id := 0; id < n; id++ {
		if mask[id/32]>>(id%32)&1 != 0 {
			ids = append(ids, id)
		}
	}
	return ids
}

// checkMask checks the invariants of every mask: never a padding id; EOS
// ids all or none, and exactly when the grammar is complete; only EOS once
// Done; no added token unless the grammar may name them (Lark).
func checkMask(t *testing.T, f *fixture, m *grammar.Matcher, mask []uint32, specials bool) []int {
	t.Helper()
	allowed := allowedIDs(mask, f.v.VocabSize())
	if len(allowed) == 0 {
		t.Fatal("empty mask")
	}
	nEOS := 0
	for _, id := range allowed {
		switch {
		case id >= f.v.TokenizerSize():
			t.Fatalf("padding id %d allowed", id)
		case f.isEOS(id):
			nEOS++
		case id >= firstAdded && id != tokNoThink && !specials:
			t.Fatalf("special token %d %q allowed", id, f.texts[id])
		}
	}
	if nEOS != 0 && nEOS != len(f.v.EOS()) {
		t.Fatalf("%d of the %d EOS ids allowed", nEOS, len(f.v.EOS()))
	}
	if (nEOS > 0) != m.Accepting() {
		t.Fatalf("EOS allowed = %v, Accepting() = %v", nEOS > 0, m.Accepting())
	}
	if m.Done() && len(allowed) != nEOS {
		t.Fatalf("done, yet %d non-EOS tokens allowed", len(allowed)-nEOS)
	}
	return allowed
}

// policy picks the next token among the allowed ones.
type policy struct {
	rng  *rand.Rand
	bias []float64 // per-token logit bias (softmax over the allowed); nil: uniform
	// After finishAfter steps, steer towards the end, uniformly among: EOS
	// if allowed, else tokens that only close things (made of " } ]), else
	// tokens without whitespace.
	finishAfter int
	maxSteps    int
}

func newPolicy(seed uint64, biased bool) policy {
	p := policy{rng: rand.New(rand.NewPCG(seed, 7)), finishAfter: 60, maxSteps: 400}
	if biased {
		p.bias = make([]float64, tinyVocabSize)
		for i := range p.bias {
			p.bias[i] = 2.5 * p.rng.NormFloat64()
		}
	}
	return p
}

func (p policy) choose(f *fixture, allowed []int, step int) int {
	cands := allowed
	if step >= p.finishAfter {
		prefs := []func(id int) bool{
			f.isEOS,
			func(id int) bool {
				return id < firstAdded && strings.Trim(f.texts[id], `"}]`) == ""
			},
			func(id int) bool { return !strings.ContainsAny(f.texts[id], " \t\r\n") },
		}
		for _, pref := range prefs {
			var sub []int
			for _, id := range allowed {
				if pref(id) {
					sub = append(sub, id)
				}
			}
			if len(sub) > 0 {
				return sub[p.rng.IntN(len(sub))]
			}
		}
	}
	if p.bias == nil {
		return cands[p.rng.IntN(len(cands))]
	}
	hi := math.Inf(-1)
	for _, id := range cands {
		hi = max(hi, p.bias[id])
	}
	w := make([]float64, len(cands))
	sum := 0.0
	for i, id := range cands {
		w[i] = math.Exp(p.bias[id] - hi)
		sum += w[i]
	}
	r := p.rng.Float64() * sum
	for i := range w {
		if r -= w[i]; r <= 0 {
			return cands[i]
		}
	}
	return cands[len(cands)-1]
}

// generate samples one sequence under m, checking every mask; it returns
// the ids (without the final EOS) once EOS is sampled or the grammar is
// Done.
func generate(t *testing.T, f *fixture, m *grammar.Matcher, p policy, specials bool) []int {
	t.Helper()
	mask := make([]uint32, f.v.MaskWords())
	var ids []int
	for step := 0; step < p.maxSteps; step++ {
		if err := m.FillMask(mask); err != nil {
			t.Fatalf("after %q: %v", f.decode(t, ids), err)
		}
		allowed := checkMask(t, f, m, mask, specials)
		if m.Done() {
			return ids
		}
		id := p.choose(f, allowed, step)
		if err := m.Accept(id); err != nil {
			t.Fatalf("after %q: Accept(%d) of an allowed token: %v", f.decode(t, ids), id, err)
		}
		if f.isEOS(id) {
			if !m.Done() {
				t.Fatal("EOS accepted but not Done")
			}
			return ids
		}
		ids = append(ids, id)
	}
	t.Fatalf("no end after %d steps: %q", p.maxSteps, f.decode(t, ids))
	return nil
}

// sampleOutputs compiles spec and returns n sampled outputs (half uniform,
// half with a random logit bias).
func sampleOutputs(t *testing.T, f *fixture, spec grammar.Spec, n int, seed uint64) []string {
	t.Helper()
	g, err := f.v.Compile(spec)
	if err != nil {
		t.Fatal(err)
	}
	outs := make([]string, n)
	for i := range outs {
		m, err := g.NewMatcher()
		if err != nil {
			t.Fatal(err)
		}
		ids := generate(t, f, m, newPolicy(seed+uint64(i), i%2 == 1), spec.Kind == grammar.Lark)
		outs[i] = f.decode(t, ids)
		m.Close()
	}
	return outs
}

func validator(t *testing.T, schema string) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("schema.json", doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile("schema.json")
	if err != nil {
		t.Fatal(err)
	}
	return sch
}

// maxSpaceRun is the longest run of whitespace outside JSON strings.
func maxSpaceRun(s string) int {
	longest, run, inString, escaped := 0, 0, false, false
	for _, c := range s {
		switch {
		case inString:
			if escaped {
				escaped = false
			} else if c == '\\' {
				escaped = true
			} else if c == '"' {
				inString = false
			}
			run = 0
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			run++
			longest = max(longest, run)
		default:
			inString = c == '"'
			run = 0
		}
	}
	return longest
}

// TestTinyFacts checks the constants above against the tiny model.
func TestTinyFacts(t *testing.T) {
	f := tiny(t)
	var cfg struct {
		VocabSize int   `json:"vocab_size"`
		EOS       []int `json:"eos_token_id"`
	}
	for _, name := range []string{"config.json", "generation_config.json"} {
		data, err := os.ReadFile(filepath.Join(testdata, "models", "tiny-f32", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(data, &cfg); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(cfg.EOS, tinyEOS) {
			t.Errorf("%s: eos_token_id %v, want %v", name, cfg.EOS, tinyEOS)
		}
	}
	if cfg.VocabSize != tinyVocabSize {
		t.Errorf("vocab_size %d, want %d", cfg.VocabSize, tinyVocabSize)
	}
	if f.v.TokenizerSize() != tinyTokSize || f.tok.VocabSize() != tinyTokSize {
		t.Errorf("tokenizer size %d (pkg/tokenizer: %d), want %d", f.v.TokenizerSize(), f.tok.VocabSize(), tinyTokSize)
	}
	if f.v.MaskWords() != 33 || grammar.MaskWords(32) != 1 || grammar.MaskWords(33) != 2 {
		t.Errorf("MaskWords: %d", f.v.MaskWords())
	}
	for id, want := range map[int]string{tokToolCall: "<tool_call>", tokToolCallEnd: "</tool_call>", tokArgKey: "<arg_key>",
		tokArgKeyEnd: "</arg_key>", tokArgValue: "<arg_value>", tokArgValueEnd: "</arg_value>", 1000: "<|endoftext|>"} {
		if f.texts[id] != want {
			t.Errorf("token %d is %q, want %q", id, f.texts[id], want)
		}
	}
	if !strings.HasPrefix(grammar.LibraryVersion(), "llguidance@"+grammar.Version) {
		t.Errorf("library %q, package built for %s", grammar.LibraryVersion(), grammar.Version)
	}
}

// Every sampled output parses as JSON and validates against its schema.
func TestJSONSchemaSampling(t *testing.T) {
	f := tiny(t)
	const perSchema = 40
	tests := []struct {
		name   string
		schema string
	}{
		{"required", `{"type":"object","properties":{"name":{"type":"string","maxLength":12},"age":{"type":"integer","minimum":0,"maximum":150}},"required":["name","age"],"additionalProperties":false}`},
		{"enum", `{"type":"object","properties":{"color":{"enum":["red","green","blue"]},"size":{"type":"string","enum":["S","M","L","XL"]}},"required":["color","size"],"additionalProperties":false}`},
		{"number-ranges", `{"type":"object","properties":{"x":{"type":"number","minimum":-10.5,"maximum":10},"n":{"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":1000}},"required":["x","n"],"additionalProperties":false}`},
		{"array", `{"type":"array","items":{"type":"integer","minimum":0,"maximum":99},"minItems":2,"maxItems":5}`},
		{"nested", `{"type":"object","properties":{"user":{"type":"object","properties":{"id":{"type":"integer","minimum":1,"maximum":99999},"tags":{"type":"array","items":{"type":"string","maxLength":5},"maxItems":3}},"required":["id","tags"],"additionalProperties":false},"active":{"type":"boolean"}},"required":["user","active"],"additionalProperties":false}`},
		{"strings", `{"type":"object","properties":{"code":{"type":"string","pattern":"^[A-Z]{3}-[0-9]{2}$"},"note":{"type":"string","minLength":2,"maxLength":8}},"required":["code","note"],"additionalProperties":false}`},
		{"anyOf-null-const", `{"type":"object","properties":{"v":{"anyOf":[{"type":"null"},{"type":"integer","minimum":-5,"maximum":5},{"const":"x"}]}},"required":["v"],"additionalProperties":false}`},
		{"optional", `{"type":"object","properties":{"a":{"type":"boolean"},"b":{"type":"integer","minimum":1,"maximum":3},"c":{"type":"string","maxLength":3}},"additionalProperties":false}`},
		{"defs-ref", `{"$defs":{"pt":{"type":"object","properties":{"x":{"type":"integer","minimum":0,"maximum":9},"y":{"type":"integer","minimum":0,"maximum":9}},"required":["x","y"],"additionalProperties":false}},"type":"array","items":{"$ref":"#/$defs/pt"},"minItems":1,"maxItems":3}`},
		{"top-level-string", `{"type":"string","maxLength":10}`},
	}
	total := 0
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sch := validator(t, tc.schema)
			for j, out := range sampleOutputs(t, f, grammar.Spec{Kind: grammar.JSONSchema, Text: tc.schema}, perSchema, uint64(1000*i)) {
				inst, err := jsonschema.UnmarshalJSON(strings.NewReader(out))
				if err != nil {
					t.Fatalf("sample %d %q is not JSON: %v", j, out, err)
				}
				if err := sch.Validate(inst); err != nil {
					t.Fatalf("sample %d %q does not validate: %v", j, out, err)
				}
				if n := maxSpaceRun(out); n > grammar.MaxJSONWhitespace {
					t.Fatalf("sample %d %q: %d whitespace characters in a row", j, out, n)
				}
				if j < 2 {
					t.Logf("%q", out)
				}
				total++
			}
		})
	}
	t.Logf("%d samples validated", total)
}

// The whitespace policies: compact output has none, bounded at most
// MaxJSONWhitespace in a gap, flexible any; a schema's own x-guidance wins.
func TestJSONWhitespace(t *testing.T) {
	f := tiny(t)
	const schema = `{"type":"object","properties":{"a":{"type":"array","items":{"type":"integer","minimum":0,"maximum":9},"maxItems":4},"b":{"type":"boolean"}},"required":["a","b"],"additionalProperties":false}`
	space, brace := f.tokenID(t, " "), f.tokenID(t, "{")
	tests := []struct {
		name     string
		spec     grammar.Spec
		maxSpace int // spaces accepted in a row after "{"; -1: unbounded
	}{
		{"compact", grammar.Spec{Kind: grammar.JSONSchema, Text: schema, Whitespace: grammar.WhitespaceCompact}, 0},
		{"bounded", grammar.Spec{Kind: grammar.JSONSchema, Text: schema}, grammar.MaxJSONWhitespace},
		{"flexible", grammar.Spec{Kind: grammar.JSONSchema, Text: schema, Whitespace: grammar.WhitespaceFlexible}, -1},
		{"object-compact", grammar.Spec{Kind: grammar.JSONObject, Whitespace: grammar.WhitespaceCompact}, 0},
		{"object-bounded", grammar.Spec{Kind: grammar.JSONObject}, grammar.MaxJSONWhitespace},
		{"own-x-guidance", grammar.Spec{Kind: grammar.JSONSchema, Whitespace: grammar.WhitespaceCompact,
			Text: `{"type":"object","x-guidance":{"whitespace_flexible":true}}`}, -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g, err := f.v.Compile(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			m, err := g.NewMatcher()
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if err := m.Accept(brace); err != nil {
				t.Fatal(err)
			}
			n := 0
			for ; n < 100 && m.Accept(space) == nil; n++ {
			}
			if want := tc.maxSpace; want >= 0 && n != want || want < 0 && n != 100 {
				t.Fatalf("%d spaces accepted after {, want %d", n, want)
			}
			if tc.spec.Kind == grammar.JSONObject || tc.name == "own-x-guidance" {
				return
			}
			for i, out := range sampleOutputs(t, f, tc.spec, 20, 77) {
				if n := maxSpaceRun(out); tc.maxSpace >= 0 && n > tc.maxSpace {
					t.Fatalf("sample %d %q: %d whitespace characters in a row", i, out, n)
				}
			}
		})
	}
}

func TestJSONObjectSampling(t *testing.T) {
	f := tiny(t)
	outs := sampleOutputs(t, f, grammar.Spec{Kind: grammar.JSONObject}, 60, 42)
	for i, out := range outs {
		var obj map[string]any
		if err := json.Unmarshal([]byte(out), &obj); err != nil {
			t.Fatalf("sample %d %q is not a JSON object: %v", i, out, err)
		}
		if i < 3 {
			t.Logf("%q", out)
		}
	}
}

func TestRegexSampling(t *testing.T) {
	f := tiny(t)
	tests := []struct{ re, goRe string }{ // goRe: Go's spelling, if different
		{re: `[a-z]{1,8}@[a-z]{2,6}\.(com|org)`},
		{re: `[0-9]{3}-[0-9]{4}`},
		{re: `(yes|no|maybe)`},
		{re: `[A-Z][a-z]{0,10}( [A-Z][a-z]{0,10}){0,3}`},
		{re: `\([0-9]{1,3}(, [0-9]{1,3}){0,4}\)`},
		{re: `\d{2}`, goRe: `\p{Nd}{2}`}, // \d is any Unicode digit (Rust regex), not Go's [0-9]
		{re: `<tool_call>[a-z]+`},        // the text, not the tag token (TestLarkLiteralIsText)
	}
	for i, tc := range tests {
		t.Run(tc.re, func(t *testing.T) {
			goRe := regexp.MustCompile(`^(?:` + cmp.Or(tc.goRe, tc.re) + `)$`)
			for j, out := range sampleOutputs(t, f, grammar.Spec{Kind: grammar.Regex, Text: tc.re}, 30, uint64(500*i)) {
				if !goRe.MatchString(out) {
					t.Fatalf("sample %d %q does not match %s", j, out, goRe)
				}
				if j < 2 {
					t.Logf("%q", out)
				}
			}
		})
	}
}

// A Lark grammar can require special tokens, here a GLM-4.7 tool call:
// the tag tokens are named as <tool_call> (tokenizer.json marks them
// "special": false; NewVocab makes them special tokens) or by id, <[1024]>.
func TestLarkSpecialTokens(t *testing.T) {
	f := tiny(t)
	const lark = `
start: <tool_call> NAME "\n" arg{1,3} <[1024]>
arg: <arg_key> KEY </arg_key> "\n" <arg_value> VALUE </arg_value> "\n"
NAME: /[a-z_]{1,12}/
KEY: /[a-z]{1,8}/
VALUE: /[a-z0-9 ]{1,10}/
`
	want := regexp.MustCompile(`^<tool_call>[a-z_]{1,12}\n(<arg_key>[a-z]{1,8}</arg_key>\n<arg_value>[a-z0-9 ]{1,10}</arg_value>\n){1,3}</tool_call>$`)
	g, err := f.v.Compile(grammar.Spec{Kind: grammar.Lark, Text: lark})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 30; i++ {
		m, err := g.NewMatcher()
		if err != nil {
			t.Fatal(err)
		}
		ids := generate(t, f, m, newPolicy(uint64(i), i%2 == 1), true)
		m.Close()
		out := f.decode(t, ids)
		if !want.MatchString(out) {
			t.Fatalf("sample %d %q does not match", i, out)
		}
		if ids[0] != tokToolCall || ids[len(ids)-1] != tokToolCallEnd {
			t.Fatalf("sample %d: ids %v do not start with %d and end with %d", i, ids, tokToolCall, tokToolCallEnd)
		}
		for _, tag := range []int{tokArgKey, tokArgKeyEnd, tokArgValue, tokArgValueEnd} {
			if !slices.Contains(ids, tag) {
				t.Fatalf("sample %d: ids %v lack the tag token %d", i, ids, tag)
			}
		}
		if i < 2 {
			t.Logf("%q", out)
		}
	}
	// The first mask is exactly <tool_call>.
	m, _ := g.NewMatcher()
	defer m.Close()
	mask := make([]uint32, f.v.MaskWords())
	if err := m.FillMask(mask); err != nil {
		t.Fatal(err)
	}
	if got := allowedIDs(mask, tinyVocabSize); !slices.Equal(got, []int{tokToolCall}) {
		t.Fatalf("first mask %v, want [%d]", got, tokToolCall)
	}
}

// A quoted "<tool_call>" in a grammar is text: spelled with ordinary tokens,
// never the tag token.
func TestLarkLiteralIsText(t *testing.T) {
	f := tiny(t)
	g, err := f.v.Compile(grammar.Spec{Kind: grammar.Lark, Text: `start: "<tool_call>"`})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := g.NewMatcher()
	defer m.Close()
	mask := make([]uint32, f.v.MaskWords())
	if err := m.FillMask(mask); err != nil {
		t.Fatal(err)
	}
	allowed := allowedIDs(mask, tinyVocabSize)
	if slices.Contains(allowed, tokToolCall) || len(allowed) == 0 {
		t.Fatalf("mask %v", allowed)
	}
	for _, id := range allowed {
		if !strings.HasPrefix("<tool_call>", f.texts[id]) {
			t.Fatalf("token %d %q allowed", id, f.texts[id])
		}
	}
}

func TestCompileErrors(t *testing.T) {
	f := tiny(t)
	tests := []struct {
		spec grammar.Spec
		want string // in the error text
	}{
		{grammar.Spec{Kind: grammar.JSONSchema, Text: `{"type":"object","properties":{"a":{"type":"foo"}}}`}, "Invalid type: foo"},
		{grammar.Spec{Kind: grammar.JSONSchema, Text: `{"type":"object","propertyNames":{"pattern":"x"}}`}, `Unimplemented keys: ["propertyNames"]`},
		{grammar.Spec{Kind: grammar.JSONSchema, Text: `{"type":"string","format":"shoe-size"}`}, "Unknown format: shoe-size"},
		{grammar.Spec{Kind: grammar.JSONSchema, Text: `{"type":"object","properties":{"a":{"type":"integer","minimum":5,"maximum":2}},"required":["a"]}`}, "nsatisfiable"},
		{grammar.Spec{Kind: grammar.JSONSchema, Text: `{"$ref":"#/$defs/nope"}`}, "/$defs/nope"},
		{grammar.Spec{Kind: grammar.JSONSchema, Text: `{"type":`}, "not JSON"},
		{grammar.Spec{Kind: grammar.JSONSchema, Text: `[1]`}, "a schema is a JSON object"},
		{grammar.Spec{Kind: grammar.JSONSchema, Text: `false`}, "allows nothing"},
		{grammar.Spec{Kind: grammar.JSONSchema, Text: ` `}, "empty schema"},
		{grammar.Spec{Kind: grammar.Regex, Text: `a(b`}, "unclosed group"},
		{grammar.Spec{Kind: grammar.Regex, Text: ""}, "empty"},
		{grammar.Spec{Kind: grammar.Regex, Text: "a\x00"}, "NUL"},
		{grammar.Spec{Kind: grammar.Lark, Text: `start: foo`}, `unknown name: "foo"`},
		{grammar.Spec{Kind: grammar.Lark, Text: `start: <nosuch>`}, `unknown special token: "<nosuch>"`},
		{grammar.Spec{Kind: grammar.Lark, Text: `start: "a" (`}, "lark"},
		{grammar.Spec{Kind: grammar.Lark, Text: ""}, "empty grammar"},
		{grammar.Spec{Kind: grammar.Lark, Text: `start: <[1037]>`}, "only padding token ids"},
		{grammar.Spec{Text: "x"}, "unknown kind"},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%v %q", tc.spec.Kind, tc.spec.Text), func(t *testing.T) {
			g, err := f.v.Compile(tc.spec)
			if err == nil {
				t.Fatalf("compiled: %v", g.Spec())
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
			t.Log(err)
		})
	}
	// Lenient: an unimplemented keyword is ignored.
	if _, err := f.v.Compile(grammar.Spec{Kind: grammar.JSONSchema, Text: `{"type":"object","propertyNames":{"pattern":"x"}}`, Lenient: true}); err != nil {
		t.Errorf("lenient: %v", err)
	}
}

// EOS is allowed exactly when the output is complete, and once the grammar
// cannot continue the matcher is Done with only EOS allowed.
func TestEOSAndDone(t *testing.T) {
	f := tiny(t)
	a, b, c := f.tokenID(t, "a"), f.tokenID(t, "b"), f.tokenID(t, "c")
	mask := make([]uint32, f.v.MaskWords())
	step := func(m *grammar.Matcher, tok int) {
		t.Helper()
		if err := m.FillMask(mask); err != nil {
			t.Fatal(err)
		}
		checkMask(t, f, m, mask, false)
		if err := m.Accept(tok); err != nil {
			t.Fatal(err)
		}
	}

	// "abc": EOS only at the end, where the matcher is Done by itself.
	g, err := f.v.Compile(grammar.Spec{Kind: grammar.Regex, Text: "abc"})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := g.NewMatcher()
	defer m.Close()
	for _, tok := range []int{a, b} {
		step(m, tok)
		if m.Accepting() || m.Done() {
			t.Fatal("complete too early")
		}
	}
	if err := m.Accept(tinyEOS[0]); !errors.Is(err, grammar.ErrNotAllowed) {
		t.Fatalf("EOS before the end: %v", err)
	}
	step(m, c)
	if !m.Done() || !m.Accepting() {
		t.Fatal("not Done after abc")
	}
	if err := m.FillMask(mask); err != nil {
		t.Fatal(err)
	}
	if got := allowedIDs(mask, tinyVocabSize); !slices.Equal(got, tinyEOS) {
		t.Fatalf("mask when Done %v, want %v", got, tinyEOS)
	}
	if n, err := m.ValidPrefix([]int{tinyEOS[2], tinyEOS[0], a}); n != 2 || err != nil {
		t.Fatalf("ValidPrefix(EOS EOS a) when Done = %d, %v", n, err)
	}
	// EOS after Done is accepted (and ignored), anything else is not.
	for _, eos := range tinyEOS {
		if err := m.Accept(eos); err != nil {
			t.Fatalf("Accept(EOS %d) when Done: %v", eos, err)
		}
	}
	if err := m.Accept(a); !errors.Is(err, grammar.ErrNotAllowed) {
		t.Fatalf("Accept(a) when Done: %v", err)
	}
	if m.Len() != 6 {
		t.Fatalf("Len %d, want 6", m.Len())
	}
	if err := m.Rollback(3); err != nil || !m.Done() {
		t.Fatalf("rollback of the extra EOS: %v, Done %v", err, m.Done())
	}
	if err := m.Rollback(1); err != nil || m.Done() || m.Accepting() {
		t.Fatalf("rollback of c: %v, Done %v", err, m.Done())
	}
	step(m, c)

	// "a+": EOS allowed after each a, never Done by itself; EOS ends it.
	g, err = f.v.Compile(grammar.Spec{Kind: grammar.Regex, Text: "a+"})
	if err != nil {
		t.Fatal(err)
	}
	m2, _ := g.NewMatcher()
	defer m2.Close()
	step(m2, a)
	for i := 0; i < 5; i++ {
		if !m2.Accepting() || m2.Done() {
			t.Fatalf("after %d a: Accepting %v Done %v", i+1, m2.Accepting(), m2.Done())
		}
		step(m2, a)
	}
	if n, err := m2.ValidPrefix([]int{a, tinyEOS[1], a}); n != 2 || err != nil {
		t.Fatalf("ValidPrefix(a EOS a) = %d, %v", n, err)
	}
	step(m2, tinyEOS[1])
	if !m2.Done() {
		t.Fatal("not Done after EOS")
	}
}

// A disallowed token is an error that leaves the matcher unchanged.
func TestAcceptDisallowed(t *testing.T) {
	f := tiny(t)
	const schema = `{"type":"object","properties":{"k":{"type":"integer","minimum":0,"maximum":9}},"required":["k"],"additionalProperties":false}`
	g, err := f.v.Compile(grammar.Spec{Kind: grammar.JSONSchema, Text: schema})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := g.NewMatcher()
	defer m.Close()
	before := make([]uint32, f.v.MaskWords())
	if err := m.FillMask(before); err != nil {
		t.Fatal(err)
	}
	for _, tok := range []int{f.tokenID(t, "a"), f.tokenID(t, "}"), tokToolCall, 1001, tinyEOS[0], tinyTokSize, tinyVocabSize - 1, tinyVocabSize, -1, 1 << 40} {
		err := m.Accept(tok)
		if !errors.Is(err, grammar.ErrNotAllowed) {
			t.Fatalf("Accept(%d) = %v, want ErrNotAllowed", tok, err)
		}
		if m.Err() != nil || m.Len() != 0 {
			t.Fatalf("after Accept(%d): Err %v, Len %d", tok, m.Err(), m.Len())
		}
		after := make([]uint32, f.v.MaskWords())
		if err := m.FillMask(after); err != nil || !slices.Equal(before, after) {
			t.Fatalf("after Accept(%d): mask changed (%v)", tok, err)
		}
	}
	var obj struct{ K *int }
	out := f.decode(t, generate(t, f, m, newPolicy(3, false), false))
	if err := json.Unmarshal([]byte(out), &obj); err != nil || obj.K == nil {
		t.Fatalf("%q after the rejected tokens: %v", out, err)
	}
}

// Rollback returns to earlier states exactly (their masks), including out
// of Done, and refuses to go back further than the start.
func TestRollback(t *testing.T) {
	f := tiny(t)
	g, err := f.v.Compile(grammar.Spec{Kind: grammar.JSONSchema,
		Text: `{"type":"object","properties":{"s":{"type":"string","maxLength":6},"n":{"type":"array","items":{"type":"integer"},"maxItems":3}},"required":["s","n"]}`})
	if err != nil {
		t.Fatal(err)
	}
	for seed := uint64(0); seed < 10; seed++ {
		m, _ := g.NewMatcher()
		p := newPolicy(seed, seed%2 == 1)
		var masks [][]uint32
		var ids []int
		for !m.Done() {
			if len(ids) == p.maxSteps {
				t.Fatalf("no end after %d steps", p.maxSteps)
			}
			mask := make([]uint32, f.v.MaskWords())
			if err := m.FillMask(mask); err != nil {
				t.Fatal(err)
			}
			id := p.choose(f, checkMask(t, f, m, mask, false), len(ids))
			if err := m.Accept(id); err != nil {
				t.Fatal(err)
			}
			masks, ids = append(masks, mask), append(ids, id)
		}
		if err := m.Rollback(len(ids) + 1); err == nil || m.Err() != nil {
			t.Fatalf("rollback past the start: %v (matcher error %v)", err, m.Err())
		}
		// Back step by step in random strides, checking each state's mask.
		mask := make([]uint32, f.v.MaskWords())
		for n := len(ids); n > 0; {
			k := 1 + p.rng.IntN(min(n, 4))
			if err := m.Rollback(k); err != nil {
				t.Fatal(err)
			}
			n -= k
			if m.Done() {
				t.Fatal("Done after rollback")
			}
			if err := m.FillMask(mask); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(mask, masks[n]) {
				t.Fatalf("seed %d: mask after rolling back to %d tokens differs", seed, n)
			}
		}
		// Forward again along the same path.
		for _, id := range ids {
			if err := m.Accept(id); err != nil {
				t.Fatal(err)
			}
		}
		if !m.Done() {
			t.Fatal("not Done after replaying the path")
		}
		// Reset is a rollback to the start.
		if err := m.Reset(); err != nil || m.Len() != 0 {
			t.Fatal(err)
		}
		if err := m.FillMask(mask); err != nil || !slices.Equal(mask, masks[0]) {
			t.Fatalf("mask after Reset differs (%v)", err)
		}
		// ValidPrefix checks a whole draft without moving.
		if n, err := m.ValidPrefix(ids); n != len(ids) || err != nil {
			t.Fatalf("ValidPrefix(path) = %d, %v; want %d", n, err, len(ids))
		}
		k := p.rng.IntN(len(ids))
		draft := append(slices.Clone(ids[:k]), tokToolCall, ids[k])
		if n, err := m.ValidPrefix(draft); n != k || err != nil {
			t.Fatalf("ValidPrefix(draft with a bad token at %d) = %d, %v", k, n, err)
		}
		if n, _ := m.ValidPrefix(append(slices.Clone(ids[:k]), tinyVocabSize-1)); n != k {
			t.Fatalf("ValidPrefix(draft with padding at %d) = %d", k, n)
		}
		if err := m.FillMask(mask); err != nil || m.Len() != 0 || !slices.Equal(mask, masks[0]) {
			t.Fatalf("ValidPrefix moved the matcher (%v)", err)
		}
		m.Close()
	}
}

// Padding ids are never allowed, even by a Lark range that names them.
func TestPaddingNeverAllowed(t *testing.T) {
	f := tiny(t)
	for _, lark := range []string{`start: <[*]>`, `start: <[1030-1039]>`, `start: <[1035-1039]>`, `start: "a" <[1036-1039]> | "ab"`} {
		g, err := f.v.Compile(grammar.Spec{Kind: grammar.Lark, Text: lark})
		if err != nil {
			t.Fatal(err)
		}
		m, _ := g.NewMatcher()
		mask := make([]uint32, f.v.MaskWords())
		for i := range mask {
			mask[i] = ^uint32(0) // FillMask overwrites everything
		}
		if err := m.FillMask(mask); err != nil {
			t.Fatal(err)
		}
		allowed := allowedIDs(mask, tinyVocabSize)
		if slices.Max(allowed) >= tinyTokSize {
			t.Fatalf("%s: allowed %v", lark, allowed)
		}
		if err := m.Accept(tinyTokSize + 1); !errors.Is(err, grammar.ErrNotAllowed) {
			t.Fatalf("%s: Accept(padding) = %v", lark, err)
		}
		m.Close()
	}
	// Where only padding ids would be allowed, FillMask is an error.
	g, err := f.v.Compile(grammar.Spec{Kind: grammar.Lark, Text: `start: "a" <[1036-1039]>`})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := g.NewMatcher()
	defer m.Close()
	if err := m.Accept(f.tokenID(t, "a")); err != nil {
		t.Fatal(err)
	}
	if err := m.FillMask(make([]uint32, f.v.MaskWords())); err == nil || !strings.Contains(err.Error(), "only padding") {
		t.Fatalf("FillMask = %v", err)
	}
}

func TestCacheAndSharing(t *testing.T) {
	f := tiny(t)
	spec := grammar.Spec{Kind: grammar.Regex, Text: "[0-9]{1,3}"}
	g1, err := f.v.Compile(spec)
	if err != nil {
		t.Fatal(err)
	}
	g2, _ := f.v.Compile(spec)
	if g1 != g2 {
		t.Fatal("same spec compiled twice")
	}
	if g3, _ := f.v.Compile(grammar.Spec{Kind: grammar.Regex, Text: "[0-9]{1,4}"}); g3 == g1 {
		t.Fatal("different specs share a grammar")
	}
	// Evict g1; it stays usable.
	for i := 0; i < grammar.DefaultCacheSize+1; i++ {
		if _, err := f.v.Compile(grammar.Spec{Kind: grammar.Regex, Text: fmt.Sprintf("x{%d}", i+1)}); err != nil {
			t.Fatal(err)
		}
	}
	if g4, _ := f.v.Compile(spec); g4 == g1 {
		t.Fatal("not evicted")
	}
	m, err := g1.NewMatcher()
	if err != nil {
		t.Fatal(err)
	}
	if out := f.decode(t, generate(t, f, m, newPolicy(1, false), false)); !regexp.MustCompile(`^[0-9]{1,3}$`).MatchString(out) {
		t.Fatalf("evicted grammar produced %q", out)
	}
	m.Close()

	// Many goroutines share the grammars and compile concurrently.
	specs := []grammar.Spec{
		{Kind: grammar.JSONObject},
		{Kind: grammar.JSONSchema, Text: `{"type":"array","items":{"type":"boolean"},"maxItems":4}`},
		{Kind: grammar.Regex, Text: "(ab|cd)+e"},
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			mask := make([]uint32, f.v.MaskWords())
			for i := 0; i < 20; i++ {
				g, err := f.v.Compile(specs[(w+i)%len(specs)])
				if err != nil {
					errs <- err
					return
				}
				m, err := g.NewMatcher()
				if err != nil {
					errs <- err
					return
				}
				for step := 0; step < 30 && !m.Done(); step++ {
					if err := m.FillMask(mask); err != nil {
						errs <- err
						return
					}
					allowed := allowedIDs(mask, tinyVocabSize)
					if err := m.Accept(allowed[rng.IntN(len(allowed))]); err != nil {
						errs <- err
						return
					}
				}
				m.Close()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestClose(t *testing.T) {
	f := tiny(t)
	g, err := f.v.Compile(grammar.Spec{Kind: grammar.JSONObject})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := g.NewMatcher()
	m.Close()
	m.Close()
	if err := m.FillMask(make([]uint32, f.v.MaskWords())); !errors.Is(err, grammar.ErrClosed) {
		t.Errorf("FillMask after Close: %v", err)
	}
	if err := m.Accept(1); !errors.Is(err, grammar.ErrClosed) {
		t.Errorf("Accept after Close: %v", err)
	}
	if err := m.Rollback(0); !errors.Is(err, grammar.ErrClosed) {
		t.Errorf("Rollback after Close: %v", err)
	}
	if m.Done() || m.Accepting() {
		t.Error("closed matcher Done or Accepting")
	}
	// A matcher never closed is freed when collected (no crash).
	for i := 0; i < 10; i++ {
		if _, err := g.NewMatcher(); err != nil {
			t.Fatal(err)
		}
	}
	m2, _ := g.NewMatcher()
	defer m2.Close()
	if err := m2.FillMask(make([]uint32, f.v.MaskWords()-1)); err == nil {
		t.Error("FillMask accepted a short mask")
	}
}

func TestVocabErrors(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(testdata, "tokenizers", "tiny-glm", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		data  []byte
		size  int
		eos   []int
		wants string
	}{
		{"small vocab", data, tinyTokSize - 1, tinyEOS, "smaller than the tokenizer"},
		{"no eos", data, tinyVocabSize, nil, "no EOS"},
		{"eos range", data, tinyVocabSize, []int{tinyVocabSize}, "out of range"},
		{"not json", []byte(`{"model":`), tinyVocabSize, tinyEOS, "tokenizer.json"},
		{"no model", []byte(`{"added_tokens":[]}`), tinyVocabSize, tinyEOS, "no model"},
		{"bad vocab", []byte(`{"model":{"vocab":{"a":"b"}}}`), tinyVocabSize, tinyEOS, "model.vocab"},
		{"no decoder", []byte(`{"model":{"vocab":{"a":0}},"added_tokens":[]}`), tinyVocabSize, tinyEOS, "decoder"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := grammar.NewVocab(tc.data, tc.size, tc.eos)
			if err == nil || !strings.Contains(err.Error(), tc.wants) {
				t.Fatalf("error %v, want one containing %q", err, tc.wants)
			}
		})
	}
	if _, err := grammar.NewVocabFromTokenizerJSON(filepath.Join(t.TempDir(), "missing.json"), 10, []int{0}); err == nil {
		t.Error("missing file: no error")
	}
	// The exact tokenizer size as vocab size: no padding.
	v, err := grammar.NewVocab(data, tinyTokSize, tinyEOS)
	if err != nil || v.VocabSize() != tinyTokSize || v.MaskWords() != grammar.MaskWords(tinyTokSize) {
		t.Fatalf("vocab of the tokenizer's size: %v", err)
	}
}
