#pragma once
// What _C uses of torch: only its stable ABI (torch/csrc/stable and the C shims), so one
// build serves every torch from TORCH_TARGET_VERSION (setup.py) on. This header adds the
// few things every source needs on top: error checks and their messages, allocation, and
// calls of ATen ops by name.

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace kimi {

using torch::stable::Device;
using torch::stable::Tensor;
using ScalarType = torch::headeronly::ScalarType;
using Sizes = torch::headeronly::IntHeaderOnlyArrayRef;
using OptionalTensor = std::optional<Tensor>;

constexpr ScalarType kFloat = ScalarType::Float;
constexpr ScalarType kBFloat16 = ScalarType::BFloat16;
constexpr ScalarType kInt = ScalarType::Int;
constexpr ScalarType kBool = ScalarType::Bool;

// "torch.float32", as Python prints a dtype.
std::string dtype_name(ScalarType t);

// Sizes as Python prints a shape's list, "[2, 64]"; devices as torch names them, "cuda:0".
std::ostream& operator<<(std::ostream& out, Sizes sizes);
std::ostream& operator<<(std::ostream& out, const Device& device);

template <typename... Args>
std::string message(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

// The row of a generated table called `name`; otherwise an error that lists the names
// ("<op>: unknown variant '<name>'; expected <expected>one of: ...").
template <typename Row, size_t kCount>
const Row& row_by_name(const Row (&table)[kCount], const std::string& name, const char* op,
                       const char* expected = "") {
  std::ostringstream names;
  for (const Row& row : table) {
    if (name == row.name) {
      return row;
    }
    names << " " << row.name;
  }
  throw std::runtime_error(
      message(op, ": unknown variant '", name, "'; expected ", expected, "one of:", names.str()));
}

}  // namespace kimi

// An argument error. The stable ABI carries no exception type: torch 2.15 turns whatever a
// kernel throws into a RuntimeError, and earlier releases a std::runtime_error too (a
// std::invalid_argument would be a ValueError there, so the type would depend on torch).
#define KIMI_CHECK(cond, ...)                                       \
  do {                                                              \
    if (!(cond)) {                                                  \
      throw std::runtime_error(::kimi::message(__VA_ARGS__));       \
    }                                                               \
  } while (false)

// A call of torch's C shim that must succeed (the shim reports a failure by its return code;
// torch 2.10's headers and later ones name their own macro for this differently).
#define KIMI_SHIM_CHECK(call)                                                  \
  do {                                                                         \
    if ((call) != AOTI_TORCH_SUCCESS) {                                        \
      throw std::runtime_error("kimi_router_ops: torch call failed: " #call); \
    }                                                                          \
  } while (false)

namespace kimi {

// An uninitialized contiguous tensor on the device of `like` (the C shim's allocation: no
// dispatcher round trip).
Tensor empty_on(const Tensor& like, std::initializer_list<int64_t> sizes, ScalarType dtype);

// dst.copy_(src): src's values into dst's elements (converted to dst's dtype).
void copy_into(const Tensor& dst, const Tensor& src);

// Grad mode off for a scope. The ops' autograd is a fallthrough (ops.py), so the reference
// paths run with the caller's grad mode; their ATen ops must not record history, or the
// outputs of the CPU would require grad where the GPU kernels' do not.
class NoGradGuard {
 public:
  NoGradGuard() : enabled_(aoti_torch_grad_mode_is_enabled()) {
    aoti_torch_grad_mode_set_enabled(false);
  }
  ~NoGradGuard() { aoti_torch_grad_mode_set_enabled(enabled_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool enabled_;
};

// Calls an ATen op by name through the dispatcher with every argument of its schema, in
// order; returns the stack, whose first entries are the op's returns.
template <size_t kReturns = 1, typename... Args>
auto call_op(const char* name, const char* overload, const Args&... args) {
  std::array<StableIValue, std::max(sizeof...(Args), kReturns)> stack{
      torch::stable::detail::from(args)...};
  KIMI_SHIM_CHECK(
      torch_call_dispatcher(name, overload, stack.data(), TORCH_ABI_VERSION));
  return stack;
}

template <typename... Args>
Tensor call_tensor_op(const char* name, const char* overload, const Args&... args) {
  return torch::stable::detail::to<Tensor>(call_op(name, overload, args...)[0]);
}

// The ATen ops the reference paths use that torch::stable does not wrap. Scalars travel as
// 0-dim CPU tensors (ATen takes those as scalars beside tensors of any device, computing in
// the other operand's dtype, as a Scalar argument would).
namespace aten {

Tensor scalar(double value, ScalarType dtype = kFloat);
Tensor add(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor sigmoid(const Tensor& a);
Tensor softmax_last(const Tensor& a);  // over the last dimension
Tensor rsqrt(const Tensor& a);
Tensor sqrt_softplus(const Tensor& a);  // sqrt(softplus(a)), softplus as torch computes it
Tensor logical_not(const Tensor& a);
Tensor mean_last(const Tensor& a);  // over the last dimension, kept
Tensor sum_last(const Tensor& a);  // over the last dimension, kept
Tensor gather_last(const Tensor& a, const Tensor& index);
Tensor masked_fill(const Tensor& a, const Tensor& mask, double value);
// Indices of the k largest values along the last dimension, largest first, equal values in
// index order (a stable descending sort).
Tensor top_indices(const Tensor& values, int64_t k);
// A bool tensor of `like`'s shape, true where `index` (along the last dimension) points.
Tensor mask_of(const Tensor& like, const Tensor& index);
Tensor mm(const Tensor& a, const Tensor& b);
Tensor mm_float32(const Tensor& a, const Tensor& b);  // bf16 operands, fp32 out (cuBLAS's)

}  // namespace aten

}  // namespace kimi
