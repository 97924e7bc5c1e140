// Package golden loads golden files (reference outputs of Hugging Face
// transformers on a checkpoint; docs/golden.md) and checks any
// engine.Backend against them: last-position logits of each prompt, then
// teacher-forced greedy decoding through the backend's KV cache.
package golden

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
)

// File is one golden file.
type File struct {
	Model     string `json:"model"`     // base name of the model directory it was made for
	Reference string `json:"reference"` // what produced it
	// Numerics is the arithmetic the reference computed: NumericsFloat32
	// (absent in the file: transformers in float32 with dequantized weights)
	// or NumericsFP8GPU (the GPU's FP8 path, scripts/make_fp8_golden.py).
	Numerics string `json:"numerics,omitempty"`
	Cases    []Case `json:"cases"`

	// Path is where the file was loaded from (not part of the JSON).
	Path string `json:"-"`
}

// The arithmetic of a golden file's reference (File.Numerics).
const (
	NumericsFloat32 = ""
	NumericsFP8GPU  = "fp8-gpu"
)

// Case is one prompt with its reference outputs.
type Case struct {
	PromptTokenIDs []int32   `json:"prompt_token_ids"`
	LastLogits     []float32 `json:"last_logits"`      // logits at the last prompt position
	GreedyTokenIDs []int32   `json:"greedy_token_ids"` // teacher-forced greedy continuation
	GreedyMargins  []float32 `json:"greedy_margins"`   // top-1 minus top-2 logit at each greedy step
}

// VocabSize is the length of every case's last_logits (Load checks that they
// agree).
func (f *File) VocabSize() int {
	if len(f.Cases) == 0 {
		return 0
	}
	return len(f.Cases[0].LastLogits)
}

// Load reads and validates a golden file.
func Load(path string) (*File, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read golden file: %w", err)
	}
	f, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("golden file %s: %w", path, err)
	}
	f.Path = path
	return f, nil
}

// rawFile mirrors File with pointer fields so that absent keys are told
// apart from empty values.
type rawFile struct {
	Model     *string    `json:"model"`
	Reference *string    `json:"reference"`
	Numerics  *string    `json:"numerics"`
	Cases     *[]rawCase `json:"cases"`
}

type rawCase struct {
	PromptTokenIDs *[]int32   `json:"prompt_token_ids"`
	LastLogits     *[]float32 `json:"last_logits"`
	GreedyTokenIDs *[]int32   `json:"greedy_token_ids"`
	GreedyMargins  *[]float32 `json:"greedy_margins"`
}

// Parse decodes and validates a golden document: the exact keys model,
// reference, optionally numerics, and cases[] with prompt_token_ids, last_logits,
// greedy_token_ids and greedy_margins; unknown keys are rejected.
func Parse(b []byte) (*File, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var raw rawFile
	if err := dec.Decode(&raw); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return nil, fmt.Errorf("field %q: want %s, got JSON %s", te.Field, te.Type, te.Value)
		}
		return nil, fmt.Errorf("parse JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("parse JSON: trailing data after the top-level object")
	}
	switch {
	case raw.Model == nil || *raw.Model == "":
		return nil, errors.New(`field "model": missing or empty`)
	case raw.Reference == nil:
		return nil, errors.New(`field "reference": missing`)
	case raw.Cases == nil || len(*raw.Cases) == 0:
		return nil, errors.New(`field "cases": missing or empty`)
	}
	f := &File{Model: *raw.Model, Reference: *raw.Reference}
	if raw.Numerics != nil {
		switch *raw.Numerics {
		case NumericsFP8GPU:
			f.Numerics = *raw.Numerics
		default:
			return nil, fmt.Errorf(`field "numerics": %q is not a known reference arithmetic (want %q, or no field for float32)`, *raw.Numerics, NumericsFP8GPU)
		}
	}
	vocab := 0
	for i, rc := range *raw.Cases {
		c, err := checkCase(rc)
		if err != nil {
			return nil, fmt.Errorf("cases[%d]: %w", i, err)
		}
		if i == 0 {
			vocab = len(c.LastLogits)
		} else if len(c.LastLogits) != vocab {
			return nil, fmt.Errorf("cases[%d].last_logits: %d values, but cases[0] has %d", i, len(c.LastLogits), vocab)
		}
		f.Cases = append(f.Cases, c)
	}
	for i, c := range f.Cases {
		for j, t := range c.PromptTokenIDs {
			if int(t) >= vocab {
				return nil, fmt.Errorf("cases[%d].prompt_token_ids[%d]: %d is outside the vocabulary of %d logits", i, j, t, vocab)
			}
		}
		for j, t := range c.GreedyTokenIDs {
			if int(t) >= vocab {
				return nil, fmt.Errorf("cases[%d].greedy_token_ids[%d]: %d is outside the vocabulary of %d logits", i, j, t, vocab)
			}
		}
	}
	return f, nil
}

func checkCase(rc rawCase) (Case, error) {
	switch {
	case rc.PromptTokenIDs == nil || len(*rc.PromptTokenIDs) == 0:
		return Case{}, errors.New(`field "prompt_token_ids": missing or empty`)
	case rc.LastLogits == nil || len(*rc.LastLogits) == 0:
		return Case{}, errors.New(`field "last_logits": missing or empty`)
	case rc.GreedyTokenIDs == nil:
		return Case{}, errors.New(`field "greedy_token_ids": missing`)
	case rc.GreedyMargins == nil:
		return Case{}, errors.New(`field "greedy_margins": missing`)
	}
	c := Case{
		PromptTokenIDs: *rc.PromptTokenIDs,
		LastLogits:     *rc.LastLogits,
		GreedyTokenIDs: *rc.GreedyTokenIDs,
		GreedyMargins:  *rc.GreedyMargins,
	}
	if len(c.GreedyMargins) != len(c.GreedyTokenIDs) {
		return Case{}, fmt.Errorf("greedy_margins has %d values for %d greedy_token_ids", len(c.GreedyMargins), len(c.GreedyTokenIDs))
	}
	for j, t := range c.PromptTokenIDs {
		if t < 0 {
			return Case{}, fmt.Errorf("prompt_token_ids[%d]: %d is negative", j, t)
		}
	}
	for j, t := range c.GreedyTokenIDs {
		if t < 0 {
			return Case{}, fmt.Errorf("greedy_token_ids[%d]: %d is negative", j, t)
		}
	}
	for j, m := range c.GreedyMargins {
		if m < 0 || math.IsNaN(float64(m)) {
			return Case{}, fmt.Errorf("greedy_margins[%d]: %v is not a top-1 minus top-2 margin (must be >= 0)", j, m)
		}
	}
	for j, v := range c.LastLogits {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return Case{}, fmt.Errorf("last_logits[%d]: %v is not finite", j, v)
		}
	}
	return c, nil
}
