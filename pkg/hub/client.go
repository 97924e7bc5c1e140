// Package hub downloads model repositories from the Hugging Face hub, or from
// a mirror that speaks its API (HF_ENDPOINT): the file listing with LFS
// checksums, parallel resumable downloads verified by size and checksum, and
// the hub's cache layout (so other tools find the files) or a plain
// directory. Nothing is ever written outside the target directory.
// docs/download.md describes the command built on it (`glmctl download`).
package hub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// DefaultEndpoint is the hub's address when HF_ENDPOINT is not set.
const DefaultEndpoint = "https://huggingface.co"

// Client talks to one hub endpoint.
type Client struct {
	// Endpoint is the hub's base URL without a trailing slash.
	Endpoint string
	// Token is sent as a bearer token when not empty.
	Token string
	// HTTP does the requests (redirects to a CDN are followed; Go drops the
	// Authorization header when a redirect leaves the hub's domain).
	HTTP *http.Client
	// UserAgent names the client in requests.
	UserAgent string
}

// NewClient returns a client of endpoint ("" = DefaultEndpoint) with an HTTP
// client suited to long downloads: no overall timeout, but bounded dialing,
// TLS handshakes and waits for response headers (a stalled body is caught by
// the downloader's own idle timer).
func NewClient(endpoint, token string) *Client {
	if endpoint == "" {
		endpoint = DefaultEndpoint
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	tr.TLSHandshakeTimeout = 30 * time.Second
	tr.ResponseHeaderTimeout = 60 * time.Second
	tr.MaxIdleConnsPerHost = 32
	return &Client{
		Endpoint:  strings.TrimRight(endpoint, "/"),
		Token:     token,
		HTTP:      &http.Client{Transport: tr},
		UserAgent: "glmctl",
	}
}

// EndpointFromEnv returns HF_ENDPOINT, or DefaultEndpoint when it is unset.
func EndpointFromEnv() string {
	if e := strings.TrimSpace(os.Getenv("HF_ENDPOINT")); e != "" {
		return strings.TrimRight(e, "/")
	}
	return DefaultEndpoint
}

// TokenFromEnv finds a token the way huggingface_hub does: HF_TOKEN, then the
// legacy HUGGING_FACE_HUB_TOKEN, then the file written by `hf auth login`
// (HF_TOKEN_PATH, else $HF_HOME/token). It returns the token and where it
// came from (for logs; the token itself is never logged), or "" and "".
func TokenFromEnv() (token, source string) {
	for _, k := range []string{"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"} {
		if t := strings.TrimSpace(os.Getenv(k)); t != "" {
			return t, k
		}
	}
	path := os.Getenv("HF_TOKEN_PATH")
	if path == "" {
		home, err := hfHome()
		if err != nil {
			return "", ""
		}
		path = filepath.Join(home, "token")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", ""
	}
	if t := strings.TrimSpace(string(b)); t != "" {
		return t, path
	}
	return "", ""
}

// hfHome is $HF_HOME, else $XDG_CACHE_HOME/huggingface, else
// ~/.cache/huggingface.
func hfHome() (string, error) {
	if h := os.Getenv("HF_HOME"); h != "" {
		return h, nil
	}
	if x := os.Getenv("XDG_CACHE_HOME"); x != "" {
		return filepath.Join(x, "huggingface"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("hub cache: no home directory (set HF_HOME or HF_HUB_CACHE): %w", err)
	}
	return filepath.Join(home, ".cache", "huggingface"), nil
}

// DefaultCacheDir is the hub cache huggingface_hub uses: $HF_HUB_CACHE, else
// the legacy $HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub (HF_HOME defaulting to
// $XDG_CACHE_HOME/huggingface or ~/.cache/huggingface).
func DefaultCacheDir() (string, error) {
	for _, k := range []string{"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"} {
		if d := os.Getenv(k); d != "" {
			return d, nil
		}
	}
	home, err := hfHome()
	if err != nil {
		return "", err
	}
	return filepath.Join(home, "hub"), nil
}

// Error is a refused hub request, with what to do about it.
type Error struct {
	Status  int    // HTTP status
	Code    string // X-Error-Code: GatedRepo, RepoNotFound, RevisionNotFound, EntryNotFound, ...
	Message string // X-Error-Message or the start of the body
	URL     string // the refused request ("" when decided from the listing)
	Repo    string
	File    string // the repository file asked for, if any
	Hint    string // what the user can do
	// RetryAfter is the server's Retry-After (429, 503), 0 if none.
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		fmt.Fprintf(&b, "%s: ", e.File)
	}
	if e.URL == "" {
		// Decided from the listing, before any file request.
		b.WriteString(e.Message)
	} else {
		fmt.Fprintf(&b, "hub answered %d %s", e.Status, http.StatusText(e.Status))
		if e.Code != "" {
			fmt.Fprintf(&b, " (%s)", e.Code)
		}
		if e.Message != "" {
			fmt.Fprintf(&b, ": %s", e.Message)
		}
	}
	if e.Hint != "" {
		fmt.Fprintf(&b, "; %s", e.Hint)
	}
	return b.String()
}

// Retryable reports whether trying again later may succeed (server errors,
// rate limits, timeouts).
func (e *Error) Retryable() bool {
	return e.Status >= 500 || e.Status == http.StatusTooManyRequests || e.Status == http.StatusRequestTimeout
}

// Fatal reports whether the whole download should stop: no other file of
// the repository can succeed either (authentication, access, a missing
// repository or revision).
func (e *Error) Fatal() bool {
	switch e.Status {
	case http.StatusUnauthorized, http.StatusForbidden:
		return true
	case http.StatusNotFound:
		return e.Code == "RepoNotFound" || e.Code == "RevisionNotFound"
	}
	return false
}

// responseError builds the Error of a non-2xx response; the body is read
// (a little of it) and closed.
func (c *Client) responseError(resp *http.Response, repo, rev, file string) *Error {
	defer resp.Body.Close()
	e := &Error{Status: resp.StatusCode, Code: resp.Header.Get("X-Error-Code"), Repo: repo, File: file}
	if resp.Request != nil {
		e.URL = resp.Request.URL.Redacted()
	}
	e.Message = resp.Header.Get("X-Error-Message")
	if e.Message == "" {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		e.Message = bodyMessage(b)
	}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
		e.RetryAfter = time.Duration(s) * time.Second
	}
	c.addHint(e, rev)
	return e
}

// addHint says what to do about a refused request.
func (c *Client) addHint(e *Error, rev string) {
	hasToken := c.Token != ""
	repo := e.Repo
	page := c.Endpoint + "/" + repo
	switch {
	case e.Code == "GatedRepo" && !hasToken:
		e.Hint = fmt.Sprintf("%s is gated: accept its conditions at %s while logged in, then pass a token of that account (--token or HF_TOKEN)", repo, page)
	case e.Code == "GatedRepo":
		e.Hint = fmt.Sprintf("%s is gated and this token's account has not been granted access: accept its conditions at %s (and wait for approval if it is manual)", repo, page)
	case e.Status == http.StatusUnauthorized && !hasToken:
		e.Hint = fmt.Sprintf("%s does not exist at %s, or it is private or gated: check the name (ORG/NAME), or pass a token that can read it (--token or HF_TOKEN)", repo, c.Endpoint)
	case e.Status == http.StatusUnauthorized:
		e.Hint = "the token was refused: check it (https://huggingface.co/settings/tokens), or that the repository exists"
	case e.Status == http.StatusForbidden:
		e.Hint = fmt.Sprintf("the token has no read access to %s (a fine-grained token must be given read access to it; a gated repository must have its conditions accepted at %s)", repo, page)
	case e.Code == "RepoNotFound":
		e.Hint = fmt.Sprintf("no repository %s at %s: check the name (ORG/NAME, e.g. zai-org/GLM-4.7-FP8)", repo, c.Endpoint)
	case e.Code == "RevisionNotFound":
		e.Hint = fmt.Sprintf("%s has no revision %q: give a branch, a tag or a commit hash (--revision)", repo, rev)
	case e.Code == "EntryNotFound":
		e.Hint = fmt.Sprintf("the file is not in %s at %s (the listing and the files disagree: re-run)", repo, shortRev(rev))
	case e.Status == http.StatusNotFound:
		e.Hint = fmt.Sprintf("check the repository name %s and the endpoint %s", repo, c.Endpoint)
	case e.Status == http.StatusTooManyRequests:
		e.Hint = "rate limited: a token raises the limit"
	}
}

// bodyMessage extracts {"error": "..."} from a JSON body, else a short
// plain-text body.
func bodyMessage(b []byte) string {
	var j struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(b, &j) == nil && j.Error != "" {
		return j.Error
	}
	s := strings.TrimSpace(string(b))
	if len(s) > 200 || strings.ContainsAny(s, "<\x00") {
		return ""
	}
	return s
}

func shortRev(rev string) string {
	if len(rev) == 40 || len(rev) == 64 {
		return rev[:12]
	}
	return rev
}

func (c *Client) httpClient() *http.Client {
	if c.HTTP == nil {
		return http.DefaultClient
	}
	return c.HTTP
}

func (c *Client) newRequest(ctx context.Context, method, u string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return nil, err
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	if c.UserAgent != "" {
		req.Header.Set("User-Agent", c.UserAgent)
	}
	return req, nil
}

// RepoFile is one file of a repository listing, as the hub describes it.
type RepoFile struct {
	Path   string // repository path, '/'-separated (validated before use)
	Size   int64  // bytes; -1 when the listing does not say
	SHA256 string // LFS files (the weights): the sha256 of the content
	GitOID string // the git blob id: for non-LFS files the sha1 of "blob <size>\0" + content
}

// ETag is what huggingface_hub names the file's blob after: the sha256 for
// LFS files, else the git blob id.
func (f RepoFile) ETag() string {
	if f.SHA256 != "" {
		return f.SHA256
	}
	return f.GitOID
}

// RepoInfo is a repository at one commit.
type RepoInfo struct {
	ID      string
	Commit  string // the commit the revision resolved to
	Private bool
	Gated   string // "" when not gated, else "auto" or "manual"
	Files   []RepoFile
}

type apiSibling struct {
	RFilename string `json:"rfilename"`
	Size      *int64 `json:"size"`
	BlobID    string `json:"blobId"`
	LFS       *struct {
		SHA256 string `json:"sha256"`
		Size   int64  `json:"size"`
	} `json:"lfs"`
}

type apiModel struct {
	ID       string          `json:"id"`
	SHA      string          `json:"sha"`
	Private  bool            `json:"private"`
	Gated    json.RawMessage `json:"gated"`
	Siblings []apiSibling    `json:"siblings"`
}

// ModelInfo lists a model repository at a revision with sizes and checksums:
// GET {endpoint}/api/models/{repo}/revision/{revision}?blobs=True (spelled
// as huggingface_hub sends it). File names are returned as the server wrote
// them; Download validates them.
func (c *Client) ModelInfo(ctx context.Context, repo, revision string) (*RepoInfo, error) {
	u := fmt.Sprintf("%s/api/models/%s/revision/%s?blobs=True", c.Endpoint, repo, url.PathEscape(revision))
	req, err := c.newRequest(ctx, http.MethodGet, u)
	if err != nil {
		return nil, err
	}
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, c.responseError(resp, repo, revision, "")
	}
	defer resp.Body.Close()
	var m apiModel
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&m); err != nil {
		return nil, fmt.Errorf("bad JSON from %s: %w", c.Endpoint, err)
	}
	info := &RepoInfo{ID: m.ID, Commit: m.SHA, Private: m.Private}
	var gated any
	if len(m.Gated) > 0 && json.Unmarshal(m.Gated, &gated) == nil {
		if s, ok := gated.(string); ok {
			info.Gated = s
		}
	}
	for _, s := range m.Siblings {
		f := RepoFile{Path: s.RFilename, Size: -1, GitOID: strings.ToLower(s.BlobID)}
		if s.Size != nil {
			f.Size = *s.Size
		}
		if s.LFS != nil {
			f.SHA256 = strings.ToLower(s.LFS.SHA256)
			if f.Size < 0 {
				f.Size = s.LFS.Size
			}
		}
		info.Files = append(info.Files, f)
	}
	return info, nil
}

// FileMeta is what a HEAD of a file's resolve URL says about it.
type FileMeta struct {
	Commit string
	ETag   string
	Size   int64
}

// HeadFile asks the hub about one file without downloading it (used when a
// mirror's listing lacks sizes or checksums). Redirects are not followed:
// the hub's own answer carries X-Linked-Etag and X-Linked-Size.
func (c *Client) HeadFile(ctx context.Context, repo, commit, file string) (*FileMeta, error) {
	req, err := c.newRequest(ctx, http.MethodHead, c.ResolveURL(repo, commit, file))
	if err != nil {
		return nil, err
	}
	hc := *c.httpClient()
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: HEAD: %w", file, err)
	}
	if resp.StatusCode >= 400 {
		return nil, c.responseError(resp, repo, commit, file)
	}
	resp.Body.Close()
	h := resp.Header
	m := &FileMeta{Commit: h.Get("X-Repo-Commit"), Size: -1}
	m.ETag = normalizeETag(h.Get("X-Linked-Etag"))
	if m.ETag == "" {
		m.ETag = normalizeETag(h.Get("ETag"))
	}
	size := h.Get("X-Linked-Size")
	if size == "" && resp.StatusCode < 300 {
		size = h.Get("Content-Length")
	}
	if size != "" {
		if _, err := fmt.Sscan(size, &m.Size); err != nil {
			m.Size = -1
		}
	}
	return m, nil
}

// normalizeETag drops a weak prefix and the quotes: W/"abc" -> abc.
func normalizeETag(s string) string {
	s = strings.TrimPrefix(strings.TrimSpace(s), "W/")
	return strings.ToLower(strings.Trim(s, `"`))
}

// ResolveURL is where the bytes of a file at a revision are served.
func (c *Client) ResolveURL(repo, rev, file string) string {
	segs := strings.Split(file, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return fmt.Sprintf("%s/%s/resolve/%s/%s", c.Endpoint, repo, url.PathEscape(rev), strings.Join(segs, "/"))
}

// errorIsRetryable reports whether a failed request or a broken body may
// succeed when tried again: hub errors that say so, and network failures
// other than the caller's own cancellation.
func errorIsRetryable(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	var he *Error
	if errors.As(err, &he) {
		return he.Retryable()
	}
	var ce *checksumError
	if errors.As(err, &ce) {
		return false
	}
	var pe *pathError
	if errors.As(err, &pe) {
		return false
	}
	var se *sizeError
	if errors.As(err, &se) {
		return false
	}
	var dns *net.DNSError
	if errors.As(err, &dns) && dns.IsNotFound {
		return false // no such host: waiting will not make it appear
	}
	var fe *fsError
	return !errors.As(err, &fe)
}
