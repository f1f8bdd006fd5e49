// The helpers of torch_stable.h.

#include "torch_stable.h"

namespace kimi {

std::string dtype_name(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return "torch.float32";
    case ScalarType::BFloat16: return "torch.bfloat16";
    case ScalarType::Half: return "torch.float16";
    case ScalarType::Double: return "torch.float64";
    case ScalarType::Char: return "torch.int8";
    case ScalarType::Byte: return "torch.uint8";
    case ScalarType::Short: return "torch.int16";
    case ScalarType::Int: return "torch.int32";
    case ScalarType::Long: return "torch.int64";
    case ScalarType::Bool: return "torch.bool";
    default: return std::string("torch.") + torch::headeronly::toString(t);
  }
}

std::ostream& operator<<(std::ostream& out, Sizes sizes) {
  out << "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    out << (i ? ", " : "") << sizes[i];
  }
  return out << "]";
}

std::ostream& operator<<(std::ostream& out, const Device& device) {
  using torch::headeronly::DeviceType;
  switch (device.type()) {
    case DeviceType::CPU: out << "cpu"; break;
    case DeviceType::CUDA: out << "cuda"; break;
    case DeviceType::Meta: out << "meta"; break;
    default: out << "device type " << static_cast<int>(device.type());
  }
  if (device.has_index()) {
    out << ":" << static_cast<int>(device.index());
  }
  return out;
}

Tensor empty_on(const Tensor& like, std::initializer_list<int64_t> sizes, ScalarType dtype) {
  const std::vector<int64_t> shape(sizes);
  std::vector<int64_t> strides(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= std::max<int64_t>(shape[i], 1);
  }
  int32_t device_type = 0, device_index = 0;
  KIMI_SHIM_CHECK(aoti_torch_get_device_type(like.get(), &device_type));
  KIMI_SHIM_CHECK(aoti_torch_get_device_index(like.get(), &device_index));
  const int32_t shim_dtype =
      torch::stable::detail::to<int32_t>(torch::stable::detail::from(dtype));
  AtenTensorHandle out = nullptr;
  KIMI_SHIM_CHECK(aoti_torch_empty_strided(
      int64_t(shape.size()), shape.data(), strides.data(), shim_dtype, device_type, device_index,
      &out));
  return Tensor(out);
}

void copy_into(const Tensor& dst, const Tensor& src) {
  Tensor target = dst;
  torch::stable::copy_(target, src);
}

namespace aten {

namespace {
const std::vector<int64_t> kLastDim{-1};
}  // namespace

Tensor scalar(double value, ScalarType dtype) {
  return torch::stable::full(std::vector<int64_t>{}, value, dtype);
}

// add.Tensor's alpha is a Scalar, which the stable ABI cannot pass; a - (-1) * b is
// computed as a + b, bit for bit (ATen's sub is its add with the alpha negated).
Tensor add(const Tensor& a, const Tensor& b) { return torch::stable::subtract(a, b, -1.0); }

Tensor mul(const Tensor& a, const Tensor& b) { return call_tensor_op("aten::mul", "Tensor", a, b); }

Tensor div(const Tensor& a, const Tensor& b) { return call_tensor_op("aten::div", "Tensor", a, b); }

Tensor sigmoid(const Tensor& a) { return call_tensor_op("aten::sigmoid", "", a); }

Tensor softmax_last(const Tensor& a) {
  return call_tensor_op("aten::_softmax", "", a, int64_t(-1), false);
}

Tensor rsqrt(const Tensor& a) { return call_tensor_op("aten::rsqrt", "", a); }

Tensor sqrt_softplus(const Tensor& a) {
  // max(a, 0) + log1p(e^-|a|): torch's softplus (log1p(e^a)) without its overflow, and a
  // itself above softplus's threshold, 20, as torch takes it.
  const Tensor e = call_tensor_op("aten::exp", "", call_tensor_op("aten::neg", "",
                                                                  call_tensor_op("aten::abs", "", a)));
  const Tensor soft = add(call_tensor_op("aten::relu", "", a), call_tensor_op("aten::log1p", "", e));
  const Tensor above = call_tensor_op("aten::gt", "Tensor", a, scalar(20.0));
  return call_tensor_op("aten::sqrt", "", call_tensor_op("aten::where", "self", above, a, soft));
}

Tensor logical_not(const Tensor& a) { return call_tensor_op("aten::logical_not", "", a); }

Tensor mean_last(const Tensor& a) {
  return call_tensor_op("aten::mean", "dim", a, std::optional<Sizes>(kLastDim), true,
                        std::optional<ScalarType>());
}

Tensor sum_last(const Tensor& a) { return torch::stable::sum(a, Sizes(kLastDim), true); }

Tensor gather_last(const Tensor& a, const Tensor& index) {
  return call_tensor_op("aten::gather", "", a, int64_t(-1), index, false);
}

Tensor masked_fill(const Tensor& a, const Tensor& mask, double value) {
  return call_tensor_op("aten::masked_fill", "Tensor", a, mask, scalar(value));
}

Tensor top_indices(const Tensor& values, int64_t k) {
  auto stack = call_op<2>("aten::sort", "stable", values, std::optional<bool>(true), int64_t(-1),
                          true);
  (void)torch::stable::detail::to<Tensor>(stack[0]);  // the sorted values, released
  Tensor indices = torch::stable::detail::to<Tensor>(stack[1]);
  return torch::stable::narrow(indices, -1, 0, k);
}

Tensor mask_of(const Tensor& like, const Tensor& index) {
  const Tensor none = torch::stable::new_zeros(like, like.sizes(), kBool);
  const Tensor marks =
      torch::stable::full(index.sizes(), 1.0, kBool, std::nullopt, index.device());
  return call_tensor_op("aten::scatter", "src", none, int64_t(-1), index, marks);
}

Tensor mm(const Tensor& a, const Tensor& b) { return call_tensor_op("aten::mm", "", a, b); }

Tensor mm_float32(const Tensor& a, const Tensor& b) {
  return call_tensor_op("aten::mm", "dtype", a, b, kFloat);
}

}  // namespace aten

}  // namespace kimi
