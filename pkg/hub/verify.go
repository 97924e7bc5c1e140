package hub

import (
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"strconv"
)

// checksumError is a file whose content does not match the listing.
type checksumError struct {
	file, kind, got, want string
}

func (e *checksumError) Error() string {
	return fmt.Sprintf("%s: %s mismatch: got %s, the listing says %s", e.file, e.kind, e.got, e.want)
}

// verifier hashes a file's bytes as they arrive: sha256 for LFS files (the
// weights), the git blob id (sha1 of "blob <size>\0" + content) for the
// others.
type verifier struct {
	f    RepoFile
	h    hash.Hash
	kind string
	want string
}

func newVerifier(f RepoFile) *verifier {
	v := &verifier{f: f}
	v.Reset()
	return v
}

// Reset starts over from the first byte.
func (v *verifier) Reset() {
	if v.f.SHA256 != "" {
		v.h, v.kind, v.want = sha256.New(), "sha256", v.f.SHA256
		return
	}
	v.h, v.kind, v.want = sha1.New(), "git blob id", v.f.GitOID
	v.h.Write([]byte("blob " + strconv.FormatInt(v.f.Size, 10) + "\x00"))
}

func (v *verifier) Write(p []byte) (int, error) { return v.h.Write(p) }

// check compares the hash of everything written with the listing's.
func (v *verifier) check(file string) error {
	got := hex.EncodeToString(v.h.Sum(nil))
	if got != v.want {
		return &checksumError{file: file, kind: v.kind, got: got, want: v.want}
	}
	return nil
}

// GitBlobID is the git object id of a blob: what the hub lists (blobId) and
// sends as ETag for files not stored in LFS.
func GitBlobID(content []byte) string {
	h := sha1.New()
	h.Write([]byte("blob " + strconv.Itoa(len(content)) + "\x00"))
	h.Write(content)
	return hex.EncodeToString(h.Sum(nil))
}
