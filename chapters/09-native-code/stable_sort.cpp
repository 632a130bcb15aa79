// Chapter 9: an operator built only on the stable ABI (torch/csrc/stable), compiled by
// torch.utils.cpp_extension.load in notebook 9.1. It sorts the last dimension with
// torch::stable::sort and returns the values and the indices. Its second operator reports the
// C++ standard it was compiled as (__cplusplus): stable-ABI code builds as C++17 too.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <cstdint>
#include <tuple>

namespace {

std::tuple<torch::stable::Tensor, torch::stable::Tensor> sorted_last(torch::stable::Tensor x, bool descending) {
  return torch::stable::sort(x, -1, descending);
}

int64_t cplusplus() {
  return __cplusplus;
}

}  // namespace

STABLE_TORCH_LIBRARY(pt215_stable, m) {
  m.def("sorted_last(Tensor x, bool descending) -> (Tensor, Tensor)");
  m.def("cplusplus() -> int");
}

STABLE_TORCH_LIBRARY_IMPL(pt215_stable, CompositeExplicitAutograd, m) {
  m.impl("sorted_last", TORCH_BOX(&sorted_last));
  m.impl("cplusplus", TORCH_BOX(&cplusplus));
}
