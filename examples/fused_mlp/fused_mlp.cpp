#include "examples/fused_mlp/fused_mlp.hpp"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <cmath>
#include <string>

#include "runtime/tiles.hpp"

namespace loom::examples {

void validate(FusedMlpProblem const& p) {
  struct Named {
    char const* name;
    std::uint32_t value;
  };
  for (Named const f :
       {Named{"m", p.m}, Named{"k", p.k}, Named{"h", p.h}, Named{"n", p.n},
        Named{"tile_m", p.tile_m}, Named{"tile_h", p.tile_h}, Named{"tile_n", p.tile_n}})
    if (f.value == 0) throw Error(std::string("loom: fused MLP with ") + f.name + " = 0");
}

Graph build_fused_mlp_graph(std::uint16_t matmul_type, FusedMlpProblem const& p, float const* x,
                            float const* w1, float const* w2, float* hidden, float* y,
                            float const* b1) {
  validate(p);
  using tasks::TileMatmul;
  tasks::MatmulOperands layer1;
  layer1.a = x;
  layer1.b = w1;
  layer1.c = hidden;
  layer1.bias = b1;
  layer1.m = p.m;
  layer1.n = p.h;
  layer1.k = p.k;
  layer1.lda = p.k;
  layer1.ldb = p.h;
  layer1.ldc = p.h;
  layer1.activation = p.activation;

  tasks::MatmulOperands layer2;
  layer2.a = hidden;
  layer2.b = w2;
  layer2.c = y;
  layer2.m = p.m;
  layer2.n = p.n;
  layer2.k = p.h;
  layer2.lda = p.h;
  layer2.ldb = p.n;
  layer2.ldc = p.n;

  TileGrid const hidden_tiles{p.m, p.h, p.tile_m, p.tile_h};
  TileGrid const output_tiles{p.m, p.n, p.tile_m, p.tile_n};

  GraphBuilder builder;
  std::vector<EventId> hidden_row_done(hidden_tiles.row_tiles());
  for (std::uint32_t i = 0; i < hidden_tiles.row_tiles(); ++i)
    hidden_row_done[i] = builder.add_event(hidden_tiles.col_tiles());

  // Task ids: hidden tiles 0 .. hidden_tiles.count() - 1, then output tiles, row-major each.
  std::uint32_t id = 0;
  hidden_tiles.for_each([&](Tile const& t) {
    builder.add_task(encode_task(matmul_type, TileMatmul::tile_payload(layer1, t),
                                 hidden_row_done[t.row_tile], id++, /*priority=*/0));
  });
  output_tiles.for_each([&](Tile const& t) {
    builder.add_task(encode_task(matmul_type, TileMatmul::tile_payload(layer2, t), kNoEvent, id++,
                                 /*priority=*/1),
                     {hidden_row_done[t.row_tile]});
  });
  return builder.build();
}

std::vector<double> reference_fused_mlp(FusedMlpProblem const& p, float const* x, float const* w1,
                                        float const* w2, float const* b1) {
  validate(p);
  std::vector<double> y(std::size_t{p.m} * p.n);
  oneapi::tbb::parallel_for(oneapi::tbb::blocked_range<std::uint32_t>(0, p.m),
                            [&](oneapi::tbb::blocked_range<std::uint32_t> const& rows) {
                              std::vector<double> hidden(p.h);
                              for (std::uint32_t r = rows.begin(); r != rows.end(); ++r) {
                                for (std::uint32_t j = 0; j < p.h; ++j)
                                  hidden[j] = b1 ? double(b1[j]) : 0.0;
                                for (std::uint32_t kk = 0; kk < p.k; ++kk) {
                                  double const xv = x[std::size_t{r} * p.k + kk];
                                  float const* w1_row = w1 + std::size_t{kk} * p.h;
                                  for (std::uint32_t j = 0; j < p.h; ++j)
                                    hidden[j] += xv * double(w1_row[j]);
                                }
                                for (double& v : hidden) v = tasks::activate(p.activation, v);
                                double* y_row = y.data() + std::size_t{r} * p.n;
                                for (std::uint32_t j = 0; j < p.h; ++j) {
                                  float const* w2_row = w2 + std::size_t{j} * p.n;
                                  for (std::uint32_t c = 0; c < p.n; ++c)
                                    y_row[c] += hidden[j] * double(w2_row[c]);
                                }
                              }
                            });
  return y;
}

double relative_error(float const* out, double const* ref, std::size_t count) {
  double diff2 = 0.0, ref2 = 0.0;
  for (std::size_t i = 0; i < count; ++i) {
    double const d = double(out[i]) - ref[i];
    diff2 += d * d;
    ref2 += ref[i] * ref[i];
  }
  // An all-zero reference (a ReLU layer can zero every hidden unit of a small problem): exact
  // zeros match it, anything else (NaN included) does not.
  if (ref2 == 0.0) return diff2 == 0.0 ? 0.0 : INFINITY;
  return std::sqrt(diff2) / std::sqrt(ref2);
}

double relative_error(std::vector<float> const& out, std::vector<double> const& ref) {
  if (out.size() != ref.size())
    throw Error("loom: relative_error over " + std::to_string(out.size()) + " outputs but " +
                std::to_string(ref.size()) + " reference values");
  return relative_error(out.data(), ref.data(), out.size());
}

}  // namespace loom::examples
