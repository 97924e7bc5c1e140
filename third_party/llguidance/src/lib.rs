//! libllguidance.a for pkg/grammar: re-exports llguidance so that its C API
//! (the #[no_mangle] extern "C" llg_* functions of llguidance::ffi, declared
//! in pkg/grammar/llguidance.h) ends up in this crate's static library.
pub use llguidance::ffi;

// Referencing one symbol keeps the dependency linked even if rustc were ever
// to stop bundling unused upstream objects into a staticlib.
#[used]
static KEEP: extern "C" fn() -> *const std::os::raw::c_char = llguidance::ffi::llg_get_version;
