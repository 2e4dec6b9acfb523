// The library's C ABI besides the FFI handlers: kernel-table introspection, module preloading and the list
// of FFI targets the library defines. Plain C (no Python), loaded with ctypes by jax_mxfp8's loader and by
// tests/build/test_kernel_build.py. Every symbol here is jax_mxfp8_* (csrc/exports.map exports only those).
#include "common.h"

#pragma GCC visibility push(default)

// Rows of the kernel table: one per (registry variant, arch).
extern "C" int jax_mxfp8_kernel_count() { return jmx::kKernelTableSize; }
// The registry variant name of row i (the FFI attribute `kernel`), or NULL out of range.
extern "C" const char* jax_mxfp8_kernel_name(int i) {
  return (i >= 0 && i < jmx::kKernelTableSize) ? jmx::kKernelTable[i].name : nullptr;
}
// The compute-capability major row i is built for (9 = sm_90a, 10 = sm_100f), or -1 out of range.
extern "C" int jax_mxfp8_kernel_arch(int i) {
  return (i >= 0 && i < jmx::kKernelTableSize) ? jmx::kKernelTable[i].ccs[0] / 10 : -1;
}
// The cubin target of row i ("sm_90a", "sm_100f"), or NULL out of range.
extern "C" const char* jax_mxfp8_kernel_target(int i) {
  return (i >= 0 && i < jmx::kKernelTableSize) ? jmx::kKernelTable[i].arch : nullptr;
}
// The compute capabilities (10 * major + minor) whose devices load row i's cubin: ccs[0..n) with n returned
// (at most max_n written), or -1 out of range. sm_90a: 90; sm_100f: 100, 103.
extern "C" int jax_mxfp8_kernel_ccs(int i, int* ccs, int max_n) {
  if (i < 0 || i >= jmx::kKernelTableSize) return -1;
  int n = 0;
  for (; n < jmx::kMaxCcs && jmx::kKernelTable[i].ccs[n] != 0; ++n) {
    if (n < max_n) ccs[n] = jmx::kKernelTable[i].ccs[n];
  }
  return n;
}

// Loads every variant whose cubin loads on `device`'s compute capability (call before CUDA-graph capture: a
// module load inside a captured launch would not be recorded). Returns a cudaError_t code (0 on success); a
// device no row serves loads nothing and returns 0.
extern "C" int jax_mxfp8_preload(int device) {
  int cc = 0;
  if (jmx::DeviceCC(device, &cc).failure()) return static_cast<int>(cudaErrorInvalidDevice);
  for (int i = 0; i < jmx::kKernelTableSize; ++i) {
    if (!jmx::ServesCC(jmx::kKernelTable[i], cc)) continue;
    cudaError_t err = jmx::kKernelTable[i].load(device);
    if (err != cudaSuccess) return static_cast<int>(err);
  }
  return 0;
}

// The XLA FFI targets this library defines (each also an exported handler symbol of the same name), so
// that the Python loader registers exactly what the built library has instead of a hand-kept list.
extern "C" int jax_mxfp8_ffi_target_count() { return jmx::FfiTargetCount(); }
// The name of target i, or NULL out of range.
extern "C" const char* jax_mxfp8_ffi_target_name(int i) { return jmx::FfiTargetName(i); }
// The address of target i's handler (the same as the exported symbol of that name), or NULL out of range.
extern "C" void* jax_mxfp8_ffi_target_handler(int i) { return jmx::FfiTargetHandler(i); }

// What the library was built from, as "key=value" pairs separated by ';': the XLA FFI API version of the
// headers, the jaxlib and CuTe DSL versions (defined by tools/build_library.py), the CUDA runtime it links
// statically and the compiler.
#ifndef JMX_BUILD_JAXLIB
#define JMX_BUILD_JAXLIB "unknown"
#endif
#ifndef JMX_BUILD_CUTLASS_DSL
#define JMX_BUILD_CUTLASS_DSL "unknown"
#endif
#define JMX_STR_(x) #x
#define JMX_STR(x) JMX_STR_(x)
extern "C" const char* jax_mxfp8_build_info() {
  return "ffi_api=" JMX_STR(XLA_FFI_API_MAJOR) "." JMX_STR(XLA_FFI_API_MINOR) ";jaxlib=" JMX_BUILD_JAXLIB
         ";cutlass_dsl=" JMX_BUILD_CUTLASS_DSL ";cuda_runtime=" JMX_STR(CUDART_VERSION) ";compiler=gcc " __VERSION__;
}

#pragma GCC visibility pop
