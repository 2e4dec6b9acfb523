// XLA FFI handlers for the Blackwell MXFP8 attention forward (jax_mxfp8/kernels/sm100/attention_fwd.py, registry
// op "attention_fwd_sm100", cubins for sm_100f: compute capability 10.0 and 10.3). NOT RUN ON HARDWARE by this
// project.
//
//   jax_mxfp8_attention_fwd_sm100         (q, q_sf_hd, k, k_sf_hd, v, v_sf_seq, lens) -> (o, lse)
//                                          dense batches; broadcast_q variants: q of batch 1 for every batch row
//   jax_mxfp8_attention_fwd_sm100_packed  (q, q_sf_hd, k, k_sf_hd, v, v_sf_seq, seqs, work) -> (o, lse)
//   <target>_into: o and lse passed in as two more operands (aliased): the NaN-poisoning test hooks.
//   attributes: kernel (string) = the registry variant name, e.g. "attention_fwd_sm100_h128_causal_pblock",
//   "attention_fwd_sm100_h64_packed", "attention_fwd_sm100_h128_bcastq"; scale_log2 (float) = fl(tau log2 e).
//   The variant fixes head_dim, causal, the P scale and packed / broadcast_q; the handler checks the buffers
//   and the target against it.
//
// Buffers (docs/interfaces.md "sm100 attention"; the emulation's arrays, primitives/attention_sm100_operands.py;
// Bq = B, or 1 for broadcast_q and packed; Tc, Sc = ceil(T / 128), ceil(S / 128) dense, the tables' chunk
// counts packed):
//   q        (Bq, T, N, H) f8e4m3fn           q_sf_hd  (Bq, N, Tc, 1, 512) u8   Q's "hd" blocked scales
//   k, v     (B, S, K, H) f8e4m3fn            k_sf_hd  (B, K, Sc, 1, 512) u8    v_sf_seq (B, K, 1, Sc, 512) u8
//   lens     (2, B) s32 (query, key lengths <= T, S)   or   seqs (6, NS) s32, work (2, Tc) s32 (packed)
//   o        (B, T, N, H) bf16                lse      (B, N, T) f32
// H is the variant's head_dim (64 or 128), N a multiple of K. The kernel takes them as 2-D row-major views
// (no copies): data (B L, heads H), scales (B heads, C 512), lse (B N, T). The persistent grid is one CTA per SM
// (the device's SM count is passed at launch). Every failure is returned as an ffi::Error naming the op, the
// variant and the device's compute capability; the handler only enqueues the kernel on XLA's stream
// (CUDA-graph compatible). B, N or T = 0: nothing to do.
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "common.h"

namespace jmx {
namespace {

constexpr std::string_view kOp = "attention_fwd_sm100";  // registry AttentionFwdSm100Config.op
constexpr int64_t kChunk = 128;                            // rows per 512-byte scale chunk
constexpr int64_t kChunkBytes = 512;
constexpr int64_t kMaxRows = int64_t{1} << 30;  // the kernel's ragged TMA coordinates
constexpr int64_t kMaxElements = int64_t{1} << 31;

int64_t Chunks(int64_t rows) { return (rows + kChunk - 1) / kChunk; }

std::string Shape(ffi::AnyBuffer::Dimensions d) {
  std::string out = "(";
  for (size_t i = 0; i < d.size(); ++i) out += (i ? ", " : "") + std::to_string(d[i]);
  return out + ")";
}

std::string ShapeOf(std::initializer_list<int64_t> d) {
  std::string out = "(";
  int i = 0;
  for (int64_t x : d) out += (i++ ? ", " : "") + std::to_string(x);
  return out + ")";
}

// The variant and device of one call: every message names them.
struct Call {
  const KernelEntry* entry = nullptr;
  int cc = 0;

  ffi::Error Want(bool ok, const std::string& msg) const {
    if (ok) return ffi::Error::Success();
    return jmx::Want(false, kOp,
                     "kernel '" + std::string(entry->name) + "' (cc " + std::to_string(cc / 10) + "." +
                         std::to_string(cc % 10) + "): " + msg);
  }
};

// Checks a buffer's dtype and exact shape, and views it as 2-D row-major with its first `split` axes flattened
// into rows and the others into columns (the kernel's view); data 16-byte aligned.
ffi::Error View(const Call& call, void* data, ffi::AnyBuffer::Dimensions dims, ffi::DataType got, ffi::DataType want,
                const char* what, std::initializer_list<int64_t> shape, size_t split, TensorView* out) {
  bool same = dims.size() == shape.size();
  size_t i = 0;
  for (int64_t d : shape) same = same && dims[i++] == d;
  JMX_RETURN_IF_ERROR(call.Want(same, std::string(what) + " is " + Shape(dims) + ", expected " + ShapeOf(shape)));
  JMX_RETURN_IF_ERROR(call.Want(got == want, std::string(what) + " has dtype " + DTypeName(got) + ", expected " +
                                                 DTypeName(want)));
  int64_t rows = 1, cols = 1;
  for (size_t a = 0; a < dims.size(); ++a) (a < split ? rows : cols) *= dims[a];
  JMX_RETURN_IF_ERROR(call.Want(rows < kMaxRows && cols < kMaxRows && rows * cols < kMaxElements,
                                std::string(what) + " is too large for the kernel (32-bit offsets)"));
  JMX_RETURN_IF_ERROR(call.Want(reinterpret_cast<uintptr_t>(data) % 16 == 0,
                                std::string(what) + " must be 16-byte aligned"));
  *out = TensorView{data, static_cast<int32_t>(rows), static_cast<int32_t>(cols)};
  return ffi::Error::Success();
}

ffi::Error View(const Call& call, const ffi::AnyBuffer& b, ffi::DataType want, const char* what,
                std::initializer_list<int64_t> shape, size_t split, TensorView* out) {
  return View(call, b.untyped_data(), b.dimensions(), b.element_type(), want, what, shape, split, out);
}

ffi::Error View(const Call& call, ffi::Result<ffi::AnyBuffer>& b, ffi::DataType want, const char* what,
                std::initializer_list<int64_t> shape, size_t split, TensorView* out) {
  return View(call, b->untyped_data(), b->dimensions(), b->element_type(), want, what, shape, split, out);
}

ffi::Error Rank(const Call& call, const ffi::AnyBuffer& b, const char* what, size_t rank) {
  return call.Want(b.dimensions().size() == rank, std::string(what) + " must have rank " + std::to_string(rank) +
                                                       ", got " + Shape(b.dimensions()));
}

// One call of either target: `tables` are lens (dense) or seqs, work (packed).
ffi::Error Run(cudaStream_t stream, int32_t device, std::string_view kernel, float scale_log2, bool packed,
               const ffi::AnyBuffer& q, const ffi::AnyBuffer& q_sf, const ffi::AnyBuffer& k, const ffi::AnyBuffer& k_sf,
               const ffi::AnyBuffer& v, const ffi::AnyBuffer& v_sf, const ffi::AnyBuffer* tables, int n_tables,
               ffi::Result<ffi::AnyBuffer>& o, ffi::Result<ffi::AnyBuffer>& lse) {
  Call call;
  JMX_RETURN_IF_ERROR(FindKernel(device, kOp, kernel, &call.entry));
  JMX_RETURN_IF_ERROR(DeviceCC(device, &call.cc));
  const bool variant_packed = Param(call.entry, "packed") == 1;
  JMX_RETURN_IF_ERROR(call.Want(variant_packed == packed,
                                packed ? "is not a packed-sequence variant (use jax_mxfp8_attention_fwd_sm100)"
                                       : "is a packed-sequence variant (use jax_mxfp8_attention_fwd_sm100_packed)"));
  const bool one_q = packed || Param(call.entry, "broadcast_q") == 1;
  JMX_RETURN_IF_ERROR(Rank(call, q, "q", 4));
  JMX_RETURN_IF_ERROR(Rank(call, k, "k", 4));
  const auto qd = q.dimensions(), kd = k.dimensions();
  const int64_t bq = qd[0], t = qd[1], n = qd[2], h = qd[3], b = kd[0], s = kd[1], nk = kd[2];
  const int64_t head_dim = Param(call.entry, "head_dim");
  JMX_RETURN_IF_ERROR(call.Want(h == head_dim, "q has head_dim " + std::to_string(h) + ", the variant " +
                                                   std::to_string(head_dim)));
  JMX_RETURN_IF_ERROR(call.Want(bq == (one_q ? 1 : b), "q has batch " + std::to_string(bq) + ", expected " +
                                                           (one_q ? std::string("1 (one query sequence)")
                                                                  : "k's " + std::to_string(b))));
  JMX_RETURN_IF_ERROR(call.Want(!packed || b == 1, "packed operands hold one batch row, k has " + std::to_string(b)));
  JMX_RETURN_IF_ERROR(call.Want(nk > 0 && n % nk == 0, "q's " + std::to_string(n) + " heads must be a multiple of k's " +
                                                           std::to_string(nk) + " (GQA / MQA)"));
  const ffi::DataType e4m3 = ffi::DataType::F8E4M3FN, u8 = ffi::DataType::U8, s32 = ffi::DataType::S32;
  // dense: the scale chunks cover T and S; packed: the tables' chunk counts (the scales' own extents)
  const auto qsd = q_sf.dimensions(), ksd = k_sf.dimensions();
  JMX_RETURN_IF_ERROR(Rank(call, q_sf, "q_sf_hd", 5));
  JMX_RETURN_IF_ERROR(Rank(call, k_sf, "k_sf_hd", 5));
  const int64_t tc = packed ? qsd[2] : Chunks(t), sc = packed ? ksd[2] : Chunks(s);
  TensorView views[11];
  JMX_RETURN_IF_ERROR(View(call, q, e4m3, "q", {bq, t, n, h}, 2, &views[0]));
  JMX_RETURN_IF_ERROR(View(call, q_sf, u8, "q_sf_hd", {bq, n, tc, 1, kChunkBytes}, 2, &views[1]));
  JMX_RETURN_IF_ERROR(View(call, k, e4m3, "k", {b, s, nk, h}, 2, &views[2]));
  JMX_RETURN_IF_ERROR(View(call, k_sf, u8, "k_sf_hd", {b, nk, sc, 1, kChunkBytes}, 2, &views[3]));
  JMX_RETURN_IF_ERROR(View(call, v, e4m3, "v", {b, s, nk, h}, 2, &views[4]));
  JMX_RETURN_IF_ERROR(View(call, v_sf, u8, "v_sf_seq", {b, nk, 1, sc, kChunkBytes}, 2, &views[5]));
  int nt = 6;
  if (packed) {
    JMX_RETURN_IF_ERROR(Rank(call, tables[0], "seqs", 2));
    const int64_t n_seqs = tables[0].dimensions()[1];
    JMX_RETURN_IF_ERROR(call.Want(n_seqs > 0, "seqs must hold at least one sequence"));
    JMX_RETURN_IF_ERROR(View(call, tables[0], s32, "seqs", {6, n_seqs}, 1, &views[nt++]));
    JMX_RETURN_IF_ERROR(View(call, tables[1], s32, "work", {2, tc}, 1, &views[nt++]));
  } else {
    JMX_RETURN_IF_ERROR(View(call, tables[0], s32, "lens", {2, b}, 1, &views[nt++]));
  }
  JMX_RETURN_IF_ERROR(View(call, o, ffi::DataType::BF16, "o", {b, t, n, h}, 2, &views[nt++]));
  JMX_RETURN_IF_ERROR(View(call, lse, ffi::DataType::F32, "lse", {b, n, t}, 2, &views[nt++]));
  JMX_RETURN_IF_ERROR(call.Want(n_tables == (packed ? 2 : 1), "internal: the target's table count"));
  if (b == 0 || n == 0 || t == 0) return ffi::Error::Success();
  JMX_RETURN_IF_ERROR(call.Want(s > 0, "k and v hold no rows (S = 0): the caller writes O = 0, LSE = -inf"));
  int32_t sms = 0;
  JMX_RETURN_IF_ERROR(DeviceSMs(device, &sms));
  return Launch(call.entry, device, views, nt, stream, &scale_log2, 1, &sms, 1);
}

// kPacked: the table operands (lens, or seqs and work); kInto: o and lse passed in as two more operands (XLA
// aliases them to the results, so they are not read).
template <bool kPacked, bool kInto>
ffi::Error Handle(cudaStream_t stream, int32_t device, ffi::RemainingArgs args, ffi::RemainingRets rets,
                  std::string_view kernel, float scale_log2) {
  constexpr size_t kTables = kPacked ? 2 : 1;
  constexpr size_t kIn = 6 + kTables;
  if (args.size() != kIn + (kInto ? 2 : 0) || rets.size() != 2) {
    return jmx::Want(false, kOp,
                     "the target takes " + std::to_string(kIn + (kInto ? 2 : 0)) + " operands and 2 results, got " +
                         std::to_string(args.size()) + " and " + std::to_string(rets.size()));
  }
  std::vector<ffi::AnyBuffer> in;
  for (size_t i = 0; i < kIn; ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    in.push_back(*buffer);
  }
  auto o = rets.get<ffi::AnyBuffer>(0);
  if (o.has_error()) return o.error();
  auto lse = rets.get<ffi::AnyBuffer>(1);
  if (lse.has_error()) return lse.error();
  return Run(stream, device, kernel, scale_log2, kPacked, in[0], in[1], in[2], in[3], in[4], in[5], &in[6],
             static_cast<int>(kTables), *o, *lse);
}

auto Binding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::PlatformStream<cudaStream_t>>()
      .Ctx<ffi::DeviceOrdinal>()
      .RemainingArgs()
      .RemainingRets()
      .Attr<std::string_view>("kernel")
      .Attr<float>("scale_log2");
}

constexpr auto kDense = &Handle<false, false>;
constexpr auto kPackedTarget = &Handle<true, false>;
constexpr auto kDenseInto = &Handle<false, true>;
constexpr auto kPackedInto = &Handle<true, true>;

}  // namespace
}  // namespace jmx

namespace ffi = xla::ffi;

#pragma GCC visibility push(default)

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_attention_fwd_sm100, jmx::kDense, jmx::Binding(), {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_attention_fwd_sm100);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_attention_fwd_sm100_packed, jmx::kPackedTarget, jmx::Binding(), {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_attention_fwd_sm100_packed);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_attention_fwd_sm100_into, jmx::kDenseInto, jmx::Binding(), {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_attention_fwd_sm100_into);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_attention_fwd_sm100_packed_into, jmx::kPackedInto, jmx::Binding(), {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_attention_fwd_sm100_packed_into);

#pragma GCC visibility pop
