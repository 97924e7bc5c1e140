package cpu

// SetMTPHook makes every later Step hand the MTP layer's draft logits of
// each (sequence, position) pair it runs over (docs/speculative.md, step 3)
// to f, before proposals. Tests only.
func SetMTPHook(b *Backend, f func(seq uint64, pos int, logits []float32)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.mtpHook = f
}
