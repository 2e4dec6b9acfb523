// XLA FFI handlers for the Blackwell MXFP8 attention backward (registry ops "attention_bwd_prepass_sm100" and
// "attention_bwd_sm100"; kernels jax_mxfp8/kernels/sm100/attention_bwd_prepass.py and attention_bwd.py, cubins
// for sm_100f: compute capability 10.0 and 10.3). NOT RUN ON HARDWARE by this project.
//
//   jax_mxfp8_attention_bwd_prepass_sm100  (do, o, dlse, lens | seqs, query_tiles) -> (do_q, do_sf_hd, do_sf_seq,
//                                          delta)
//   jax_mxfp8_attention_bwd_sm100          (q, q_sf_hd, q_sf_seq, k, k_sf_hd, k_sf_seq, v, v_sf_hd, do, do_sf_hd,
//                                          do_sf_seq, lse, delta, lens | seqs, key_tiles)
//                                          -> ([dq_sem,] dq, dk, dv)                       dkv "float32"
//                                          -> ([dq_sem,] dq, dk_row, dk_row_scale, dk_col, dk_col_scale,
//                                              dv_row, dv_row_scale, dv_col, dv_col_scale)  dkv "mx"
//   <target>_into: the results passed in as operands too (aliased): the NaN-poisoning test hooks.
// Attributes: kernel (string) = the registry variant name (AttentionBwdPrepassConfig / AttentionBwdSm100Config
// .name); the backward also scale (tau), scale_log2 (float32(tau log2 e)), dq_scale (tau 2^e for dq_accum
// "fp16", tau otherwise), float32.
//
// Buffers (docs/interfaces.md "sm100 attention"; the handler passes each as the 2-D row-major view the
// kernels take: data (B, L, heads, H) -> (B L, heads H), blocked scales (B, heads, C, 1, 512) or
// (B, heads, 1, C, 512) -> (B heads, C 512), statistics (B, N, T) -> (B N, T)):
//   q (Bq, T, N, H), k, v (B, S, K, H), do (B, T, N, H) f8e4m3fn; Bq = B, or 1 (broadcast q)
//   *_sf_hd (Bx, heads, C, 1, 512), *_sf_seq (Bx, heads, 1, C, 512) u8; C = ceil(L / 128), packed: the tables'
//   lse, delta (B, N, T) f32; lens (2, B) i32 (dense) or seqs (6, S), key_tiles / query_tiles (2, C) i32
//   dq_sem (B, N, Cq) i32 (deterministic); dq (Bq, T, N, H) f32, or f16 (dQ 2^e) for dq_accum "fp16"
//   dk, dv (B, S, K, H) f32; dkv "mx": dk_row, dk_col (B S, K H) f8e4m3fn, dk_row_scale (B S, K H / 32),
//   dk_col_scale (B S / 32, K H) u8, the same for dv
//   pre-pass: do, o (B, T, N, H) the variant's in_dtype; dlse, delta (B, N, T) f32; do_q (B, T, N, H) f8e4m3fn,
//   do_sf_hd, do_sf_seq as above.
// dq and dq_sem are accumulated by the kernel: the handler zero-fills them first (cudaMemsetAsync on XLA's
// stream). The packed pre-pass's scale outputs are zero-filled too (chunks no work item visits). Every
// failure is returned as an ffi::Error; the handler only enqueues work on XLA's stream (CUDA-graph compatible).
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common.h"

namespace jmx {
namespace {

constexpr std::string_view kOpBwd = "attention_bwd_sm100";           // registry AttentionBwdSm100Config.op
constexpr std::string_view kOpPrepass = "attention_bwd_prepass_sm100";  // registry AttentionBwdPrepassConfig.op
constexpr int64_t kTile = 128;
constexpr int64_t kChunk = 512;
constexpr int64_t kBlock = 32;
constexpr int64_t kInt32Max = 2147483647;
constexpr int kMaxTensors = 24;

int64_t Tiles(int64_t x) { return (x + kTile - 1) / kTile; }

std::string Shape(const std::vector<int64_t>& d) {
  std::string out = "(";
  for (size_t i = 0; i < d.size(); ++i) out += (i ? ", " : "") + std::to_string(d[i]);
  return out + ")";
}

// One buffer of the call (operand or result): its data, dtype and dimensions.
struct Buf {
  void* data;
  ffi::DataType dtype;
  std::vector<int64_t> dims;
};

Buf FromArg(const ffi::AnyBuffer& b) {
  auto d = b.dimensions();
  return Buf{b.untyped_data(), b.element_type(), std::vector<int64_t>(d.begin(), d.end())};
}

Buf FromRet(ffi::Result<ffi::AnyBuffer>& b) {
  auto d = b->dimensions();
  return Buf{b->untyped_data(), b->element_type(), std::vector<int64_t>(d.begin(), d.end())};
}

int64_t Bytes(const Buf& b) {
  int64_t n = ffi::ByteWidth(b.dtype);
  for (int64_t d : b.dims) n *= d;
  return n;
}

// Collects the tensor views in the kernel's argument order, checking each buffer's dtype and exact shape.
class Views {
 public:
  Views(std::string_view op, const std::string& kernel) : op_(op), kernel_(kernel) {}

  // `b` must have dtype `want` and dimensions `shape`; viewed as (prod(shape[:split]), prod(shape[split:])).
  ffi::Error Add(const Buf& b, const char* what, ffi::DataType want, const std::vector<int64_t>& shape,
                 size_t split) {
    if (b.dims != shape) {
      return Fail(std::string(what) + " is " + Shape(b.dims) + ", expected " + Shape(shape));
    }
    if (b.dtype != want) {
      return Fail(std::string(what) + " has dtype " + DTypeName(b.dtype) + ", expected " + DTypeName(want));
    }
    int64_t rows = 1, cols = 1;
    for (size_t i = 0; i < shape.size(); ++i) (i < split ? rows : cols) *= shape[i];
    if (rows > kInt32Max || cols > kInt32Max) return Fail(std::string(what) + " is too large for the kernel");
    if (reinterpret_cast<uintptr_t>(b.data) % 16 != 0) return Fail(std::string(what) + " is not 16-byte aligned");
    if (n_ == kMaxTensors) return Fail("internal: too many tensors");
    t_[n_++] = TensorView{b.data, static_cast<int32_t>(rows), static_cast<int32_t>(cols), 1};
    return ffi::Error::Success();
  }

  ffi::Error Fail(const std::string& msg) const { return Want(false, op_, "kernel '" + kernel_ + "': " + msg); }
  const TensorView* data() const { return t_; }
  int size() const { return n_; }

 private:
  std::string_view op_;
  std::string kernel_;
  TensorView t_[kMaxTensors];
  int n_ = 0;
};

ffi::Error ZeroFill(const Buf& b, cudaStream_t stream, std::string_view op, const char* what) {
  const int64_t bytes = Bytes(b);
  if (bytes == 0) return ffi::Error::Success();
  cudaError_t err = cudaMemsetAsync(b.data, 0, static_cast<size_t>(bytes), stream);
  return Want(err == cudaSuccess, op, std::string("zero-filling ") + what + " failed: " + cudaGetErrorString(err));
}

ffi::DataType InDType(int64_t code) {
  return code == kBF16 ? ffi::DataType::BF16 : code == kF32 ? ffi::DataType::F32 : ffi::DataType::INVALID;
}

// The sequence tables at in[at]: lens (2, B) (dense), or seqs (6, S) and the work list (2, chunks) (packed).
ffi::Error AddTables(Views& v, const std::vector<Buf>& in, size_t at, bool packed, int64_t b, int64_t chunks,
                     const char* work) {
  const ffi::DataType s32 = ffi::DataType::S32;
  if (!packed) return v.Add(in[at], "lens", s32, {2, b}, 1);
  if (in[at].dims.size() != 2 || in[at].dims[0] != 6) {
    return v.Fail("seqs is " + Shape(in[at].dims) + ", expected (6, S) (attention_sm100_packed.packed_tables)");
  }
  JMX_RETURN_IF_ERROR(v.Add(in[at], "seqs", s32, in[at].dims, 1));
  return v.Add(in[at + 1], work, s32, {2, chunks}, 1);
}

// ------------------------------------------------------------------------------------------------ pre-pass
ffi::Error RunPrepass(cudaStream_t stream, int32_t device, std::string_view kernel, const std::vector<Buf>& in,
                      const std::vector<Buf>& out) {
  const KernelEntry* entry = nullptr;
  JMX_RETURN_IF_ERROR(FindKernel(device, kOpPrepass, kernel, &entry));
  Views v(kOpPrepass, entry->name);
  const bool packed = Param(entry, "packed") == 1;
  const int64_t h = Param(entry, "head_dim");
  const size_t n_in = packed ? 5 : 4;
  if (in.size() != n_in || out.size() != 4) {
    return v.Fail("takes " + std::to_string(n_in) + " operands and 4 results, got " + std::to_string(in.size()) +
                  " and " + std::to_string(out.size()));
  }
  const Buf& d = in[0];
  if (d.dims.size() != 4 || d.dims[3] != h) return v.Fail("do is " + Shape(d.dims) + ", expected (B, T, N, H)");
  const int64_t b = d.dims[0], t = d.dims[1], n = d.dims[2];
  if (packed && b != 1) return v.Fail("packed operands have batch 1, got do " + Shape(d.dims));
  const int64_t chunks = packed ? (in[4].dims.size() == 2 ? in[4].dims[1] : -1) : Tiles(t);
  const ffi::DataType x = InDType(Param(entry, "in_dtype")), f32 = ffi::DataType::F32, u8 = ffi::DataType::U8;
  JMX_RETURN_IF_ERROR(v.Add(in[0], "do", x, {b, t, n, h}, 2));
  JMX_RETURN_IF_ERROR(v.Add(in[1], "o", x, {b, t, n, h}, 2));
  JMX_RETURN_IF_ERROR(v.Add(in[2], "dlse", f32, {b, n, t}, 2));
  JMX_RETURN_IF_ERROR(AddTables(v, in, 3, packed, b, chunks, "query_tiles"));
  JMX_RETURN_IF_ERROR(v.Add(out[0], "do_q", ffi::DataType::F8E4M3FN, {b, t, n, h}, 2));
  JMX_RETURN_IF_ERROR(v.Add(out[1], "do_sf_hd", u8, {b, n, chunks, 1, kChunk}, 2));
  JMX_RETURN_IF_ERROR(v.Add(out[2], "do_sf_seq", u8, {b, n, 1, chunks, kChunk}, 2));
  JMX_RETURN_IF_ERROR(v.Add(out[3], "delta", f32, {b, n, t}, 2));
  if (b * t * n * h >= kInt32Max) return v.Fail("operands of 2^31 elements or more (the kernel's 32-bit offsets)");
  if (packed) {
    JMX_RETURN_IF_ERROR(ZeroFill(out[1], stream, kOpPrepass, "do_sf_hd"));
    JMX_RETURN_IF_ERROR(ZeroFill(out[2], stream, kOpPrepass, "do_sf_seq"));
  }
  if (b == 0 || t == 0 || n == 0 || chunks == 0) return ffi::Error::Success();
  return Launch(entry, device, v.data(), v.size(), stream);
}

// ------------------------------------------------------------------------------------------------ backward
ffi::Error RunBwd(cudaStream_t stream, int32_t device, std::string_view kernel, const std::vector<Buf>& in,
                  const std::vector<Buf>& out, float scale, float scale_log2, float dq_scale) {
  const KernelEntry* entry = nullptr;
  JMX_RETURN_IF_ERROR(FindKernel(device, kOpBwd, kernel, &entry));
  Views v(kOpBwd, entry->name);
  const bool packed = Param(entry, "packed") == 1, det = Param(entry, "deterministic") == 1;
  const bool mx = Param(entry, "dkv") == 1, fp16 = Param(entry, "dq_accum") == 1;
  const int64_t h = Param(entry, "head_dim");
  const size_t n_in = packed ? 15 : 14, n_out = (det ? 1 : 0) + (mx ? 9 : 3);
  if (in.size() != n_in || out.size() != n_out) {
    return v.Fail("takes " + std::to_string(n_in) + " operands and " + std::to_string(n_out) + " results, got " +
                  std::to_string(in.size()) + " and " + std::to_string(out.size()));
  }
  const Buf &q = in[0], &k = in[3], &d = in[8];
  for (const auto& [buf, name] : {std::pair<const Buf*, const char*>{&q, "q"}, {&k, "k"}, {&d, "do"}}) {
    if (buf->dims.size() != 4 || buf->dims[3] != h) {
      return v.Fail(std::string(name) + " is " + Shape(buf->dims) + ", expected rank 4 with head_dim " +
                    std::to_string(h));
    }
  }
  const int64_t b = d.dims[0], t = d.dims[1], n = d.dims[2], s = k.dims[1], n_kv = k.dims[2], bq = q.dims[0];
  if (n_kv <= 0 || n % n_kv) return v.Fail("N = " + std::to_string(n) + " must be a multiple of K = " + std::to_string(n_kv));
  if (bq != b && bq != 1) return v.Fail("q's batch " + std::to_string(bq) + " must be 1 or B = " + std::to_string(b));
  if (bq != b && (fp16 || det || packed)) return v.Fail("broadcast q (batch 1) needs a float32, non-deterministic dense variant");
  if (packed && b != 1) return v.Fail("packed operands have batch 1, got do " + Shape(d.dims));
  if (!packed && Tiles(s) > 65535) return v.Fail("more than 65535 key tiles (the grid's z dimension)");
  if (mx && s % kBlock) return v.Fail("dkv 'mx' needs S a multiple of 32, got " + std::to_string(s));
  if ((b * t * n > kInt32Max / h) || (b * s * n_kv > kInt32Max / h)) {
    return v.Fail("operands of 2^31 elements or more (the kernel's 32-bit offsets)");
  }
  int64_t cq = Tiles(t), ck = Tiles(s);
  if (packed) {  // the chunk counts are the tables': n_chunks_q (q's scales), n_chunks_k (key_tiles)
    const auto& sf = in[1].dims;
    cq = sf.size() == 5 ? sf[2] : -1;
    ck = in[14].dims.size() == 2 ? in[14].dims[1] : -1;
  }
  const ffi::DataType e4m3 = ffi::DataType::F8E4M3FN, u8 = ffi::DataType::U8, f32 = ffi::DataType::F32;
  JMX_RETURN_IF_ERROR(v.Add(in[0], "q", e4m3, {bq, t, n, h}, 2));
  JMX_RETURN_IF_ERROR(v.Add(in[1], "q_sf_hd", u8, {bq, n, cq, 1, kChunk}, 2));
  JMX_RETURN_IF_ERROR(v.Add(in[2], "q_sf_seq", u8, {bq, n, 1, cq, kChunk}, 2));
  JMX_RETURN_IF_ERROR(v.Add(in[3], "k", e4m3, {b, s, n_kv, h}, 2));
  JMX_RETURN_IF_ERROR(v.Add(in[4], "k_sf_hd", u8, {b, n_kv, ck, 1, kChunk}, 2));
  JMX_RETURN_IF_ERROR(v.Add(in[5], "k_sf_seq", u8, {b, n_kv, 1, ck, kChunk}, 2));
  JMX_RETURN_IF_ERROR(v.Add(in[6], "v", e4m3, {b, s, n_kv, h}, 2));
  JMX_RETURN_IF_ERROR(v.Add(in[7], "v_sf_hd", u8, {b, n_kv, ck, 1, kChunk}, 2));
  JMX_RETURN_IF_ERROR(v.Add(in[8], "do", e4m3, {b, t, n, h}, 2));
  JMX_RETURN_IF_ERROR(v.Add(in[9], "do_sf_hd", u8, {b, n, cq, 1, kChunk}, 2));
  JMX_RETURN_IF_ERROR(v.Add(in[10], "do_sf_seq", u8, {b, n, 1, cq, kChunk}, 2));
  JMX_RETURN_IF_ERROR(v.Add(in[11], "lse", f32, {b, n, t}, 2));
  JMX_RETURN_IF_ERROR(v.Add(in[12], "delta", f32, {b, n, t}, 2));
  JMX_RETURN_IF_ERROR(AddTables(v, in, 13, packed, b, ck, "key_tiles"));
  size_t r = 0;
  if (det) JMX_RETURN_IF_ERROR(v.Add(out[r++], "dq_sem", ffi::DataType::S32, {b, n, cq}, 2));
  const size_t dq_at = r;
  JMX_RETURN_IF_ERROR(v.Add(out[r++], "dq", fp16 ? ffi::DataType::F16 : f32, {bq, t, n, h}, 2));
  if (mx) {
    const int64_t f = n_kv * h;
    for (const char* g : {"dk", "dv"}) {
      const std::string name(g);
      JMX_RETURN_IF_ERROR(v.Add(out[r++], (name + "_row").c_str(), e4m3, {b * s, f}, 1));
      JMX_RETURN_IF_ERROR(v.Add(out[r++], (name + "_row_scale").c_str(), u8, {b * s, f / kBlock}, 1));
      JMX_RETURN_IF_ERROR(v.Add(out[r++], (name + "_col").c_str(), e4m3, {b * s, f}, 1));
      JMX_RETURN_IF_ERROR(v.Add(out[r++], (name + "_col_scale").c_str(), u8, {b * s / kBlock, f}, 1));
    }
  } else {
    JMX_RETURN_IF_ERROR(v.Add(out[r++], "dk", f32, {b, s, n_kv, h}, 2));
    JMX_RETURN_IF_ERROR(v.Add(out[r++], "dv", f32, {b, s, n_kv, h}, 2));
  }
  if (det) JMX_RETURN_IF_ERROR(ZeroFill(out[0], stream, kOpBwd, "dq_sem"));
  JMX_RETURN_IF_ERROR(ZeroFill(out[dq_at], stream, kOpBwd, "dq"));
  if (b == 0 || t == 0 || n == 0 || s == 0 || cq == 0 || ck == 0) {  // no work: every gradient is zero
    for (size_t i = dq_at + 1; i < out.size(); ++i) JMX_RETURN_IF_ERROR(ZeroFill(out[i], stream, kOpBwd, "dk / dv"));
    return ffi::Error::Success();
  }
  const float scalars[3] = {scale, scale_log2, dq_scale};
  return Launch(entry, device, v.data(), v.size(), stream, scalars, 3);
}

// One target: the operands (and, kInto, the results again, aliased: only the first n - rets are read).
template <bool kInto>
ffi::Error Split(ffi::RemainingArgs args, ffi::RemainingRets rets, std::vector<Buf>* in, std::vector<Buf>* out) {
  for (size_t i = 0; i < rets.size(); ++i) {
    auto buffer = rets.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    out->push_back(FromRet(*buffer));
  }
  const size_t n_in = args.size() - (kInto ? std::min(args.size(), rets.size()) : 0);
  for (size_t i = 0; i < n_in; ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    in->push_back(FromArg(*buffer));
  }
  return ffi::Error::Success();
}

template <bool kInto>
ffi::Error HandlePrepass(cudaStream_t stream, int32_t device, ffi::RemainingArgs args, ffi::RemainingRets rets,
                         std::string_view kernel) {
  std::vector<Buf> in, out;
  JMX_RETURN_IF_ERROR(Split<kInto>(args, rets, &in, &out));
  return RunPrepass(stream, device, kernel, in, out);
}

template <bool kInto>
ffi::Error HandleBwd(cudaStream_t stream, int32_t device, ffi::RemainingArgs args, ffi::RemainingRets rets,
                     std::string_view kernel, float scale, float scale_log2, float dq_scale) {
  std::vector<Buf> in, out;
  JMX_RETURN_IF_ERROR(Split<kInto>(args, rets, &in, &out));
  return RunBwd(stream, device, kernel, in, out, scale, scale_log2, dq_scale);
}

auto PrepassBinding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::PlatformStream<cudaStream_t>>()
      .Ctx<ffi::DeviceOrdinal>()
      .RemainingArgs()
      .RemainingRets()
      .Attr<std::string_view>("kernel");
}

auto BwdBinding() {
  return PrepassBinding().Attr<float>("scale").Attr<float>("scale_log2").Attr<float>("dq_scale");
}

constexpr auto kPrepass = &HandlePrepass<false>;
constexpr auto kPrepassInto = &HandlePrepass<true>;
constexpr auto kBwd = &HandleBwd<false>;
constexpr auto kBwdInto = &HandleBwd<true>;

}  // namespace
}  // namespace jmx

namespace ffi = xla::ffi;

#pragma GCC visibility push(default)

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_attention_bwd_prepass_sm100, jmx::kPrepass, jmx::PrepassBinding(), {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_attention_bwd_prepass_sm100);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_attention_bwd_prepass_sm100_into, jmx::kPrepassInto, jmx::PrepassBinding(), {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_attention_bwd_prepass_sm100_into);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_attention_bwd_sm100, jmx::kBwd, jmx::BwdBinding(), {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_attention_bwd_sm100);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_attention_bwd_sm100_into, jmx::kBwdInto, jmx::BwdBinding(), {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_attention_bwd_sm100_into);

#pragma GCC visibility pop
