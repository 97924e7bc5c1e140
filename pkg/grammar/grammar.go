// Package grammar constrains decoding to a grammar: for each step it gives
// the engine a bit mask of the token ids the grammar allows next (JSON
// schemas, any JSON object, regular expressions, Lark grammars). It is a thin
// cgo layer over llguidance (the Rust crate, MIT, github.com/guidance-ai/
// llguidance) through its C API, llguidance.h, vendored here.
//
// Linking needs libllguidance.a: `make llguidance-lib` builds it
// (scripts/build-llguidance.sh), and the Makefile passes CGO_LDFLAGS=-L<dir>
// (mk/llguidance.mk). See docs/grammar.md.
//
// The pieces, from long-lived to per-request:
//
//   - Vocab: the model's vocabulary as llguidance sees it, built once per model
//     from tokenizer.json. Safe for concurrent use.
//   - Grammar: a compiled Spec (Vocab.Compile, which caches recent specs).
//     Immutable and safe for concurrent use; share it between requests.
//   - Matcher: one per sequence (Grammar.NewMatcher): FillMask before each
//     sampling step, Accept the sampled token, stop when Done. Not safe for
//     concurrent use. Close it when the sequence ends.
//
// Memory: every C object is owned by exactly one Go object. Matchers are
// freed by Close (a cleanup frees a forgotten one when it is collected);
// Grammars and Vocabs are freed by cleanups when they become unreachable, so
// a Grammar evicted from the cache stays valid for whoever still holds it.
package grammar

/*
#cgo LDFLAGS: -lllguidance -lgcc_s -lutil -lrt -lpthread -lm -ldl
#include <stdlib.h>
#include "llguidance.h"

// The tokenizer's init struct, filled on the C side so that no Go pointer is
// stored in C memory.
static LlgTokenizer *glm_new_tokenizer(const char *tokenizer_json, uint32_t vocab_size,
		const uint32_t *eos, uint32_t n_eos, char *err, size_t err_len) {
	LlgTokenizerInitV2 init = {0};
	init.struct_size = sizeof(init);
	init.vocab_size = vocab_size;
	init.tok_eos = eos[0];
	if (n_eos > 1) {
		init.tok_eos_extra = eos + 1;
		init.tok_eos_extra_count = n_eos - 1;
	}
	init.tokenizer_json = tokenizer_json;
	init.use_approximate_greedy_tokenize_fn = true;
	return llg_new_tokenizer_v2(&init, err, err_len);
}

// A matcher for one grammar, with llguidance's default limits, no logging to
// stderr and short error messages (no parser state dump).
static LlgMatcher *glm_new_matcher(const LlgTokenizer *tok, const char *kind, const char *data) {
	LlgConstraintInit init;
	llg_constraint_init_set_defaults(&init, tok);
	init.log_buffer_level = 0;
	init.log_stderr_level = 0;
	init.limits.verbose_errors = false;
	return llg_new_matcher(&init, kind, data);
}
*/
import "C"

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"unsafe"
)

// Version is the llguidance version the package is built against.
const Version = "1.9.1"

// LibraryVersion reports the linked library's own version string (e.g.
// "llguidance@1.9.1 derivre@0.3.13").
func LibraryVersion() string { return C.GoString(C.llg_get_version()) }

// MaskWords is the number of uint32 words of a mask for vocabSize tokens:
// bit i%32 of word i/32 is token i.
func MaskWords(vocabSize int) int { return (vocabSize + 31) / 32 }

// Vocab is a model's token vocabulary for llguidance, built once per model.
// It is safe for concurrent use.
type Vocab struct {
	tok       *C.LlgTokenizer
	vocabSize int // the model's (mask length in bits)
	tokSize   int // the tokenizer's: ids in [tokSize, vocabSize) are never allowed
	eos       []int

	cache *lru
}

// DefaultCacheSize is how many compiled grammars a Vocab keeps for reuse.
const DefaultCacheSize = 64

// tagRe is llguidance's Lark syntax for a special token, <name>.
var tagRe = regexp.MustCompile(`^<[^<>\s]+>$`)

// NewVocabFromTokenizerJSON reads a Hugging Face tokenizer.json (byte-level
// BPE or byte-fallback models). vocabSize is the model's (config.json
// vocab_size), at least the tokenizer's size; ids past the tokenizer
// (embedding padding) are never allowed. eosIDs are the model's stop tokens
// (GLM: several): each is allowed exactly when the grammar is complete.
//
// Added tokens that look like tags (<tool_call>, </think>, <|user|>, ...)
// are given to llguidance as special tokens even where tokenizer.json marks
// them "special": false, as GLM does for its tool-call and thinking
// markers: a Lark grammar can then require one by name (<tool_call>), and
// no other grammar ever produces one, since text lexemes never match a
// special token (the same text can still be spelled with ordinary tokens).
func NewVocabFromTokenizerJSON(path string, vocabSize int, eosIDs []int) (*Vocab, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("grammar: %w", err)
	}
	return NewVocab(data, vocabSize, eosIDs)
}

// NewVocab is NewVocabFromTokenizerJSON with the file's contents.
func NewVocab(tokenizerJSON []byte, vocabSize int, eosIDs []int) (*Vocab, error) {
	data, tokSize, err := prepareTokenizerJSON(tokenizerJSON)
	if err != nil {
		return nil, err
	}
	if vocabSize < tokSize {
		return nil, fmt.Errorf("grammar: vocab size %d is smaller than the tokenizer's %d tokens", vocabSize, tokSize)
	}
	if len(eosIDs) == 0 {
		return nil, errors.New("grammar: no EOS token ids")
	}
	if bytes.IndexByte(data, 0) >= 0 {
		return nil, errors.New("grammar: tokenizer.json contains a NUL byte")
	}
	ceos := (*C.uint32_t)(C.malloc(C.size_t(len(eosIDs)) * 4))
	defer C.free(unsafe.Pointer(ceos))
	eosSlice := unsafe.Slice(ceos, len(eosIDs))
	for i, id := range eosIDs {
		if id < 0 || id >= vocabSize {
			return nil, fmt.Errorf("grammar: EOS id %d out of range [0,%d)", id, vocabSize)
		}
		eosSlice[i] = C.uint32_t(id)
	}
	cjson := C.CString(string(data))
	defer C.free(unsafe.Pointer(cjson))
	const errLen = 1024
	cerr := (*C.char)(C.malloc(errLen))
	defer C.free(unsafe.Pointer(cerr))
	*cerr = 0
	tok := C.glm_new_tokenizer(cjson, C.uint32_t(vocabSize), ceos, C.uint32_t(len(eosIDs)), cerr, errLen)
	if tok == nil {
		return nil, fmt.Errorf("grammar: tokenizer: %s", C.GoString(cerr))
	}
	v := &Vocab{
		tok:       tok,
		vocabSize: vocabSize,
		tokSize:   tokSize,
		eos:       append([]int(nil), eosIDs...),
		cache:     newLRU(DefaultCacheSize),
	}
	// Matchers and grammars keep their own references to what they need of
	// the tokenizer (llguidance shares it by reference count), so freeing
	// it when the Vocab is unreachable is safe in any order.
	runtime.AddCleanup(v, func(p *C.LlgTokenizer) { C.llg_free_tokenizer(p) }, tok)
	return v, nil
}

// prepareTokenizerJSON returns tokenizer.json with tag-like added tokens
// marked special, and the tokenizer's size (one more than its largest id).
// Only the added_tokens array is rewritten; the rest (megabytes for a large
// vocabulary) is passed on as it is.
func prepareTokenizerJSON(data []byte) ([]byte, int, error) {
	top, err := objectFields(data)
	if err != nil {
		return nil, 0, fmt.Errorf("grammar: tokenizer.json: %w", err)
	}
	mf, ok := top["model"]
	if !ok {
		return nil, 0, errors.New("grammar: tokenizer.json has no model")
	}
	model, err := objectFields(data[mf.start:mf.end])
	if err != nil {
		return nil, 0, fmt.Errorf("grammar: tokenizer.json model: %w", err)
	}
	vf, ok := model["vocab"]
	if !ok {
		return nil, 0, errors.New("grammar: tokenizer.json has no model.vocab")
	}
	size, err := maxValue(data[mf.start+vf.start : mf.start+vf.end])
	if err != nil {
		return nil, 0, fmt.Errorf("grammar: tokenizer.json model.vocab: %w", err)
	}
	size++
	af, ok := top["added_tokens"]
	if !ok {
		return data, size, nil
	}
	var added []map[string]json.RawMessage
	if err := json.Unmarshal(data[af.start:af.end], &added); err != nil {
		return nil, 0, fmt.Errorf("grammar: tokenizer.json added_tokens: %w", err)
	}
	changed := false
	for _, a := range added {
		var id int
		var content string
		var special bool
		if err := json.Unmarshal(a["id"], &id); err != nil {
			return nil, 0, fmt.Errorf("grammar: tokenizer.json added token id: %w", err)
		}
		if err := json.Unmarshal(a["content"], &content); err != nil {
			return nil, 0, fmt.Errorf("grammar: tokenizer.json added token %d content: %w", id, err)
		}
		_ = json.Unmarshal(a["special"], &special)
		size = max(size, id+1)
		if !special && tagRe.MatchString(content) {
			a["special"] = json.RawMessage("true")
			changed = true
		}
	}
	if !changed {
		return data, size, nil
	}
	raw, err := json.Marshal(added)
	if err != nil {
		return nil, 0, err
	}
	out := make([]byte, 0, len(data)+len(raw))
	out = append(out, data[:af.start]...)
	out = append(out, raw...)
	out = append(out, data[af.end:]...)
	return out, size, nil
}

// span is where a value lies in its JSON text.
type span struct{ start, end int }

// objectFields returns where the value of each key of a JSON object lies.
// A small scanner rather than encoding/json: tokenizer.json is megabytes,
// and llguidance parses (and validates) it in full afterwards anyway.
func objectFields(data []byte) (map[string]span, error) {
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return nil, errors.New("not a JSON object")
	}
	fields := make(map[string]span)
	i = skipSpace(data, i+1)
	if i < len(data) && data[i] == '}' {
		return fields, nil
	}
	for {
		if i >= len(data) || data[i] != '"' {
			return nil, errors.New("malformed JSON object")
		}
		end, err := skipValue(data, i)
		if err != nil {
			return nil, err
		}
		var key string
		if err := json.Unmarshal(data[i:end], &key); err != nil {
			return nil, err
		}
		i = skipSpace(data, end)
		if i >= len(data) || data[i] != ':' {
			return nil, errors.New("malformed JSON object")
		}
		i = skipSpace(data, i+1)
		end, err = skipValue(data, i)
		if err != nil {
			return nil, err
		}
		fields[key] = span{i, end}
		i = skipSpace(data, end)
		if i >= len(data) {
			return nil, errors.New("unterminated JSON object")
		}
		if data[i] == '}' {
			return fields, nil
		}
		if data[i] != ',' {
			return nil, errors.New("malformed JSON object")
		}
		i = skipSpace(data, i+1)
	}
}

func skipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// skipValue returns the end of the JSON value that starts at data[i].
func skipValue(data []byte, i int) (int, error) {
	if i >= len(data) {
		return 0, errors.New("missing JSON value")
	}
	if c := data[i]; c != '"' && c != '{' && c != '[' { // a number, true, false, null
		j := i
		for j < len(data) && !strings.ContainsRune(",}] \t\n\r", rune(data[j])) {
			j++
		}
		if j == i {
			return 0, errors.New("malformed JSON value")
		}
		return j, nil
	}
	depth := 0
	for ; i < len(data); i++ {
		switch data[i] {
		case '"':
			for i++; i < len(data) && data[i] != '"'; i++ {
				if data[i] == '\\' {
					i++
				}
			}
			if i >= len(data) {
				return 0, errors.New("unterminated JSON string")
			}
		case '{', '[':
			depth++
		case '}', ']':
			depth--
		}
		if depth == 0 {
			return i + 1, nil
		}
	}
	return 0, errors.New("unterminated JSON value")
}

// maxValue returns the largest value of a JSON object of non-negative
// integers (valid JSON: it was scanned by objectFields), -1 if it is empty.
func maxValue(obj []byte) (int, error) {
	largest := -1
	for i := 0; i < len(obj); i++ {
		switch obj[i] {
		case '"': // a key: skip it
			for i++; i < len(obj) && obj[i] != '"'; i++ {
				if obj[i] == '\\' {
					i++
				}
			}
		case ':':
			i++
			for i < len(obj) && (obj[i] == ' ' || obj[i] == '\t' || obj[i] == '\n' || obj[i] == '\r') {
				i++
			}
			n, digits := 0, 0
			for ; i < len(obj) && obj[i] >= '0' && obj[i] <= '9'; i++ {
				n = n*10 + int(obj[i]-'0')
				digits++
				if n > 1<<31 {
					return 0, errors.New("token id too large")
				}
			}
			if digits == 0 {
				return 0, errors.New("a token id is not a non-negative integer")
			}
			largest = max(largest, n)
			i--
		}
	}
	return largest, nil
}

// VocabSize is the model's vocabulary size: masks have this many bits.
func (v *Vocab) VocabSize() int { return v.vocabSize }

// TokenizerSize is the tokenizer's size; ids from it up to VocabSize are
// padding and never allowed.
func (v *Vocab) TokenizerSize() int { return v.tokSize }

// EOS returns the stop token ids.
func (v *Vocab) EOS() []int { return append([]int(nil), v.eos...) }

// MaskWords is MaskWords(v.VocabSize()).
func (v *Vocab) MaskWords() int { return MaskWords(v.vocabSize) }

func (v *Vocab) isEOS(id int) bool {
	for _, e := range v.eos {
		if e == id {
			return true
		}
	}
	return false
}

// Kind is what a Spec's Text is.
type Kind int

const (
	// JSONObject: any JSON object (OpenAI's response_format json_object);
	// Text is ignored.
	JSONObject Kind = iota + 1
	// JSONSchema: Text is a JSON schema (the subset llguidance implements:
	// docs/grammar.md).
	JSONSchema
	// Regex: Text is a regular expression (Rust regex syntax) that the
	// whole output must match.
	Regex
	// Lark: Text is a grammar in llguidance's Lark dialect (EBNF-like;
	// special tokens as <name> or <[id]>).
	Lark
)

func (k Kind) String() string {
	switch k {
	case JSONObject:
		return "json_object"
	case JSONSchema:
		return "json_schema"
	case Regex:
		return "regex"
	case Lark:
		return "lark"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Whitespace is how much whitespace JSON output may have between tokens
// (JSONObject and JSONSchema only).
type Whitespace int

const (
	// WhitespaceBounded (the default): compact separators (",", ":") with
	// optional whitespace of at most MaxJSONWhitespace characters (space,
	// tab, CR, LF) in any one gap. Pretty-printed output to a modest
	// depth is possible, an endless run of newlines is not.
	WhitespaceBounded Whitespace = iota
	// WhitespaceCompact: no whitespace at all: {"a":1,"b":[2,3]}.
	WhitespaceCompact
	// WhitespaceFlexible: any amount of whitespace (llguidance's default).
	WhitespaceFlexible
)

// MaxJSONWhitespace bounds each whitespace gap under WhitespaceBounded.
const MaxJSONWhitespace = 20

// Spec says what to constrain to. It is comparable: the compile cache is
// keyed by it.
type Spec struct {
	Kind Kind
	// Text is the schema (JSON text), the regex or the grammar.
	Text string
	// Whitespace applies to JSONObject and JSONSchema. A schema's own
	// top-level "x-guidance" object, if it has one, replaces these settings.
	Whitespace Whitespace
	// Lenient makes JSON-schema keywords that llguidance does not
	// implement (and unknown string formats) warnings instead of errors:
	// they are then not enforced.
	Lenient bool
}

// Grammar is a compiled Spec. It is immutable and safe for concurrent use:
// share one between requests.
type Grammar struct {
	vocab *Vocab
	spec  Spec
	mu    sync.Mutex // serializes clones of tmpl
	tmpl  *C.LlgMatcher
}

// Compile compiles spec for this vocabulary, or returns it from the cache
// of recently compiled specs. The error of a spec that does not compile
// carries llguidance's message (fit for a 400 response).
func (v *Vocab) Compile(spec Spec) (*Grammar, error) {
	if g := v.cache.get(spec); g != nil {
		return g, nil
	}
	g, err := v.compile(spec)
	if err != nil {
		return nil, err
	}
	return v.cache.add(spec, g), nil
}

func (v *Vocab) compile(spec Spec) (*Grammar, error) {
	kind, data, err := llgInput(spec)
	if err != nil {
		return nil, err
	}
	ckind := C.CString(kind)
	defer C.free(unsafe.Pointer(ckind))
	cdata := C.CString(data)
	defer C.free(unsafe.Pointer(cdata))
	m := C.glm_new_matcher(v.tok, ckind, cdata)
	runtime.KeepAlive(v)
	if msg := C.llg_matcher_get_error(m); msg != nil {
		err := fmt.Errorf("grammar: invalid %s: %s", spec.Kind, C.GoString(msg))
		C.llg_free_matcher(m)
		return nil, err
	}
	// The first mask, computed once here: it warms the lexer cache that
	// every matcher starts from (a clone copies it), and a grammar that
	// allows nothing at all fails now rather than in a request.
	if C.llg_matcher_compute_mask(m) != 0 {
		msg := "no token allowed"
		if e := C.llg_matcher_get_error(m); e != nil {
			msg = C.GoString(e)
		}
		C.llg_free_matcher(m)
		return nil, fmt.Errorf("grammar: invalid %s: %s", spec.Kind, msg)
	}
	first := (*uint32)(unsafe.Pointer(C.llg_matcher_get_mask(m)))
	if first == nil || !anyBelow(unsafe.Slice(first, v.MaskWords()), v.tokSize) {
		C.llg_free_matcher(m)
		return nil, fmt.Errorf("grammar: invalid %s: it allows only padding token ids (from %d)", spec.Kind, v.tokSize)
	}
	g := &Grammar{vocab: v, spec: spec, tmpl: m}
	runtime.AddCleanup(g, func(p *C.LlgMatcher) { C.llg_free_matcher(p) }, m)
	return g, nil
}

// llgInput maps a Spec to llguidance's constraint type and data.
func llgInput(spec Spec) (kind, data string, err error) {
	switch spec.Kind {
	case JSONObject:
		return "json_schema", withXGuidance(`{"type":"object"}`, spec), nil
	case JSONSchema:
		text := strings.TrimSpace(spec.Text)
		if text == "" {
			return "", "", errors.New("grammar: invalid json_schema: empty schema")
		}
		var v any
		if err := json.Unmarshal([]byte(text), &v); err != nil {
			return "", "", fmt.Errorf("grammar: invalid json_schema: not JSON: %v", err)
		}
		switch v := v.(type) {
		case map[string]any:
		case bool:
			if !v {
				return "", "", errors.New("grammar: invalid json_schema: schema false allows nothing")
			}
			text = "{}" // any JSON value
		default:
			return "", "", errors.New("grammar: invalid json_schema: a schema is a JSON object")
		}
		return "json_schema", withXGuidance(text, spec), nil
	case Regex:
		if spec.Text == "" {
			return "", "", errors.New("grammar: invalid regex: empty")
		}
		return "regex", spec.Text, checkNUL(spec)
	case Lark:
		if strings.TrimSpace(spec.Text) == "" {
			return "", "", errors.New("grammar: invalid lark: empty grammar")
		}
		return "lark", spec.Text, checkNUL(spec)
	}
	return "", "", fmt.Errorf("grammar: unknown kind %d", int(spec.Kind))
}

func checkNUL(spec Spec) error {
	if strings.IndexByte(spec.Text, 0) >= 0 {
		return fmt.Errorf("grammar: invalid %s: contains a NUL byte", spec.Kind)
	}
	return nil
}

// withXGuidance puts llguidance's JSON options first in the schema object
// (text starts with '{'); the text is otherwise untouched, so property order,
// which decides generation order, is kept. A later "x-guidance" key of the
// schema's own wins (JSON objects keep the last duplicate).
func withXGuidance(text string, spec Spec) string {
	opts := map[string]any{"lenient": spec.Lenient}
	switch spec.Whitespace {
	case WhitespaceCompact:
		opts["whitespace_flexible"] = false
	case WhitespaceFlexible:
		opts["whitespace_flexible"] = true
	default:
		opts["whitespace_flexible"] = false
		opts["whitespace_pattern"] = fmt.Sprintf(`[\x20\x0A\x0D\x09]{1,%d}`, MaxJSONWhitespace)
	}
	xg, _ := json.Marshal(opts)
	rest := strings.TrimSpace(text[1:])
	sep := ","
	if strings.HasPrefix(rest, "}") {
		sep = ""
	}
	return `{"x-guidance":` + string(xg) + sep + rest
}

// Spec returns the spec the grammar was compiled from.
func (g *Grammar) Spec() Spec { return g.spec }

// Vocab returns the vocabulary the grammar was compiled for.
func (g *Grammar) Vocab() *Vocab { return g.vocab }

// NewMatcher starts a sequence under the grammar.
func (g *Grammar) NewMatcher() (*Matcher, error) {
	g.mu.Lock()
	p := C.llg_clone_matcher(g.tmpl)
	g.mu.Unlock()
	runtime.KeepAlive(g)
	if p == nil {
		return nil, errors.New("grammar: out of memory")
	}
	m := &Matcher{ptr: p, g: g, v: g.vocab, words: g.vocab.MaskWords()}
	m.cleanup = runtime.AddCleanup(m, func(p *C.LlgMatcher) { C.llg_free_matcher(p) }, p)
	return m, nil
}

// ErrNotAllowed is wrapped by Accept's error for a token the grammar does
// not allow (the matcher is unchanged and still usable).
var ErrNotAllowed = errors.New("token not allowed by the grammar")

// ErrClosed is returned by a closed Matcher.
var ErrClosed = errors.New("grammar: matcher is closed")

// Matcher follows one sequence through a grammar. It is not safe for
// concurrent use.
//
// States: running; done (Done: the grammar is complete, only EOS is
// allowed; the engine stops the sequence); dead after an internal error (Err
// is non-nil, every call fails; not reachable through Accept of a
// disallowed token, which only returns ErrNotAllowed).
type Matcher struct {
	ptr     *C.LlgMatcher
	g       *Grammar
	v       *Vocab
	words   int
	cleanup runtime.Cleanup
	// accepted counts the tokens given to llguidance (what it can roll
	// back); extraEOS the EOS tokens accepted after the grammar had already
	// stopped on its own: not given to llguidance (it refuses tokens once
	// stopped) but counted, so that Rollback removes them first.
	accepted int
	extraEOS int
}

// Grammar returns the grammar the matcher follows.
func (m *Matcher) Grammar() *Grammar { return m.g }

// FillMask writes the mask of allowed next tokens into dst (bit i%32 of
// dst[i/32] set = token i allowed); len(dst) must be MaskWords(VocabSize).
// Once Done, only the EOS ids are set. The mask is computed directly into
// dst (no intermediate Go copy).
func (m *Matcher) FillMask(dst []uint32) error {
	if m.ptr == nil {
		return ErrClosed
	}
	if len(dst) != m.words {
		return fmt.Errorf("grammar: mask has %d words, want %d", len(dst), m.words)
	}
	rc := C.llg_matcher_compute_mask_into(m.ptr, (*C.uint32_t)(unsafe.Pointer(&dst[0])), C.size_t(m.words*4))
	runtime.KeepAlive(m)
	if rc != 0 {
		return m.lastErr("compute mask")
	}
	// Padding ids: llguidance never allows these tokens of zero bytes in a
	// text lexeme, but a Lark <[a-b]> range could name them.
	var cleared uint32
	for id := m.v.tokSize; id < m.v.vocabSize; {
		w := id / 32
		if id%32 == 0 && id+32 <= m.v.vocabSize {
			cleared |= dst[w]
			dst[w] = 0
			id += 32
			continue
		}
		cleared |= dst[w] & (1 << (id % 32))
		dst[w] &^= 1 << (id % 32)
		id++
	}
	if cleared != 0 && !anyBelow(dst, m.v.tokSize) {
		return errors.New("grammar: only padding token ids are allowed here")
	}
	return nil
}

// anyBelow reports whether mask has a bit set for an id below n.
func anyBelow(mask []uint32, n int) bool {
	for w, bits := range mask {
		if w*32 >= n {
			return false
		}
		if w*32+32 > n {
			bits &= 1<<(n-w*32) - 1
		}
		if bits != 0 {
			return true
		}
	}
	return false
}

// Accept advances the matcher by the sampled token. A token the grammar
// does not allow returns an error wrapping ErrNotAllowed and leaves the
// matcher as it was. EOS is allowed when the grammar is complete (then
// Done); after Done, further EOS tokens are accepted and ignored.
func (m *Matcher) Accept(token int) error {
	if m.ptr == nil {
		return ErrClosed
	}
	if token < 0 || token >= m.v.vocabSize {
		return fmt.Errorf("grammar: token %d out of range [0,%d): %w", token, m.v.vocabSize, ErrNotAllowed)
	}
	if m.v.isEOS(token) && m.Done() {
		m.extraEOS++
		return nil
	}
	if token >= m.v.tokSize {
		return fmt.Errorf("grammar: padding token %d: %w", token, ErrNotAllowed)
	}
	t := C.uint32_t(token)
	n := C.llg_matcher_validate_tokens(m.ptr, &t, 1)
	runtime.KeepAlive(m)
	if n < 0 {
		return m.lastErr("accept")
	}
	if n == 0 {
		if m.Done() {
			return fmt.Errorf("grammar: token %d after the grammar is complete: %w", token, ErrNotAllowed)
		}
		return fmt.Errorf("grammar: token %d: %w", token, ErrNotAllowed)
	}
	rc := C.llg_matcher_consume_token(m.ptr, t)
	runtime.KeepAlive(m)
	if rc != 0 {
		return m.lastErr("accept")
	}
	m.accepted++
	return nil
}

// ValidPrefix returns how many of tokens, from the first, the grammar would
// accept in turn from the current state (e.g. speculative draft tokens),
// without changing the matcher. An EOS counts when the output before it is
// complete, and nothing after it counts; once Done, only EOS tokens count.
func (m *Matcher) ValidPrefix(tokens []int) (int, error) {
	if m.ptr == nil {
		return 0, ErrClosed
	}
	if m.Done() {
		n := 0
		for n < len(tokens) && m.v.isEOS(tokens[n]) {
			n++
		}
		return n, nil
	}
	buf := make([]C.uint32_t, 0, len(tokens))
	for _, t := range tokens {
		if t < 0 || t >= m.v.tokSize && !m.v.isEOS(t) {
			break // never allowed; llguidance would fail on an id past its vocabulary
		}
		buf = append(buf, C.uint32_t(t))
		if m.v.isEOS(t) {
			break
		}
	}
	if len(buf) == 0 {
		return 0, nil
	}
	n := C.llg_matcher_validate_tokens(m.ptr, &buf[0], C.size_t(len(buf)))
	runtime.KeepAlive(m)
	if n < 0 {
		return 0, m.lastErr("validate")
	}
	return int(n), nil
}

// Done reports whether the grammar is complete and allows nothing more but
// EOS: the engine stops the sequence (with or without sampling EOS).
func (m *Matcher) Done() bool {
	if m.ptr == nil {
		return false
	}
	stopped := bool(C.llg_matcher_is_stopped(m.ptr)) && !bool(C.llg_matcher_is_error(m.ptr))
	runtime.KeepAlive(m)
	return stopped
}

// Accepting reports whether the output so far is a complete match (EOS is
// allowed now), though the grammar may allow more (e.g. more digits). For
// a sequence cut short by max_tokens: its output is valid only if
// Accepting.
func (m *Matcher) Accepting() bool {
	if m.ptr == nil {
		return false
	}
	if m.Done() {
		return true
	}
	ok := bool(C.llg_matcher_is_accepting(m.ptr))
	runtime.KeepAlive(m)
	return ok
}

// Err returns the error that killed the matcher, or nil.
func (m *Matcher) Err() error {
	if m.ptr == nil {
		return ErrClosed
	}
	if !bool(C.llg_matcher_is_error(m.ptr)) {
		return nil
	}
	return m.lastErr("matcher")
}

func (m *Matcher) lastErr(op string) error {
	msg := C.llg_matcher_get_error(m.ptr)
	runtime.KeepAlive(m)
	if msg == nil {
		return fmt.Errorf("grammar: %s failed", op)
	}
	return fmt.Errorf("grammar: %s: %s", op, C.GoString(msg))
}

// Rollback undoes the last n accepted tokens (EOS included), e.g. rejected
// speculative tokens. A finished grammar becomes unfinished again. Rolling
// back more tokens than were accepted is an error that changes nothing.
func (m *Matcher) Rollback(n int) error {
	if m.ptr == nil {
		return ErrClosed
	}
	if n < 0 || n > m.accepted+m.extraEOS {
		return fmt.Errorf("grammar: rollback of %d tokens, %d accepted", n, m.accepted+m.extraEOS)
	}
	k := min(n, m.extraEOS)
	m.extraEOS -= k
	n -= k
	if n == 0 {
		return nil
	}
	rc := C.llg_matcher_rollback(m.ptr, C.size_t(n))
	runtime.KeepAlive(m)
	if rc != 0 {
		return m.lastErr("rollback")
	}
	m.accepted -= n
	return nil
}

// Len is the number of tokens accepted so far (what Rollback can undo).
func (m *Matcher) Len() int { return m.accepted + m.extraEOS }

// Reset returns the matcher to the start of the grammar.
func (m *Matcher) Reset() error {
	if m.ptr == nil {
		return ErrClosed
	}
	rc := C.llg_matcher_reset(m.ptr)
	runtime.KeepAlive(m)
	if rc != 0 {
		return m.lastErr("reset")
	}
	m.accepted, m.extraEOS = 0, 0
	return nil
}

// Close frees the matcher's C memory. Closing twice is harmless; every
// other method of a closed matcher fails with ErrClosed (Done and
// Accepting report false).
func (m *Matcher) Close() {
	if m.ptr == nil {
		return
	}
	m.cleanup.Stop()
	C.llg_free_matcher(m.ptr)
	m.ptr = nil
}
