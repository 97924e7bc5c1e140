package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"sync"
)

// Prompt is one request's input.
type Prompt struct {
	Text string `json:"-"`
	// Tokens is the prompt's length counted by the server's /tokenize (0 =
	// not counted). For chat requests it counts the message content, not
	// the chat template around it.
	Tokens    int `json:"tokens"`
	OutputLen int `json:"output_len"` // max_tokens
}

// DatasetEntry is one record of a prompts file.
type DatasetEntry struct {
	Prompt    string
	OutputLen int    // from "output_len" or "max_tokens"; 0 = not given
	Reply     string // a ShareGPT conversation's reply, whose length sets OutputLen when it can be counted
}

// MaxDatasetBytes bounds a prompts file.
const MaxDatasetBytes = 1 << 30

type datasetWire struct {
	Prompt        *string `json:"prompt"`
	OutputLen     *int    `json:"output_len"`
	MaxTokens     *int    `json:"max_tokens"`
	Conversations []struct {
		From    string `json:"from"`
		Role    string `json:"role"`
		Value   string `json:"value"`
		Content string `json:"content"`
	} `json:"conversations"`
}

// ReadDataset reads a prompts file: JSON Lines of {"prompt": "...",
// "output_len"?: n} or ShareGPT-style {"conversations": [{"from": "human",
// "value": ...}, {"from": "gpt", "value": ...}]}, or a JSON array of such
// objects (the ShareGPT files are one). A conversation without a human turn
// is skipped; a file with no usable entry is an error.
func ReadDataset(path string) ([]DatasetEntry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--dataset: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxDatasetBytes+1))
	if err != nil {
		return nil, fmt.Errorf("--dataset %s: %w", path, err)
	}
	if len(data) > MaxDatasetBytes {
		return nil, fmt.Errorf("--dataset %s: larger than %d bytes", path, MaxDatasetBytes)
	}
	return ParseDataset(path, data)
}

// ParseDataset parses the content of a prompts file (see ReadDataset);
// name labels errors.
func ParseDataset(name string, data []byte) ([]DatasetEntry, error) {
	data = bytes.TrimSpace(data)
	var records []json.RawMessage
	var lines []int // line number of each record (JSON Lines), for errors
	if len(data) > 0 && data[0] == '[' {
		if err := json.Unmarshal(data, &records); err != nil {
			return nil, fmt.Errorf("--dataset %s: not a JSON array of objects: %v", name, err)
		}
	} else {
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		for n := 1; sc.Scan(); n++ {
			line := bytes.TrimSpace(sc.Bytes())
			if len(line) == 0 {
				continue
			}
			records = append(records, json.RawMessage(bytes.Clone(line)))
			lines = append(lines, n)
		}
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("--dataset %s: %w", name, err)
		}
	}
	where := func(i int) string {
		if lines != nil {
			return fmt.Sprintf("line %d", lines[i])
		}
		return fmt.Sprintf("entry %d", i)
	}
	var out []DatasetEntry
	for i, raw := range records {
		var w datasetWire
		if err := json.Unmarshal(raw, &w); err != nil {
			return nil, fmt.Errorf("--dataset %s, %s: want a JSON object with \"prompt\" or \"conversations\": %v", name, where(i), err)
		}
		e := DatasetEntry{}
		switch {
		case w.Prompt != nil:
			e.Prompt = *w.Prompt
		case w.Conversations != nil:
			human := -1
			for j, turn := range w.Conversations {
				if from := strings.ToLower(turn.From + turn.Role); from == "human" || from == "user" {
					human = j
					break
				}
			}
			if human < 0 {
				continue // no question to ask
			}
			turn := w.Conversations[human]
			e.Prompt = turn.Value + turn.Content
			if human+1 < len(w.Conversations) {
				next := w.Conversations[human+1]
				e.Reply = next.Value + next.Content
			}
		default:
			return nil, fmt.Errorf("--dataset %s, %s: the object has neither \"prompt\" nor \"conversations\"", name, where(i))
		}
		for _, p := range []*int{w.OutputLen, w.MaxTokens} {
			if p != nil && e.OutputLen == 0 {
				if *p < 1 {
					return nil, fmt.Errorf("--dataset %s, %s: output length %d must be >= 1", name, where(i), *p)
				}
				e.OutputLen = *p
			}
		}
		if e.Prompt == "" {
			continue
		}
		out = append(out, e)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--dataset %s: no usable prompt (want {\"prompt\": ...} or {\"conversations\": [{\"from\": \"human\", \"value\": ...}]} records)", name)
	}
	return out, nil
}

// tokenizer counts tokens through the server's /tokenize and /detokenize:
// vLLM's and glmctl's shape ({"prompt"} → {"tokens", "count"}), or
// llama-server's ({"content"} → {"tokens"}).
type tokenizer struct {
	c          *client
	field      string // "prompt" or "content"; "" = no /tokenize
	detokenize bool
}

// probeTokenizer finds out whether the server can count tokens.
func probeTokenizer(ctx context.Context, c *client) *tokenizer {
	t := &tokenizer{c: c}
	for _, field := range []string{"prompt", "content"} {
		t.field = field
		if ids, err := t.tokenize(ctx, "hello world"); err == nil && len(ids) > 0 {
			if text, err := t.detok(ctx, ids); err == nil && strings.Contains(text, "world") {
				t.detokenize = true
			}
			return t
		}
	}
	t.field = ""
	return t
}

func (t *tokenizer) post(ctx context.Context, path string, body any, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := t.c.newRequest(ctx, http.MethodPost, path, b)
	if err != nil {
		return err
	}
	resp, err := t.c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: HTTP %d: %s", path, resp.StatusCode, errorMessage(data))
	}
	return json.Unmarshal(data, out)
}

func (t *tokenizer) tokenize(ctx context.Context, text string) ([]int64, error) {
	var out struct {
		Tokens []int64 `json:"tokens"`
	}
	body := map[string]any{t.field: text}
	if t.c.model != "" {
		body["model"] = t.c.model
	}
	if err := t.post(ctx, "/tokenize", body, &out); err != nil {
		return nil, err
	}
	return out.Tokens, nil
}

func (t *tokenizer) detok(ctx context.Context, ids []int64) (string, error) {
	var out struct {
		Prompt  *string `json:"prompt"`
		Content *string `json:"content"`
	}
	body := map[string]any{"tokens": ids}
	if t.c.model != "" {
		body["model"] = t.c.model
	}
	if err := t.post(ctx, "/detokenize", body, &out); err != nil {
		return "", err
	}
	switch {
	case out.Prompt != nil:
		return *out.Prompt, nil
	case out.Content != nil:
		return *out.Content, nil
	}
	return "", errors.New("/detokenize: the answer has neither \"prompt\" nor \"content\"")
}

func (t *tokenizer) count(ctx context.Context, text string) (int, error) {
	ids, err := t.tokenize(ctx, text)
	return len(ids), err
}

// words make random prompts: common English words, mostly one token each in
// large vocabularies.
var words = strings.Fields(`the of and to in is that for it as was with be by on not he this are or his
from at which but have an they you were her she there one all we their has been would more if will when
who so no out up into time them some could than other then now only its like over also new two may any
these first after most made well very through where much before good great year just back man me make
such know take people world water long day life little house under last right never place same another
while number part found think small still city left end home light read hand large play point turn real
between both open state change move often line name tell sea might river group follow book near word
above face run ask music color field voice power town fine drive lead cry dark machine note wait plan
figure star box noun rest able pound done beauty stood contain front teach week final gave green quick`)

// lengthIn draws a length uniformly from [l·(1−r), l·(1+r)], at least 1.
func lengthIn(rng *rand.Rand, l int, r float64) int {
	if r <= 0 {
		return l
	}
	lo := max(1, int(math.Floor(float64(l)*(1-r))))
	hi := max(lo, int(math.Ceil(float64(l)*(1+r))))
	return lo + rng.IntN(hi-lo+1)
}

func randomWords(rng *rand.Rand, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = words[rng.IntN(len(words))]
	}
	return out
}

// randomPrompt makes a prompt of about target tokens from random words. With
// /tokenize and /detokenize it is cut to exactly target tokens (as the
// server counts them; re-tokenizing the cut text may differ by a token at the
// seam, and Tokens says what it came to); with /tokenize alone words are
// dropped until it fits; without either it is target words, uncounted.
func (t *tokenizer) randomPrompt(ctx context.Context, rng *rand.Rand, target int) (string, int, error) {
	ws := randomWords(rng, target)
	if t.field == "" {
		return strings.Join(ws, " "), 0, nil
	}
	var ids []int64
	for range 16 {
		var err error
		if ids, err = t.tokenize(ctx, strings.Join(ws, " ")); err != nil {
			return "", 0, err
		}
		if len(ids) >= target {
			break
		}
		ws = append(ws, randomWords(rng, target-len(ids)+2)...)
	}
	if len(ids) < target {
		return "", 0, fmt.Errorf("could not make a prompt of %d tokens (got %d)", target, len(ids))
	}
	if t.detokenize {
		text, err := t.detok(ctx, ids[:target])
		if err != nil {
			return "", 0, err
		}
		n, err := t.count(ctx, text)
		return text, n, err
	}
	n := len(ids)
	for range 16 {
		if n <= target || len(ws) <= 1 {
			break
		}
		drop := max(1, (n-target)*len(ws)/n)
		ws = ws[:max(1, len(ws)-drop)]
		var err error
		if n, err = t.count(ctx, strings.Join(ws, " ")); err != nil {
			return "", 0, err
		}
	}
	return strings.Join(ws, " "), n, nil
}

// promptSource makes the prompts of the runs.
type promptSource struct {
	tok        *tokenizer
	dataset    []DatasetEntry
	order      []int // shuffled dataset indices
	next       int   // next dataset entry
	inputLen   int
	outputLen  int
	rangeRatio float64
	overrideOL bool // --output-len set: it beats the dataset's lengths
	seed       int64
}

// prompts makes n prompts for run runIndex (seeded per prompt), counting
// them through the server with a few requests in parallel.
func (s *promptSource) prompts(ctx context.Context, n int, runIndex uint64) ([]Prompt, error) {
	out := make([]Prompt, n)
	entries := make([]int, n)
	for i := range entries {
		if len(s.dataset) > 0 {
			entries[i] = s.order[s.next%len(s.order)]
			s.next++
		}
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		jobs  = make(chan int)
	)
	for range 8 {
		wg.Go(func() {
			for i := range jobs {
				if err := s.one(ctx, &out[i], entries[i], runIndex, i); err != nil {
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("prompt %d: %w", i, err)
					}
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	return out, first
}

func (s *promptSource) one(ctx context.Context, p *Prompt, entry int, runIndex uint64, i int) error {
	rng := rand.New(rand.NewPCG(uint64(s.seed)^runIndex<<40, uint64(i)))
	p.OutputLen = lengthIn(rng, s.outputLen, s.rangeRatio)
	if len(s.dataset) == 0 {
		text, n, err := s.tok.randomPrompt(ctx, rng, lengthIn(rng, s.inputLen, s.rangeRatio))
		p.Text, p.Tokens = text, n
		return err
	}
	e := s.dataset[entry]
	p.Text = e.Prompt
	if s.tok.field != "" {
		n, err := s.tok.count(ctx, e.Prompt)
		if err != nil {
			return err
		}
		p.Tokens = n
	}
	if s.overrideOL {
		return nil
	}
	switch {
	case e.OutputLen > 0:
		p.OutputLen = e.OutputLen
	case e.Reply != "" && s.tok.field != "":
		n, err := s.tok.count(ctx, e.Reply)
		if err != nil {
			return err
		}
		p.OutputLen = max(2, n)
	}
	return nil
}
