#include "examples/fused_mlp/fused_mlp.hpp"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <cmath>
#include <string>

#include "tasks/gemm/epilogue_math.hpp"
#include "tasks/gemm/heuristic.hpp"
#include "tasks/gemm/tiling.hpp"

namespace loom::examples {

namespace g = tasks::gemm;

void validate(FusedMlpProblem const& p) {
  struct Named {
    char const* name;
    std::uint32_t value;
  };
  for (Named const f : {Named{"m", p.m}, Named{"k", p.k}, Named{"h", p.h}, Named{"n", p.n}})
    if (f.value == 0) throw Error(std::string("loom: fused MLP with ") + f.name + " = 0");
  for (Named const f : {Named{"k", p.k}, Named{"h", p.h}, Named{"n", p.n}})
    if (f.value % 8 != 0)
      throw Error(std::string("loom: fused MLP with ") + f.name + " = " + std::to_string(f.value) +
                  ": k, h and n must be multiples of 8 (16-byte rows for the tile loads)");
  if (p.tile_m != 0 && p.tile_m != 64 && p.tile_m != 128)
    throw Error("loom: fused MLP with tile_m = " + std::to_string(p.tile_m) +
                ": tiles are 64 or 128 rows high (0 lets the heuristic choose)");
}

g::GemmDesc layer1_desc(FusedMlpProblem const& p, FusedMlpTensors const& t) {
  g::GemmDesc d;
  d.a = t.x;
  d.a_rows = p.m;
  d.b = t.w1;
  d.n = p.w1_rows();
  d.k = p.k;
  d.c = t.hidden;
  d.output = g::OutputType::bf16;
  d.bias = t.b1;
  d.activation = p.activation;
  return d;
}

g::GemmDesc layer2_desc(FusedMlpProblem const& p, FusedMlpTensors const& t) {
  g::GemmDesc d;
  d.a = t.hidden;
  d.a_rows = p.m;
  d.b = t.w2;
  d.n = p.n;
  d.k = p.h;
  d.c = t.y;
  d.output = g::OutputType::fp32;
  return d;
}

g::GemmOperands host_operands(g::GemmDesc const& desc, g::GemmConfig const& config) {
  g::GemmOperands op = g::make_operands(desc, config);
  if (config.splits > 1) op.slots = op.slots_for_any_rows();
  return op;
}

namespace {

// `cfg` with tiles `block_m` rows high: a width that height does not take (64-row tiles are 128
// or 256 wide) becomes 128, and the pipeline as deep as the new stages allow.
g::GemmConfig with_block_m(g::GemmConfig cfg, std::uint32_t block_m) {
  if (cfg.block_m == block_m) return cfg;
  cfg.block_m = static_cast<std::uint16_t>(block_m);
  if (!cfg.shape_supported()) cfg.block_n = 128;
  cfg.stages = static_cast<std::uint8_t>(cfg.max_stages());
  return cfg;
}

}  // namespace

FusedMlpTiles choose_fused_mlp_tiles(FusedMlpProblem const& p, std::uint32_t processors,
                                     g::MmaPath path) {
  validate(p);
  g::GemmDeviceModel model;
  model.processors = processors;
  g::GemmShape first;
  first.m = p.m, first.n = p.w1_rows(), first.k = p.k, first.out_bytes = 2;
  g::GemmShape second;
  second.m = p.m, second.n = p.n, second.k = p.h, second.out_bytes = 4;
  FusedMlpTiles tiles;
  tiles.layer1 = g::choose_gemm_config(first, model, path);
  std::uint32_t const block_m = p.tile_m ? p.tile_m : tiles.layer1.block_m;
  tiles.layer1 = with_block_m(tiles.layer1, block_m);
  tiles.layer2 = with_block_m(g::choose_gemm_config(second, model, path), block_m);
  return tiles;
}

Graph build_fused_mlp_graph(std::uint16_t gemm_type, g::GemmOperands const& layer1,
                            g::GemmOperands const* layer1_at, g::GemmOperands const& layer2,
                            g::GemmOperands const* layer2_at) {
  std::uint32_t const block_m = layer1.config.block_m;
  if (layer2.config.block_m != block_m)
    throw Error("loom: fused MLP layers with tiles " + std::to_string(block_m) + " and " +
                std::to_string(layer2.config.block_m) +
                " rows high: a row tile must mean the same rows in both");
  if (static_cast<void const*>(layer2.a) != layer1.c || layer1.output != g::OutputType::bf16 ||
      layer2.k != layer1.n_out || layer2.a_rows != layer1.a_rows || layer1.experts != 1 ||
      layer2.experts != 1)
    throw Error("loom: the fused MLP's second layer must read the first layer's bf16 output (" +
                std::to_string(layer1.a_rows) + " x " + std::to_string(layer1.n_out) +
                ") as its A, one weight matrix each");

  std::uint32_t const rows = layer1.a_rows;
  std::uint32_t const row_tiles = (rows + block_m - 1) / block_m;
  std::uint32_t slot1 = 0, slot2 = 0;
  auto const hidden_tiles =
      g::gemm_tile_payloads<tasks::GemmTile>(layer1, layer1_at, {0, 0, 0, rows}, slot1);
  auto const output_tiles =
      g::gemm_tile_payloads<tasks::GemmTile>(layer2, layer2_at, {0, 0, 0, rows}, slot2);

  std::vector<std::uint32_t> tasks_per_row_tile(row_tiles, 0);
  for (auto const& t : hidden_tiles) ++tasks_per_row_tile[t.a_row0 / block_m];
  GraphBuilder builder;
  std::vector<EventId> hidden_row_done(row_tiles);
  for (std::uint32_t i = 0; i < row_tiles; ++i)
    hidden_row_done[i] = builder.add_event(tasks_per_row_tile[i]);

  // Task ids: hidden tiles first, then output tiles, each in the GEMM's raster order.
  std::uint32_t id = 0;
  for (auto const& t : hidden_tiles)
    builder.add_task(
        encode_task(gemm_type, t, hidden_row_done[t.a_row0 / block_m], id++, /*priority=*/0));
  for (auto const& t : output_tiles)
    builder.add_task(encode_task(gemm_type, t, kNoEvent, id++, /*priority=*/1),
                     {hidden_row_done[t.a_row0 / block_m]});
  return builder.build();
}

std::vector<double> reference_fused_mlp(FusedMlpProblem const& p, Bf16 const* x, Bf16 const* w1,
                                        Bf16 const* w2, float const* b1) {
  validate(p);
  std::uint32_t const w1_rows = p.w1_rows();
  std::vector<double> y(std::size_t{p.m} * p.n, 0.0);
  oneapi::tbb::parallel_for(
      oneapi::tbb::blocked_range<std::uint32_t>(0, p.m),
      [&](oneapi::tbb::blocked_range<std::uint32_t> const& rows) {
        std::vector<double> pre(w1_rows), hidden(p.h);
        for (std::uint32_t r = rows.begin(); r != rows.end(); ++r) {
          Bf16 const* x_row = x + std::size_t{r} * p.k;
          for (std::uint32_t j = 0; j < w1_rows; ++j) {
            Bf16 const* w_row = w1 + std::size_t{j} * p.k;
            double sum = b1 ? double(b1[j]) : 0.0;
            for (std::uint32_t kk = 0; kk < p.k; ++kk)
              sum += double(g::to_float(x_row[kk])) * double(g::to_float(w_row[kk]));
            pre[j] = sum;
          }
          for (std::uint32_t o = 0; o < p.h; ++o)
            hidden[o] = p.activation == GemmActivation::swiglu
                            ? g::swiglu(pre[g::swiglu_gate_column(o)], pre[g::swiglu_up_column(o)])
                            : g::activate(p.activation, pre[o]);
          double* y_row = y.data() + std::size_t{r} * p.n;
          for (std::uint32_t c = 0; c < p.n; ++c) {
            Bf16 const* w_row = w2 + std::size_t{c} * p.h;
            double sum = 0.0;
            for (std::uint32_t j = 0; j < p.h; ++j)
              sum += hidden[j] * double(g::to_float(w_row[j]));
            y_row[c] = sum;
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
