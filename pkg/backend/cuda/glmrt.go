package cuda

// The cgo side: the ABI of libglmcuda.so (cuda/include/glmrt.h) reached
// through dlopen/dlsym, so that glmctl itself links no CUDA library and runs
// (with other backends) on machines without one. Function pointer types come
// from the header via __typeof__, so a signature change there is a compile
// error here rather than a silent mismatch.

/*
#cgo CFLAGS: -I${SRCDIR}/../../../cuda/include
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "glmrt.h"

typedef struct glmrt_api {
	void *handle;
	__typeof__(glmrt_abi_version) *abi_version;
	__typeof__(glmrt_last_error) *last_error;
	__typeof__(glmrt_device_count) *device_count;
	__typeof__(glmrt_engine_create) *engine_create;
	__typeof__(glmrt_get_info) *get_info;
	__typeof__(glmrt_load_tensor) *load_tensor;
	__typeof__(glmrt_finalize) *finalize;
	__typeof__(glmrt_step) *step;
	__typeof__(glmrt_step_begin) *step_begin;
	__typeof__(glmrt_step_finish) *step_finish;
	__typeof__(glmrt_engine_destroy) *engine_destroy;
	__typeof__(glmrt_synthesize) *synthesize;
	__typeof__(glmrt_profile_enable) *profile_enable;
	__typeof__(glmrt_profile_read) *profile_read;
} glmrt_api;

// The symbols, in glmrt_api order (after handle).
static const char *const glmrt_api_names[] = {
	"glmrt_abi_version", "glmrt_last_error", "glmrt_device_count", "glmrt_engine_create",
	"glmrt_get_info", "glmrt_load_tensor", "glmrt_finalize", "glmrt_step", "glmrt_step_begin",
	"glmrt_step_finish", "glmrt_engine_destroy", "glmrt_synthesize", "glmrt_profile_enable",
	"glmrt_profile_read",
};
enum { GLMRT_API_NSYMS = sizeof(glmrt_api_names) / sizeof(glmrt_api_names[0]) };

static const char *glmrt_api_name(int i) { return i >= 0 && i < GLMRT_API_NSYMS ? glmrt_api_names[i] : NULL; }

// glmrt_api_load opens path and resolves every symbol up front. Returns 0, or
// 1 with dlerror()'s text in err (dlopen failed), or 2 with the name of the
// first missing symbol in err. dlerror() is copied here, on the thread that
// produced it.
static int glmrt_api_load(const char *path, glmrt_api *api, char *err, size_t n) {
	memset(api, 0, sizeof *api);
	dlerror();
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		const char *e = dlerror();
		snprintf(err, n, "%s", e ? e : "dlopen failed");
		return 1;
	}
	void **slots[GLMRT_API_NSYMS] = {
		(void **)&api->abi_version, (void **)&api->last_error, (void **)&api->device_count,
		(void **)&api->engine_create, (void **)&api->get_info, (void **)&api->load_tensor,
		(void **)&api->finalize, (void **)&api->step, (void **)&api->step_begin,
		(void **)&api->step_finish, (void **)&api->engine_destroy, (void **)&api->synthesize,
		(void **)&api->profile_enable, (void **)&api->profile_read,
	};
	for (int i = 0; i < GLMRT_API_NSYMS; i++) {
		dlerror();
		void *p = dlsym(h, glmrt_api_names[i]);
		if (!p) {
			snprintf(err, n, "%s", glmrt_api_names[i]);
			dlclose(h);
			memset(api, 0, sizeof *api);
			return 2;
		}
		*slots[i] = p;
	}
	api->handle = h;
	return 0;
}

static void glmrt_api_close(glmrt_api *api) {
	if (api->handle) dlclose(api->handle);
	memset(api, 0, sizeof *api);
}

// Trampolines: cgo cannot call C function pointers itself.
static int call_abi_version(const glmrt_api *a) { return a->abi_version(); }
static const char *call_last_error(const glmrt_api *a) { return a->last_error(); }
static int call_device_count(const glmrt_api *a, int32_t *out) { return a->device_count(out); }
static int call_engine_create(const glmrt_api *a, const glmrt_model_config *c, const glmrt_engine_options *o, glmrt_engine **out) {
	return a->engine_create(c, o, out);
}
static int call_get_info(const glmrt_api *a, const glmrt_engine *e, glmrt_info *out) { return a->get_info(e, out); }
static int call_load_tensor(const glmrt_api *a, glmrt_engine *e, const char *name, int32_t dtype, const int64_t *shape,
                            int32_t ndim, const void *data, uint64_t nbytes) {
	return a->load_tensor(e, name, dtype, shape, ndim, data, nbytes);
}
static int call_finalize(const glmrt_api *a, glmrt_engine *e) { return a->finalize(e); }
static int call_step(const glmrt_api *a, glmrt_engine *e, const glmrt_batch *b, glmrt_result *r) { return a->step(e, b, r); }
static int call_step_begin(const glmrt_api *a, glmrt_engine *e, const glmrt_batch *b) { return a->step_begin(e, b); }
static int call_step_finish(const glmrt_api *a, glmrt_engine *e, const uint32_t *m, glmrt_result *r) { return a->step_finish(e, m, r); }
static void call_engine_destroy(const glmrt_api *a, glmrt_engine *e) { a->engine_destroy(e); }
static int call_synthesize(const glmrt_api *a, glmrt_engine *e, uint64_t seed) { return a->synthesize(e, seed); }
static int call_profile_enable(const glmrt_api *a, glmrt_engine *e, int32_t on) { return a->profile_enable(e, on); }
static int call_profile_read(const glmrt_api *a, glmrt_engine *e, glmrt_profile *out, int32_t reset) {
	return a->profile_read(e, out, reset);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/glmctl/glmctl/pkg/engine"
)

// ABIVersion is GLMRT_ABI_VERSION of the header this package was compiled
// against: a library reporting anything else is refused.
const ABIVersion = int(C.GLMRT_ABI_VERSION)

// MaxTopLogprobs is GLMRT_MAX_TOP_LOGPROBS.
const MaxTopLogprobs = int(C.GLMRT_MAX_TOP_LOGPROBS)

// ErrStaleLibrary is wrapped when a library reports another ABI version.
var ErrStaleLibrary = errors.New("stale libglmcuda.so")

// apiSymbolNames lists the symbols the loader resolves.
func apiSymbolNames() []string {
	var out []string
	for i := 0; ; i++ {
		p := C.glmrt_api_name(C.int(i))
		if p == nil {
			return out
		}
		out = append(out, C.GoString(p))
	}
}

// library is a dlopen'ed libglmcuda.so with every symbol resolved. Its
// methods must run on the backend's locked OS thread, so that a failure and
// glmrt_last_error() are read on the same thread.
type library struct {
	path string
	api  *C.glmrt_api // C memory
}

// openLibrary dlopens path, resolves every ABI symbol and checks the ABI
// version.
func openLibrary(path string) (*library, error) {
	api := (*C.glmrt_api)(C.calloc(1, C.sizeof_glmrt_api))
	if api == nil {
		return nil, errors.New("allocate glmrt_api: out of memory")
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	const errLen = 1024
	cerr := (*C.char)(C.calloc(1, errLen))
	defer C.free(unsafe.Pointer(cerr))
	switch rc := C.glmrt_api_load(cpath, api, cerr, errLen); rc {
	case 0:
	case 2:
		C.free(unsafe.Pointer(api))
		return nil, fmt.Errorf("load %s: not a glmctl CUDA runtime: missing symbol %s", path, C.GoString(cerr))
	default:
		C.free(unsafe.Pointer(api))
		return nil, fmt.Errorf("load %s: %s", path, C.GoString(cerr))
	}
	l := &library{path: path, api: api}
	if v := int(C.call_abi_version(api)); v != ABIVersion {
		l.close()
		return nil, fmt.Errorf("load %s: %w: it implements glmrt ABI version %d, this glmctl needs %d: rebuild it with `glmctl build`", path, ErrStaleLibrary, v, ABIVersion)
	}
	return l, nil
}

// close dlcloses a library no engine was created from. Once a CUDA engine
// has run, the library stays mapped: the CUDA runtime statically linked into
// it registers exit handlers and keeps per-thread state that point into it.
func (l *library) close() {
	if l.api != nil {
		C.glmrt_api_close(l.api)
		C.free(unsafe.Pointer(l.api))
		l.api = nil
	}
}

// statusName names a glmrt status code.
func statusName(rc C.int) string {
	switch rc {
	case C.GLMRT_ERR_INVALID:
		return "GLMRT_ERR_INVALID"
	case C.GLMRT_ERR_CUDA:
		return "GLMRT_ERR_CUDA"
	case C.GLMRT_ERR_OOM:
		return "GLMRT_ERR_OOM"
	case C.GLMRT_ERR_STATE:
		return "GLMRT_ERR_STATE"
	}
	return fmt.Sprintf("status %d", int(rc))
}

// fail turns a non-OK status into an error carrying glmrt_last_error(); it
// must be called right after the failing call, on the same thread.
func (l *library) fail(op string, rc C.int) error {
	msg := C.GoString(C.call_last_error(l.api))
	if msg == "" {
		msg = "no message"
	}
	return fmt.Errorf("%s: %s (%s)", op, msg, statusName(rc))
}

// deviceCount asks the runtime how many CUDA devices it sees.
func (l *library) deviceCount() (int, error) {
	var n C.int32_t
	if rc := C.call_device_count(l.api, &n); rc != C.GLMRT_OK {
		return 0, l.fail("glmrt_device_count", rc)
	}
	return int(n), nil
}

// rtEngine is a created glmrt_engine. Like library, its methods must run on
// the backend's locked OS thread.
type rtEngine struct {
	lib *library
	h   *C.glmrt_engine
}

func (l *library) createEngine(cfg *C.glmrt_model_config, o *C.glmrt_engine_options) (*rtEngine, error) {
	var h *C.glmrt_engine
	if rc := C.call_engine_create(l.api, cfg, o, &h); rc != C.GLMRT_OK {
		return nil, l.fail("glmrt_engine_create", rc)
	}
	if h == nil {
		return nil, errors.New("glmrt_engine_create: returned OK without an engine")
	}
	return &rtEngine{lib: l, h: h}, nil
}

func (e *rtEngine) info() (C.glmrt_info, error) {
	var info C.glmrt_info
	if rc := C.call_get_info(e.lib.api, e.h, &info); rc != C.GLMRT_OK {
		return info, e.lib.fail("glmrt_get_info", rc)
	}
	return info, nil
}

// loadTensor hands one tensor over. data points into the checkpoint's mmap
// (not Go memory) and is only read during the call.
func (e *rtEngine) loadTensor(name string, dtype C.int32_t, shape []C.int64_t, data unsafe.Pointer, nbytes uint64) error {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var shp *C.int64_t
	if len(shape) > 0 {
		shp = &shape[0]
	}
	rc := C.call_load_tensor(e.lib.api, e.h, cname, dtype, shp, C.int32_t(len(shape)), data, C.uint64_t(nbytes))
	if rc != C.GLMRT_OK {
		return e.lib.fail("glmrt_load_tensor "+name, rc)
	}
	return nil
}

func (e *rtEngine) finalize() error {
	if rc := C.call_finalize(e.lib.api, e.h); rc != C.GLMRT_OK {
		return e.lib.fail("glmrt_finalize", rc)
	}
	return nil
}

func (e *rtEngine) step(b *C.glmrt_batch, r *C.glmrt_result) error {
	return e.stepError("glmrt_step", C.call_step(e.lib.api, e.h, b, r))
}

// stepBegin launches the step's forward (glmrt_step_begin); stepFinish must
// follow.
func (e *rtEngine) stepBegin(b *C.glmrt_batch) error {
	return e.stepError("glmrt_step_begin", C.call_step_begin(e.lib.api, e.h, b))
}

// stepFinish sends the token masks (the rows declared at begin; nil when
// none), samples and waits for the results (glmrt_step_finish).
func (e *rtEngine) stepFinish(masks *C.uint32_t, r *C.glmrt_result) error {
	return e.stepError("glmrt_step_finish", C.call_step_finish(e.lib.api, e.h, masks, r))
}

func (e *rtEngine) stepError(call string, rc C.int) error {
	if rc == C.GLMRT_OK {
		return nil
	}
	err := e.lib.fail(call, rc)
	if rc == C.GLMRT_ERR_CUDA {
		// A CUDA error inside a step (illegal address, ECC, a failed
		// launch) may have left the context unusable (sticky errors
		// are): the engine stops and the server exits for a restart.
		err = fmt.Errorf("%w: %w", engine.ErrBackendFatal, err)
	}
	return err
}

// synthesize fills every tensor with the synthetic weights of seed on the GPU
// (glmrt_synthesize), instead of loadTensor calls.
func (e *rtEngine) synthesize(seed uint64) error {
	if rc := C.call_synthesize(e.lib.api, e.h, C.uint64_t(seed)); rc != C.GLMRT_OK {
		return e.lib.fail("glmrt_synthesize", rc)
	}
	return nil
}

func (e *rtEngine) profileEnable(on bool) error {
	v := C.int32_t(0)
	if on {
		v = 1
	}
	if rc := C.call_profile_enable(e.lib.api, e.h, v); rc != C.GLMRT_OK {
		return e.lib.fail("glmrt_profile_enable", rc)
	}
	return nil
}

func (e *rtEngine) profileRead(reset bool) (C.glmrt_profile, error) {
	var p C.glmrt_profile
	v := C.int32_t(0)
	if reset {
		v = 1
	}
	if rc := C.call_profile_read(e.lib.api, e.h, &p, v); rc != C.GLMRT_OK {
		return p, e.lib.fail("glmrt_profile_read", rc)
	}
	return p, nil
}

func (e *rtEngine) destroy() {
	if e.h != nil {
		C.call_engine_destroy(e.lib.api, e.h)
		e.h = nil
	}
}

// openRuntime resolves and loads the library (checking its ABI) and the engine
// options, on a new backend thread: what every way of opening shares. On
// error nothing is left running.
func openRuntime(o Options) (*Backend, string, C.glmrt_engine_options, error) {
	var copts C.glmrt_engine_options
	path, err := LibraryPath(o)
	if err != nil {
		return nil, "", copts, err
	}
	if copts, err = engineOptions(o); err != nil {
		return nil, "", copts, err
	}
	b := &Backend{thread: newOSThread()}
	b.thread.run(func() { b.lib, err = openLibrary(path) })
	if err != nil {
		b.release()
		return nil, "", copts, err
	}
	return b, path, copts, nil
}
