// Implementation of csrc/common.h: module loading, variant lookup, launches, buffer checks and the FFI
// target list.
#include "common.h"

#include <sstream>
#include <vector>

namespace jmx {

namespace {
thread_local cudaError_t tls_dsl_error = cudaSuccess;

std::string CudaMessage(const char* what, cudaError_t err) {
  std::ostringstream os;
  os << what << ": " << cudaGetErrorName(err) << " (" << cudaGetErrorString(err) << ")";
  return os.str();
}
}  // namespace

void RecordDslError(cudaError_t err) {
  if (err != cudaSuccess && tls_dsl_error == cudaSuccess) tls_dsl_error = err;
}

cudaError_t TakeDslError() {
  cudaError_t err = tls_dsl_error;
  tls_dsl_error = cudaSuccess;
  return err;
}

cudaError_t LoadModule(ModuleSlot& slot, int device, DslInitFn init, DslInitFn load_to_device) {
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
  std::lock_guard<std::mutex> lock(slot.mu);
  if (!slot.initialized) {
    // Mirrors the DSL header's <prefix>_Kernel_Module_Load, but per device and with errors returned.
    cudaLibrary_t* library_ptr = &slot.library;
    cudaError_t ret = cudaSuccess;
    struct {
      cudaLibrary_t** library_ptr;
      cudaError_t* ret;
    } init_args = {&library_ptr, &ret};
    init(reinterpret_cast<void**>(&init_args));
    slot.initialized = true;
    slot.init_error = ret;
  }
  if (slot.init_error != cudaSuccess) return slot.init_error;
  if (slot.loaded[device]) return cudaSuccess;
  cudaLibrary_t* library_ptr = &slot.library;
  int32_t device_id = device;
  cudaError_t ret = cudaSuccess;
  struct {
    cudaLibrary_t** library;
    int32_t* device_id;
    cudaError_t* ret;
  } load_args = {&library_ptr, &device_id, &ret};
  load_to_device(reinterpret_cast<void**>(&load_args));
  if (ret == cudaSuccess) slot.loaded[device] = true;
  return ret;
}

namespace {
// A per-device integer attribute; `read` returns it (never 0 for a real device: 0 marks "not read yet").
template <typename Read>
ffi::Error Cached(int device, int cache[kMaxDevices], std::mutex& mu, Read read, int* value) {
  if (device < 0 || device >= kMaxDevices) {
    return ffi::Error::InvalidArgument("jax_mxfp8: device ordinal " + std::to_string(device) + " out of range");
  }
  std::lock_guard<std::mutex> lock(mu);
  if (cache[device] == 0) {
    int v = 0;
    cudaError_t err = read(&v);
    if (err != cudaSuccess) return ffi::Error::Internal(CudaMessage("jax_mxfp8: cudaDeviceGetAttribute", err));
    cache[device] = v;
  }
  *value = cache[device];
  return ffi::Error::Success();
}

std::string CCName(int cc) { return std::to_string(cc / 10) + "." + std::to_string(cc % 10); }

// "sm_90a (cc 9.0)" for a row.
std::string ArchCCs(const KernelEntry& e) {
  std::string out = std::string(e.arch) + " (cc ";
  for (int i = 0; i < kMaxCcs && e.ccs[i] != 0; ++i) out += (i ? ", " : "") + CCName(e.ccs[i]);
  return out + ")";
}
}  // namespace

ffi::Error DeviceCC(int device, int* cc) {
  static std::mutex mu;
  static int cache[kMaxDevices] = {};
  return Cached(device, cache, mu, [device](int* v) {
    int major = 0, minor = 0;
    cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    *v = 10 * major + minor;
    return err;
  }, cc);
}

ffi::Error DeviceSMs(int device, int* sms) {
  static std::mutex mu;
  static int cache[kMaxDevices] = {};
  return Cached(device, cache, mu, [device](int* v) {
    return cudaDeviceGetAttribute(v, cudaDevAttrMultiProcessorCount, device);
  }, sms);
}

bool ServesCC(const KernelEntry& entry, int cc) {
  for (int i = 0; i < kMaxCcs && entry.ccs[i] != 0; ++i) {
    if (entry.ccs[i] == cc) return true;
  }
  return false;
}

ffi::Error FindKernel(int device, std::string_view op, std::string_view name, const KernelEntry** entry) {
  int cc = 0;
  if (auto err = DeviceCC(device, &cc); err.failure()) return err;
  const KernelEntry* other_arch = nullptr;
  for (int i = 0; i < kKernelTableSize; ++i) {
    const KernelEntry& e = kKernelTable[i];
    if (name != e.name) continue;
    if (op != e.op) {  // a name is one variant, hence one op, on every arch
      std::ostringstream os;
      os << "jax_mxfp8: kernel '" << name << "' is a " << e.op << " kernel, not " << op << " (compute capability "
         << CCName(cc) << ")";
      return ffi::Error::InvalidArgument(os.str());
    }
    if (ServesCC(e, cc)) {
      *entry = &e;
      return ffi::Error::Success();
    }
    other_arch = &e;
  }
  std::ostringstream os;
  if (other_arch != nullptr) {
    os << "jax_mxfp8: " << op << " kernel '" << name << "' is not compiled for compute capability " << CCName(cc)
       << " (built for " << ArchCCs(*other_arch) << "; the library covers sm_90a: cc 9.0 and sm_100f: cc 10.0, 10.3";
    if (cc / 10 == 12) os << "; consumer Blackwell (sm_120) has no tcgen05 block-scaled MMA and is not supported";
    os << "), use implementation='xla'";
    return ffi::Error(ffi::ErrorCode::kUnimplemented, os.str());
  }
  os << "jax_mxfp8: no " << op << " kernel named '" << name << "' in this library (compute capability "
     << CCName(cc) << "); the attribute `kernel` takes a jax_mxfp8.kernels.registry variant name";
  return ffi::Error::InvalidArgument(os.str());
}

int64_t Param(const KernelEntry* entry, std::string_view name) {
  for (int i = 0; i < entry->n_params; ++i) {
    if (name == entry->params[i].name) return entry->params[i].value;
  }
  return kNoParam;
}

ffi::Error Launch(const KernelEntry* entry, int device, const TensorView* tensors, int n, cudaStream_t stream,
                  const float* scalars, int n_scalars, const int32_t* ints, int n_ints) {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != device) {
    cudaError_t err = cudaSetDevice(device);
    if (err != cudaSuccess) return ffi::Error::Internal(CudaMessage("jax_mxfp8: cudaSetDevice", err));
  }
  if (cudaError_t load_err = entry->load(device); load_err != cudaSuccess) {
    return ffi::Error::Internal(CudaMessage((std::string("jax_mxfp8: loading kernel ") + entry->name).c_str(), load_err));
  }
  (void)TakeDslError();
  cudaError_t err = entry->launch(tensors, n, scalars, n_scalars, ints, n_ints, stream);
  if (err == cudaSuccess) err = TakeDslError();
  if (err == cudaSuccess) err = cudaGetLastError();
  if (err != cudaSuccess) {
    return ffi::Error::Internal(CudaMessage((std::string("jax_mxfp8: launching ") + entry->name).c_str(), err));
  }
  return ffi::Error::Success();
}

namespace {
// DTypeCode of a buffer dtype, -1 for dtypes no kernel takes.
int64_t CodeOf(ffi::DataType dtype) {
  switch (dtype) {
    case ffi::DataType::BF16:
      return kBF16;
    case ffi::DataType::F32:
      return kF32;
    case ffi::DataType::F8E4M3FN:
      return kE4M3;
    case ffi::DataType::F8E5M2:
      return kE5M2;
    case ffi::DataType::F16:
      return kF16;
    default:
      return -1;
  }
}

const char* CodeName(int64_t code) {
  static const char* const kNames[] = {"bf16", "f32", "f8e4m3fn", "f8e5m2", "f16"};
  return (code >= 0 && code < 5) ? kNames[code] : "(none)";
}
}  // namespace

ffi::Error ExpectDType(const KernelEntry* entry, const char* param, ffi::DataType got, const char* what) {
  const int64_t want = Param(entry, param);
  if (CodeOf(got) == want && want != kNoParam) return ffi::Error::Success();
  return ffi::Error::InvalidArgument(std::string("jax_mxfp8: ") + what + " has dtype " + DTypeName(got) +
                                     ", but kernel '" + entry->name + "' takes " + CodeName(want) + " (its " +
                                     param + ")");
}

ffi::Error Want(bool ok, std::string_view op, const std::string& msg) {
  if (ok) return ffi::Error::Success();
  return ffi::Error::InvalidArgument("jax_mxfp8: " + std::string(op) + ": " + msg);
}

ffi::Error Dims(const ffi::AnyBuffer& buffer, std::string_view op, const char* what, size_t rank, int64_t* out) {
  auto d = buffer.dimensions();
  if (d.size() != rank) {
    return Want(false, op,
                std::string(what) + " must have rank " + std::to_string(rank) + ", got " + std::to_string(d.size()));
  }
  for (size_t i = 0; i < rank; ++i) out[i] = d[i];
  return ffi::Error::Success();
}

std::string DTypeName(ffi::DataType dtype) {
  std::ostringstream os;
  os << dtype;
  return os.str();
}

namespace {
ffi::Error View2D(void* data, ffi::AnyBuffer::Dimensions dims, const char* what, TensorView* out) {
  if (dims.size() < 2) {
    return ffi::Error::InvalidArgument(std::string("jax_mxfp8: ") + what + " must have rank >= 2, got rank " +
                                       std::to_string(dims.size()));
  }
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < dims.size(); ++i) rows *= dims[i];
  int64_t cols = dims[dims.size() - 1];
  if (rows > INT32_MAX || cols > INT32_MAX) {
    return ffi::Error::InvalidArgument(std::string("jax_mxfp8: ") + what + " is too large for the kernels (" +
                                       std::to_string(rows) + " x " + std::to_string(cols) + ")");
  }
  if (reinterpret_cast<uintptr_t>(data) % 16 != 0) {
    return ffi::Error::InvalidArgument(std::string("jax_mxfp8: ") + what + " is not 16-byte aligned");
  }
  *out = TensorView{data, static_cast<int32_t>(rows), static_cast<int32_t>(cols)};
  return ffi::Error::Success();
}
}  // namespace

ffi::Error As2D(const ffi::AnyBuffer& buffer, const char* what, TensorView* out) {
  return View2D(buffer.untyped_data(), buffer.dimensions(), what, out);
}

ffi::Error As2D(ffi::Result<ffi::AnyBuffer>& buffer, const char* what, TensorView* out) {
  return View2D(buffer->untyped_data(), buffer->dimensions(), what, out);
}

namespace {
ffi::Error View3D(void* data, ffi::AnyBuffer::Dimensions dims, const char* what, TensorView* out) {
  if (dims.size() < 3) {
    return ffi::Error::InvalidArgument(std::string("jax_mxfp8: ") + what + " must have rank >= 3, got rank " +
                                       std::to_string(dims.size()));
  }
  int64_t rows = 1;
  for (size_t i = 1; i + 1 < dims.size(); ++i) rows *= dims[i];
  const int64_t batch = dims[0], cols = dims[dims.size() - 1];
  if (batch > INT32_MAX || rows > INT32_MAX || cols > INT32_MAX || batch * rows > INT32_MAX) {
    return ffi::Error::InvalidArgument(std::string("jax_mxfp8: ") + what + " is too large for the kernels (" +
                                       std::to_string(batch) + " x " + std::to_string(rows) + " x " +
                                       std::to_string(cols) + ")");
  }
  if (reinterpret_cast<uintptr_t>(data) % 16 != 0) {
    return ffi::Error::InvalidArgument(std::string("jax_mxfp8: ") + what + " is not 16-byte aligned");
  }
  *out = TensorView{data, static_cast<int32_t>(rows), static_cast<int32_t>(cols), static_cast<int32_t>(batch)};
  return ffi::Error::Success();
}
}  // namespace

ffi::Error As3D(const ffi::AnyBuffer& buffer, const char* what, TensorView* out) {
  return View3D(buffer.untyped_data(), buffer.dimensions(), what, out);
}

ffi::Error As3D(ffi::Result<ffi::AnyBuffer>& buffer, const char* what, TensorView* out) {
  return View3D(buffer->untyped_data(), buffer->dimensions(), what, out);
}

ffi::Error Expect(const TensorView& t, ffi::DataType got, ffi::DataType want, int64_t rows, int64_t cols,
                  const char* what) {
  if (got != want) {
    return ffi::Error::InvalidArgument(std::string("jax_mxfp8: ") + what + " has dtype " + DTypeName(got) +
                                       ", expected " + DTypeName(want));
  }
  if (t.rows != rows || t.cols != cols) {
    std::ostringstream os;
    os << "jax_mxfp8: " << what << " is " << t.rows << " x " << t.cols << " (leading axes flattened), expected "
       << rows << " x " << cols;
    return ffi::Error::InvalidArgument(os.str());
  }
  return ffi::Error::Success();
}

namespace {
// Function-local so that registration from other files' static initializers never sees it unconstructed.
std::vector<std::pair<const char*, void*>>& FfiTargets() {
  static std::vector<std::pair<const char*, void*>> targets;
  return targets;
}
}  // namespace

void RegisterFfiTarget(const char* name, void* handler) { FfiTargets().emplace_back(name, handler); }

int FfiTargetCount() { return static_cast<int>(FfiTargets().size()); }

const char* FfiTargetName(int i) { return (i >= 0 && i < FfiTargetCount()) ? FfiTargets()[i].first : nullptr; }

void* FfiTargetHandler(int i) { return (i >= 0 && i < FfiTargetCount()) ? FfiTargets()[i].second : nullptr; }

}  // namespace jmx
