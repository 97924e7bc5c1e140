package model

import "github.com/glmctl/glmctl/pkg/safetensors"

// OpenBound opens the safetensors checkpoint in dir (every shard present
// and mapped) and binds its tensors to cfg's architecture: the first step of
// loading for both backends (and of weightcheck.CheckDir). The error is the
// checkpoint's (naming the file); the binding is returned whether or not it
// has problems, which Binding.Err reports and the caller words. The caller
// closes the checkpoint.
func OpenBound(dir string, cfg *Config) (*safetensors.Checkpoint, *Binding, error) {
	ck, err := safetensors.Open(dir, safetensors.OpenOptions{})
	if err != nil {
		return nil, nil, err
	}
	return ck, Bind(cfg, ck.Tensors), nil
}
