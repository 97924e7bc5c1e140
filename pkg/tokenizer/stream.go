package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// StreamDecoder turns ids arriving one at a time into text pieces that are
// always whole UTF-8 characters: a character whose bytes are spread over
// several byte-level tokens comes out once its last byte has arrived.
//
// It decodes a small window of ids (the previous piece's ids plus the new
// ones) and emits the part past the previous piece, holding it back while it
// ends in U+FFFD, which is what the decoder makes of an incomplete byte
// sequence. This is the prefix/read-offset scheme of Hugging Face's
// text-generation-inference and vLLM; the window keeps decoders that treat a
// sequence's first token specially (a leading space) consistent.
//
// A StreamDecoder is not safe for concurrent use.
type StreamDecoder struct {
	tok         Tokenizer
	skipSpecial bool
	ids         []int32
	prefix      int // start of the window
	read        int // end of what was emitted
}

// NewStreamDecoder returns a decoder for one output sequence.
func NewStreamDecoder(tok Tokenizer, skipSpecial bool) *StreamDecoder {
	return &StreamDecoder{tok: tok, skipSpecial: skipSpecial}
}

// Add takes the next id and returns the text it completes, possibly empty.
func (d *StreamDecoder) Add(id int32) (string, error) {
	d.ids = append(d.ids, id)
	prev, err := d.tok.Decode(d.ids[d.prefix:d.read], d.skipSpecial)
	if err != nil {
		return "", err
	}
	cur, err := d.tok.Decode(d.ids[d.prefix:], d.skipSpecial)
	if err != nil {
		return "", err
	}
	pending := strings.HasSuffix(cur, "\uFFFD")
	if pending && len(d.ids)-d.read >= maxPendingIDs {
		// Too long a run ending in U+FFFD: emit what is surely final and
		// keep only the last few ids pending.
		return d.emitStable(prev, cur)
	}
	if len(cur) <= len(prev) || pending {
		if cur == prev && !pending {
			// The new ids made no text (skipped specials, ids past the
			// vocabulary): nothing is pending, so slide the window instead
			// of letting it grow with every such id.
			d.read = len(d.ids)
			d.prefix = max(d.prefix, d.read-1)
			d.compact()
		}
		return "", nil
	}
	out := cur[commonPrefix(prev, cur):]
	d.prefix, d.read = d.read, len(d.ids)
	d.compact()
	return out, nil
}

// maxPendingIDs bounds how long text ending in U+FFFD is held back. A real
// character needs at most 4 byte-level tokens; a longer run is invalid
// output, which is then emitted (as U+FFFD, still valid UTF-8) rather than
// re-decoded ever longer — all of it but its last ids (emitStable).
const maxPendingIDs = 16

// holdIDs is how many trailing text-producing ids emitStable keeps pending
// at least when no shorter cut ends on a whole character: an incomplete
// character is at most 3 bytes, one byte-level token or more each. Ids that
// make no text (skipped specials) do not count: a character's lead byte may
// sit behind any number of them.
const holdIDs = 4

// maxCutSearch bounds how far back emitStable looks for a cut, so a long run
// of ids that make no text costs a bounded number of decodes per id.
const maxCutSearch = 64

// emitStable emits the longest part of a long pending run that later ids
// cannot change, and keeps the rest pending. Emitting the whole run would
// be wrong when its trailing U+FFFD is an incomplete character that the next
// ids complete (the whole decode then shows the character, not U+FFFD). A
// cut after a whole character (text not ending in U+FFFD) is final; failing
// that, the cut that leaves holdIDs text-producing ids pending (a run of
// invalid bytes: the U+FFFDs before them are final).
func (d *StreamDecoder) emitStable(prev, cur string) (string, error) {
	n := len(d.ids)
	cut, text := -1, ""
	textIDs, after := 0, cur // text-producing ids past the cut; decode up to the previous cut
	for j := 1; j <= maxCutSearch && n-j > d.read; j++ {
		t, err := d.tok.Decode(d.ids[d.prefix:n-j], d.skipSpecial)
		if err != nil {
			return "", err
		}
		if t != after {
			textIDs++ // id n-j made text
		}
		after = t
		if len(t) <= len(prev) || !strings.HasPrefix(cur, t) {
			continue
		}
		if !strings.HasSuffix(t, "\uFFFD") || textIDs >= holdIDs {
			cut, text = n-j, t
			break
		}
	}
	if cut < 0 {
		if cur == prev {
			// The run added no text (skipped specials, ids past the
			// vocabulary after a U+FFFD already out): slide the window.
			d.read = n
			d.prefix = max(d.prefix, d.read-1)
			d.compact()
		}
		return "", nil // else keep holding; a later id makes a cut possible
	}
	out := text[commonPrefix(prev, text):]
	d.prefix, d.read = d.read, cut
	d.compact()
	return out, nil
}

// Flush returns whatever is held back (an incomplete character comes out as
// U+FFFD, as a whole decode would give it) and starts a new sequence.
func (d *StreamDecoder) Flush() (string, error) {
	prev, err := d.tok.Decode(d.ids[d.prefix:d.read], d.skipSpecial)
	if err != nil {
		return "", err
	}
	cur, err := d.tok.Decode(d.ids[d.prefix:], d.skipSpecial)
	if err != nil {
		return "", err
	}
	d.ids, d.prefix, d.read = d.ids[:0], 0, 0
	if len(cur) <= len(prev) {
		return "", nil
	}
	return cur[commonPrefix(prev, cur):], nil
}

// compact drops ids before the window so a long sequence keeps a small
// buffer.
func (d *StreamDecoder) compact() {
	if d.prefix < 1024 {
		return
	}
	n := copy(d.ids, d.ids[d.prefix:])
	d.ids = d.ids[:n]
	d.read -= d.prefix
	d.prefix = 0
}

// commonPrefix is the length of the longest common prefix of a and b that
// ends on a character boundary of b. For byte-level decoders prev is always a
// prefix of cur; this keeps other decoders from emitting a cut character.
func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	for n > 0 && n < len(b) && !utf8.RuneStart(b[n]) {
		n--
	}
	return n
}
