// jax_mxfp8._lib._jax_mxfp8_ext: the Python-facing binding of the kernel library (pybind11), built per
// Python version by tools/build_library.py next to libjax_mxfp8_kernels.so, which it links (NEEDED, rpath
// $ORIGIN). The FFI handler library itself stays free of Python's ABI: this module only reads its C ABI
// (csrc/library.cc) and hands Python what it needs, as TransformerEngine-JAX's registrations() does:
//
//   registrations() -> dict[str, PyCapsule]   FFI target name -> its XLA_FFI_Handler* (for jax.ffi)
//   kernels() -> list[tuple[str, int]]        the kernel table: (variant name, arch major) per row
//   build_info() -> dict[str, str]            what the library was built from (FFI API, jaxlib, DSL, ...)
//   preload(device: int) -> int               load every module for device's arch (cudaError_t, 0 = ok)
//
// jax_mxfp8/primitives/library.py uses it when present; without it the loader does the same by name
// with ctypes.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <utility>
#include <vector>

extern "C" {
int jax_mxfp8_ffi_target_count();
const char* jax_mxfp8_ffi_target_name(int i);
void* jax_mxfp8_ffi_target_handler(int i);
int jax_mxfp8_kernel_count();
const char* jax_mxfp8_kernel_name(int i);
int jax_mxfp8_kernel_arch(int i);
const char* jax_mxfp8_build_info();
int jax_mxfp8_preload(int device);
}

namespace py = pybind11;

namespace {

py::dict Registrations() {
  py::dict out;
  for (int i = 0; i < jax_mxfp8_ffi_target_count(); ++i) {
    // An unnamed capsule, as jax.ffi.pycapsule makes.
    out[py::str(jax_mxfp8_ffi_target_name(i))] = py::capsule(jax_mxfp8_ffi_target_handler(i));
  }
  return out;
}

std::vector<std::pair<std::string, int>> Kernels() {
  std::vector<std::pair<std::string, int>> out;
  for (int i = 0; i < jax_mxfp8_kernel_count(); ++i) out.emplace_back(jax_mxfp8_kernel_name(i), jax_mxfp8_kernel_arch(i));
  return out;
}

py::dict BuildInfo() {
  py::dict out;
  const std::string info = jax_mxfp8_build_info();
  size_t start = 0;
  while (start < info.size()) {
    size_t end = info.find(';', start);
    if (end == std::string::npos) end = info.size();
    const std::string item = info.substr(start, end - start);
    const size_t eq = item.find('=');
    if (eq != std::string::npos) out[py::str(item.substr(0, eq))] = py::str(item.substr(eq + 1));
    start = end + 1;
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(_jax_mxfp8_ext, m) {
  m.doc() = "Python binding of the jax_mxfp8 kernel library (libjax_mxfp8_kernels.so)";
  m.def("registrations", &Registrations, "FFI target name -> PyCapsule of its XLA FFI handler");
  m.def("kernels", &Kernels, "(variant name, arch major) of every row of the kernel table");
  m.def("build_info", &BuildInfo, "what the library was built from");
  m.def("preload", &jax_mxfp8_preload, py::arg("device"), "load every module for the device's arch");
}
