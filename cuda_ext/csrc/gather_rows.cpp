// Front file of graphfeed::gather_rows / gather_rows_into: schema and argument checks.
#include "gather_rows.h"

#include <torch/library.h>

#include "checks.h"

namespace graphfeed {

void check_gather_rows_args(const at::Tensor& src, const at::Tensor& index) {
  TORCH_CHECK(src.dim() >= 1, "src must have at least one dimension (rows first)");
  check_contiguous(src, "src");
  check_index_vector(index, "index");
}

void check_gather_rows_out(const at::Tensor& src, const at::Tensor& index, const at::Tensor& out) {
  check_gather_rows_args(src, index);
  TORCH_CHECK(out.scalar_type() == src.scalar_type(), "out has dtype ", out.scalar_type(), " but src has ",
              src.scalar_type());
  auto expected = src.sizes().vec();
  expected[0] = index.numel();
  TORCH_CHECK(out.sizes().vec() == expected, "out must have shape ", at::IntArrayRef(expected), ", got ",
              out.sizes());
  check_contiguous(out, "out");
  TORCH_CHECK(out.device() == index.device(), "out is on ", out.device(), " but index is on ", index.device());
}

void check_gather_rows_to_args(const at::Tensor& src, const c10::optional<at::Tensor>& index, const at::Tensor& out,
                               const at::Tensor& out_index) {
  TORCH_CHECK(src.dim() >= 1, "src must have at least one dimension (rows first)");
  check_contiguous(src, "src");
  check_contiguous(out, "out");
  check_index_vector(out_index, "out_index");
  const int64_t n = index.has_value() ? index->numel() : src.size(0);
  if (index.has_value()) check_index_vector(*index, "index");
  TORCH_CHECK(out_index.numel() == n, "out_index has ", out_index.numel(), " entries but ", n,
              " rows are copied; give one destination row per source row");
  TORCH_CHECK(out.scalar_type() == src.scalar_type(), "out has dtype ", out.scalar_type(), " but src has ",
              src.scalar_type());
  TORCH_CHECK(out.dim() == src.dim() && out.sizes().slice(1) == src.sizes().slice(1), "out has rows of shape ",
              out.sizes().slice(1), " but src has rows of shape ", src.sizes().slice(1));
}

TORCH_LIBRARY_FRAGMENT(graphfeed, m) {
  m.def("gather_rows(Tensor src, Tensor index) -> Tensor");
  m.def("gather_rows_into(Tensor src, Tensor index, Tensor(a!) out) -> ()");
  m.def("gather_rows_to(Tensor src, Tensor? index, Tensor(a!) out, Tensor out_index) -> ()");
  m.def("empty_rows(Tensor like, int rows) -> Tensor");
}

}  // namespace graphfeed
