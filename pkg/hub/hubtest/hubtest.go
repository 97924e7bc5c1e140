// Package hubtest is a fake Hugging Face hub on loopback for tests. It
// serves the shapes of the real API that glmctl and huggingface_hub use —
// GET /api/models/{repo}/revision/{rev}?blobs=True with siblings, sizes,
// git blob ids and LFS sha256; /{repo}/resolve/{rev}/{path} answering small
// files itself and redirecting LFS files to a "CDN" path; Range requests;
// X-Repo-Commit, ETag, X-Linked-Etag, X-Linked-Size; X-Error-Code
// RepoNotFound, RevisionNotFound, EntryNotFound and GatedRepo with the
// status codes the hub uses — and faults to inject: dropped connections,
// stalls, corrupted bytes, server errors, ignored Range headers.
package hubtest

import (
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// File is a file of a commit. LFS files are listed with their sha256 and
// served through the CDN redirect, as the hub does for weights.
type File struct {
	Path string
	Data []byte
	LFS  bool
}

// Fault changes how a file's bytes are served (the GETs of its content:
// the resolve URL of a small file, the CDN URL of an LFS file).
type Fault struct {
	// Times is how many requests it applies to; 0 = all.
	Times int
	// Status answers with this HTTP status instead of the content.
	Status int
	// DropAfter > 0 sends that many bytes of the body, then closes the
	// connection (the response announced more).
	DropAfter int64
	// HangAfter > 0 sends that many bytes, then sends nothing more until
	// the client goes away.
	HangAfter int64
	// Corrupt flips one byte of the content (the listing keeps the true
	// checksum).
	Corrupt bool
}

// Request is a request the server saw.
type Request struct {
	Method string
	Path   string // unescaped URL path
	Range  string // the Range header
	Auth   string // the Authorization header
}

// Server is the fake hub; its URL is what HF_ENDPOINT should be.
type Server struct {
	*httptest.Server

	// NoRange makes file GETs ignore Range headers (200 with everything).
	NoRange bool
	// MinimalListing lists only file names (no sizes, blob ids or LFS
	// data) even when asked for blobs, like a minimal mirror: the client
	// must HEAD each file. (Without ?blobs= in the request, names only
	// are listed anyway, as on the hub.)
	MinimalListing bool

	mu     sync.Mutex
	repos  map[string]*repo
	blobs  map[string][]byte // sha256 -> content (the CDN)
	faults map[string]*Fault // by file path
	reqs   []Request
	seq    int
}

type repo struct {
	token    string // gated: the token that may read it; "" = public
	commits  map[string][]File
	branches map[string]string
	hidden   map[string]bool
}

// New starts a fake hub, closed when the test ends.
func New(t testing.TB) *Server {
	s := &Server{repos: map[string]*repo{}, blobs: map[string][]byte{}, faults: map[string]*Fault{}}
	api, files := http.NewServeMux(), http.NewServeMux()
	api.HandleFunc("GET /api/models/{org}/{name}", s.handleInfo)
	api.HandleFunc("GET /api/models/{org}/{name}/revision/{rev...}", s.handleInfo)
	api.HandleFunc("GET /cdn/{sha}", s.handleCDN)
	files.HandleFunc("GET /{org}/{name}/resolve/{rev}/{path...}", s.handleResolve)
	files.HandleFunc("HEAD /{org}/{name}/resolve/{rev}/{path...}", s.handleResolve)
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.reqs = append(s.reqs, Request{Method: r.Method, Path: r.URL.Path, Range: r.Header.Get("Range"), Auth: r.Header.Get("Authorization")})
		s.mu.Unlock()
		if strings.HasPrefix(r.URL.Path, "/api/") || strings.HasPrefix(r.URL.Path, "/cdn/") {
			api.ServeHTTP(w, r)
			return
		}
		files.ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

// Commit makes a new commit of repoID holding files, moves branch main to
// it and returns its hash. Earlier commits stay resolvable by hash.
func (s *Server) Commit(repoID string, files []File) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.repos[repoID]
	if r == nil {
		r = &repo{commits: map[string][]File{}, branches: map[string]string{}, hidden: map[string]bool{}}
		s.repos[repoID] = r
	}
	s.seq++
	h := sha1.New()
	fmt.Fprintf(h, "%s %d\n", repoID, s.seq)
	fs := append([]File(nil), files...)
	for i := range fs {
		fs[i].Data = append([]byte(nil), fs[i].Data...)
		fmt.Fprintf(h, "%s %x\n", fs[i].Path, sha256.Sum256(fs[i].Data))
		if fs[i].LFS {
			s.blobs[sha256Hex(fs[i].Data)] = fs[i].Data
		}
	}
	sha := hex.EncodeToString(h.Sum(nil))
	r.commits[sha] = fs
	r.branches["main"] = sha
	return sha
}

// Branch points a branch (or tag) name at a commit.
func (s *Server) Branch(repoID, name, commit string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.repos[repoID].branches[name] = commit
}

// Gate makes repoID gated: its files need token (the listing stays public,
// as on the hub).
func (s *Server) Gate(repoID, token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.repos[repoID].token = token
}

// Hide keeps a file in the listings but answers 404 EntryNotFound for it.
func (s *Server) Hide(repoID, path string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.repos[repoID].hidden[path] = true
}

// SetFault sets (nil: clears) the fault of a file path.
func (s *Server) SetFault(path string, f *Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f == nil {
		delete(s.faults, path)
		return
	}
	c := *f
	s.faults[path] = &c
}

// Requests returns the requests seen so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.reqs...)
}

// ResetRequests forgets the requests seen so far.
func (s *Server) ResetRequests() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqs = nil
}

// ContentGETs returns the GETs of a file's resolve URL seen so far (an LFS
// file's are redirected to the CDN with the same Range header).
func (s *Server) ContentGETs(path string) []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Request
	for _, r := range s.reqs {
		if r.Method != http.MethodGet {
			continue
		}
		if strings.Contains(r.Path, "/resolve/") && strings.HasSuffix(r.Path, "/"+path) {
			out = append(out, r)
		}
	}
	return out
}

// CDNGETs returns the GETs of an LFS blob's bytes by its content.
func (s *Server) CDNGETs(data []byte) []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Request
	want := "/cdn/" + sha256Hex(data)
	for _, r := range s.reqs {
		if r.Method == http.MethodGet && r.Path == want {
			out = append(out, r)
		}
	}
	return out
}

func sha256Hex(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// gitBlobID is git's object id of a blob: what the hub lists as blobId and
// sends as the ETag of a file not in LFS.
func gitBlobID(b []byte) string {
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", len(b))
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))
}

func lfsPointer(data []byte) string {
	return fmt.Sprintf("version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n", sha256Hex(data), len(data))
}

func hubError(w http.ResponseWriter, status int, code, msg string) {
	if code != "" {
		w.Header().Set("X-Error-Code", code)
	}
	w.Header().Set("X-Error-Message", msg)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

// lookup finds the repository and the commit of a revision, answering the
// hub's errors itself (it returns ok = false then).
func (s *Server) lookup(w http.ResponseWriter, r *http.Request, rev string) (id string, rp *repo, commit string, ok bool) {
	id = r.PathValue("org") + "/" + r.PathValue("name")
	s.mu.Lock()
	rp = s.repos[id]
	if rp != nil {
		commit = rp.branches[rev]
		if commit == "" && rp.commits[rev] != nil {
			commit = rev
		}
	}
	s.mu.Unlock()
	switch {
	case rp == nil && r.Header.Get("Authorization") == "":
		// The hub does not tell an anonymous client whether a repository exists.
		hubError(w, http.StatusUnauthorized, "RepoNotFound", "Repository not found")
	case rp == nil:
		hubError(w, http.StatusNotFound, "RepoNotFound", "Repository not found")
	case commit == "":
		hubError(w, http.StatusNotFound, "RevisionNotFound", "Invalid rev id: "+rev)
	default:
		return id, rp, commit, true
	}
	return "", nil, "", false
}

type sibling struct {
	RFilename string `json:"rfilename"`
	Size      *int64 `json:"size,omitempty"`
	BlobID    string `json:"blobId,omitempty"`
	LFS       *struct {
		SHA256      string `json:"sha256"`
		Size        int64  `json:"size"`
		PointerSize int    `json:"pointerSize"`
	} `json:"lfs,omitempty"`
}

func (s *Server) handleInfo(w http.ResponseWriter, r *http.Request) {
	rev := r.PathValue("rev")
	if rev == "" {
		rev = "main"
	}
	id, rp, commit, ok := s.lookup(w, r, rev)
	if !ok {
		return
	}
	s.mu.Lock()
	files := rp.commits[commit]
	gated := any(false)
	if rp.token != "" {
		gated = "manual"
	}
	// Without ?blobs= the hub lists names only.
	minimal := s.MinimalListing || r.URL.Query().Get("blobs") == ""
	s.mu.Unlock()
	sib := make([]sibling, 0, len(files))
	for _, f := range files {
		e := sibling{RFilename: f.Path}
		if !minimal {
			size := int64(len(f.Data))
			e.Size = &size
			if f.LFS {
				p := lfsPointer(f.Data)
				e.BlobID = gitBlobID([]byte(p))
				e.LFS = &struct {
					SHA256      string `json:"sha256"`
					Size        int64  `json:"size"`
					PointerSize int    `json:"pointerSize"`
				}{sha256Hex(f.Data), size, len(p)}
			} else {
				e.BlobID = gitBlobID(f.Data)
			}
		}
		sib = append(sib, e)
	}
	sort.Slice(sib, func(a, b int) bool { return sib[a].RFilename < sib[b].RFilename })
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"_id": "fake" + commit[:8], "id": id, "modelId": id, "author": strings.Split(id, "/")[0],
		"sha": commit, "private": false, "gated": gated, "disabled": false,
		"tags": []string{"safetensors"}, "siblings": sib,
	})
}

func (s *Server) handleResolve(w http.ResponseWriter, r *http.Request) {
	id, rp, commit, ok := s.lookup(w, r, r.PathValue("rev"))
	if !ok {
		return
	}
	path := r.PathValue("path")
	s.mu.Lock()
	token, hidden := rp.token, rp.hidden[path]
	var file *File
	for i, f := range rp.commits[commit] {
		if f.Path == path {
			file = &rp.commits[commit][i]
		}
	}
	s.mu.Unlock()
	if token != "" {
		switch auth := r.Header.Get("Authorization"); {
		case auth == "":
			hubError(w, http.StatusUnauthorized, "GatedRepo", "Access to model "+id+" is restricted. You must have access to it and be authenticated to access it. Please log in.")
			return
		case auth != "Bearer "+token:
			hubError(w, http.StatusForbidden, "GatedRepo", "Access to model "+id+" is restricted and you are not in the authorized list.")
			return
		}
	}
	if file == nil || hidden {
		hubError(w, http.StatusNotFound, "EntryNotFound", path+" does not exist on \""+commit+"\"")
		return
	}
	h := w.Header()
	h.Set("X-Repo-Commit", commit)
	if file.LFS {
		sum := sha256Hex(file.Data)
		h.Set("ETag", `"`+gitBlobID([]byte(lfsPointer(file.Data)))+`"`)
		h.Set("X-Linked-Etag", `"`+sum+`"`)
		h.Set("X-Linked-Size", strconv.Itoa(len(file.Data)))
		h.Set("Location", "/cdn/"+sum+"?path="+url.QueryEscape(path))
		w.WriteHeader(http.StatusFound)
		return
	}
	h.Set("ETag", `"`+gitBlobID(file.Data)+`"`)
	s.serveContent(w, r, path, file.Data)
}

func (s *Server) handleCDN(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	data, ok := s.blobs[r.PathValue("sha")]
	s.mu.Unlock()
	if !ok {
		http.Error(w, "no such blob", http.StatusNotFound)
		return
	}
	w.Header().Set("ETag", `"`+r.PathValue("sha")+`"`)
	s.serveContent(w, r, r.URL.Query().Get("path"), data)
}

// takeFault returns the fault of a path for this request, if any.
func (s *Server) takeFault(path string) *Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.faults[path]
	if f == nil {
		return nil
	}
	c := *f
	if f.Times > 0 {
		f.Times--
		if f.Times == 0 {
			delete(s.faults, path)
		}
	}
	return &c
}

// serveContent serves data with Range support (bytes=N- and bytes=N-M) and
// the path's fault.
func (s *Server) serveContent(w http.ResponseWriter, r *http.Request, path string, data []byte) {
	if r.Method == http.MethodHead {
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		w.WriteHeader(http.StatusOK)
		return
	}
	f := s.takeFault(path)
	if f != nil && f.Status != 0 {
		if f.Status == http.StatusServiceUnavailable || f.Status == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", "0")
		}
		hubError(w, f.Status, "", http.StatusText(f.Status))
		return
	}
	if f != nil && f.Corrupt && len(data) > 0 {
		data = append([]byte(nil), data...)
		data[len(data)/2] ^= 0x5a
	}
	s.mu.Lock()
	noRange := s.NoRange
	s.mu.Unlock()
	h := w.Header()
	h.Set("Accept-Ranges", "bytes")
	status, body := http.StatusOK, data
	if rng := r.Header.Get("Range"); rng != "" && !noRange {
		start, end, ok := parseRange(rng, int64(len(data)))
		if !ok {
			h.Set("Content-Range", fmt.Sprintf("bytes */%d", len(data)))
			http.Error(w, "range not satisfiable", http.StatusRequestedRangeNotSatisfiable)
			return
		}
		h.Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", start, end, len(data)))
		status, body = http.StatusPartialContent, data[start:end+1]
	}
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Content-Type", "application/octet-stream")
	w.WriteHeader(status)
	switch {
	case f != nil && f.DropAfter > 0:
		_, _ = w.Write(body[:min(int(f.DropAfter), len(body))])
		w.(http.Flusher).Flush()
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	case f != nil && f.HangAfter > 0:
		_, _ = w.Write(body[:min(int(f.HangAfter), len(body))])
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	default:
		_, _ = w.Write(body)
	}
}

// parseRange reads "bytes=N-" or "bytes=N-M" against a size.
func parseRange(h string, size int64) (start, end int64, ok bool) {
	spec, found := strings.CutPrefix(h, "bytes=")
	if !found || strings.Contains(spec, ",") {
		return 0, 0, false
	}
	a, b, found := strings.Cut(spec, "-")
	if !found {
		return 0, 0, false
	}
	start, err := strconv.ParseInt(a, 10, 64)
	if err != nil || start < 0 || start >= size {
		return 0, 0, false
	}
	end = size - 1
	if b != "" {
		if end, err = strconv.ParseInt(b, 10, 64); err != nil || end < start {
			return 0, 0, false
		}
		end = min(end, size-1)
	}
	return start, end, true
}
