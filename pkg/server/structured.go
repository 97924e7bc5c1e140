package server

import (
	"errors"
	"fmt"

	"github.com/glmctl/glmctl/pkg/engine"
	"github.com/glmctl/glmctl/pkg/grammar"
	"github.com/glmctl/glmctl/pkg/server/openai"
)

// Structured outputs: a request's format (openai.Format) is compiled into a
// grammar over the model's vocabulary (Options.Grammar), and every engine
// request of it gets a matcher of its own (grammarConstraint).

// toGrammarSpec converts a request format to the grammar library's spec.
func toGrammarSpec(f *openai.Format) (grammar.Spec, error) {
	switch f.Kind {
	case openai.FormatJSONObject:
		return grammar.Spec{Kind: grammar.JSONObject}, nil
	case openai.FormatJSONSchema:
		return grammar.Spec{Kind: grammar.JSONSchema, Text: string(f.Schema)}, nil
	case openai.FormatRegex:
		return grammar.Spec{Kind: grammar.Regex, Text: f.Pattern}, nil
	case openai.FormatGrammar:
		return grammar.Spec{Kind: grammar.Lark, Text: f.Grammar}, nil
	}
	return grammar.Spec{}, fmt.Errorf("unknown format kind %q", f.Kind)
}

// compileFormat compiles a request's format (nil: none), as a 400 naming the
// field when the server has no grammar support or the format does not
// compile.
func (s *Server) compileFormat(f *openai.Format) (*grammar.Grammar, *openai.Error) {
	if f == nil {
		return nil, nil
	}
	if s.opts.Grammar == nil {
		return nil, openai.BadRequest(f.Param, "%s: structured outputs are not available: the server has no grammar vocabulary for this model", f.Param)
	}
	spec, err := toGrammarSpec(f)
	if err != nil {
		return nil, openai.BadRequest(f.Param, "%s: %v", f.Param, err)
	}
	g, err := s.opts.Grammar.Compile(spec)
	if err != nil {
		return nil, openai.BadRequest(f.Param, "%s: %v", f.Param, err)
	}
	return g, nil
}

// requestFormat is the format a request's answer is held to: its own
// (format, nil for free text), or for a forced tool call (forced; only names
// the one tool, "" for any) GLM-4.7's tool-call grammar over tools. The
// three APIs share it; choice is their tool_choice value, for the message.
func requestFormat(format *openai.Format, forced bool, choice string, tools []openai.Tool, only string) (*openai.Format, *openai.Error) {
	if !forced {
		return format, nil
	}
	if format != nil {
		return nil, openai.BadRequest("tool_choice", "tool_choice %q forces a tool call and %s constrains the answer: give one of them", choice, format.Param)
	}
	lark, err := toolCallGrammar(tools, only)
	if err != nil {
		return nil, openai.BadRequest("tools", "tools: %v", err)
	}
	return &openai.Format{Kind: openai.FormatGrammar, Grammar: lark, Param: "tool_choice"}, nil
}

// grammarConstraint is one engine request's engine.Constraint: a matcher of
// the request's grammar, created at the first mask (so a request that is
// never submitted holds no matcher).
type grammarConstraint struct {
	g *grammar.Grammar
	m *grammar.Matcher
}

func newGrammarConstraint(g *grammar.Grammar) engine.Constraint {
	if g == nil {
		return nil
	}
	return &grammarConstraint{g: g}
}

func (c *grammarConstraint) FillMask(dst []uint32) error {
	if c.m == nil {
		m, err := c.g.NewMatcher()
		if err != nil {
			return err
		}
		c.m = m
	}
	return c.m.FillMask(dst)
}

func (c *grammarConstraint) Accept(tok int32) error {
	if c.m == nil {
		return errors.New("token accepted before the first mask")
	}
	return c.m.Accept(int(tok))
}

func (c *grammarConstraint) Done() bool { return c.m != nil && c.m.Done() }

func (c *grammarConstraint) Close() {
	if c.m != nil {
		c.m.Close()
	}
}

// fresh returns a constraint of the same grammar with no state, for another
// choice of the same request (nil for nil).
func freshConstraint(c engine.Constraint) engine.Constraint {
	if gc, ok := c.(*grammarConstraint); ok {
		return &grammarConstraint{g: gc.g}
	}
	return c
}
