// The examples on the CPU executor: the fused MLP (bf16 GemmTile tasks with per-row-tile events)
// against its float64 reference over shapes that clip tiles, every activation and both policies;
// the graph's dependency structure, split-K included; the fp32 TileMatmul task type's payload
// packing and strided operands; and the user-defined RowSoftmax task against a float64 softmax.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "examples/custom_task/row_softmax.hpp"
#include "examples/fused_mlp/fused_mlp.hpp"
#include "tasks/gemm_tile.hpp"
#include "tasks/tile_matmul.hpp"
#include "tests/cpu/test_support.hpp"
#include "tests/strided_matmul_check.hpp"

namespace loom::test {
namespace {

namespace g = tasks::gemm;
using examples::FusedMlpProblem;
using examples::FusedMlpTensors;
using examples::RowSoftmax;
using g::Bf16;
using g::GemmActivation;
using tasks::Activation;
using tasks::TileMatmul;

using MlpPipeline = Pipeline<tasks::GemmTile>;
using ExamplesPipeline = Pipeline<TileMatmul, RowSoftmax>;

constexpr double kFp32Tolerance = 1e-5;
constexpr double kBf16Tolerance = 1e-2;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr Bf16 kBf16NaN{0xFFFF};
constexpr GemmActivation kActivations[] = {GemmActivation::none, GemmActivation::relu,
                                           GemmActivation::gelu_tanh, GemmActivation::swiglu};
constexpr SchedulingPolicy kPolicies[] = {SchedulingPolicy::fifo, SchedulingPolicy::priority};

std::vector<float> uniform(std::mt19937& rng, std::size_t count, float scale) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(count);
  for (float& e : v) e = dist(rng);
  return v;
}

std::vector<Bf16> uniform_bf16(std::mt19937& rng, std::size_t count, float scale) {
  std::vector<float> const f = uniform(rng, count, scale);
  std::vector<Bf16> v(count);
  std::transform(f.begin(), f.end(), v.begin(), [](float x) { return g::to_bf16(x); });
  return v;
}

std::vector<Graph> one_rank(Graph g) {
  std::vector<Graph> graphs;
  graphs.push_back(std::move(g));
  return graphs;
}

CpuOptions with_processors(std::uint32_t processors) {
  CpuOptions o;
  o.processors = processors;
  return o;
}

struct MlpInputs {
  std::vector<Bf16> x, w1, w2;
  std::vector<float> b1;
};

MlpInputs random_mlp_inputs(FusedMlpProblem const& p, std::mt19937& rng) {
  return MlpInputs{uniform_bf16(rng, std::size_t{p.m} * p.k, 1.0f),
                   uniform_bf16(rng, std::size_t{p.w1_rows()} * p.k, 1.0f / std::sqrt(float(p.k))),
                   uniform_bf16(rng, std::size_t{p.n} * p.h, 1.0f / std::sqrt(float(p.h))),
                   uniform(rng, p.w1_rows(), 0.5f)};
}

// One fused MLP on the CPU executor over host buffers: its operands, graph and executor.
struct HostMlp {
  std::vector<Bf16> hidden;
  std::vector<float> y;
  g::GemmOperands layer1, layer2;

  HostMlp(FusedMlpProblem const& p, MlpInputs const& in, bool with_bias,
          examples::FusedMlpTiles const& tiles)
      : hidden(std::size_t{p.m} * p.h), y(std::size_t{p.m} * p.n) {
    FusedMlpTensors const t{in.x.data(),  in.w1.data(),  with_bias ? in.b1.data() : nullptr,
                            in.w2.data(), hidden.data(), y.data()};
    layer1 = examples::host_operands(examples::layer1_desc(p, t), tiles.layer1);
    layer2 = examples::host_operands(examples::layer2_desc(p, t), tiles.layer2);
  }
  Graph graph() const {
    return examples::build_fused_mlp_graph<MlpPipeline>(layer1, &layer1, layer2, &layer2);
  }
  void poison() {
    std::fill(hidden.begin(), hidden.end(), kBf16NaN);
    std::fill(y.begin(), y.end(), kNaN);
  }
};

// Runs the fused MLP for every activation and both policies, fresh inputs per activation, Y and
// the hidden layer poisoned before every launch; both policies give the same bits. The inputs
// come from `seed` (a test whose chaos seed is drawn from it too replays whole from one
// LOOM_TEST_SEED), or from a fresh one.
void check_fused_mlp(FusedMlpProblem p, bool with_bias, CpuOptions const& options,
                     std::uint32_t seed) {
  std::mt19937 rng(seed);
  for (GemmActivation act : kActivations) {
    SCOPED_TRACE(g::to_string(act));
    p.activation = act;
    MlpInputs const in = random_mlp_inputs(p, rng);
    std::vector<double> const ref = examples::reference_fused_mlp(
        p, in.x.data(), in.w1.data(), in.w2.data(), with_bias ? in.b1.data() : nullptr);
    HostMlp mlp(p, in, with_bias,
                examples::choose_fused_mlp_tiles(p, options.processors, g::MmaPath::wgmma));
    CpuExecutor<MlpPipeline> ex(one_rank(mlp.graph()), options);
    std::vector<float> first;
    for (SchedulingPolicy policy : kPolicies) {
      SCOPED_TRACE(to_string(policy));
      mlp.poison();
      ex.run(policy);
      EXPECT_LT(examples::relative_error(mlp.y, ref), kBf16Tolerance);
      if (first.empty())
        first = mlp.y;
      else
        EXPECT_EQ(std::memcmp(first.data(), mlp.y.data(), first.size() * sizeof(float)), 0);
    }
  }
}
void check_fused_mlp(FusedMlpProblem p, bool with_bias, CpuOptions const& options) {
  TracedSeed const seed;
  check_fused_mlp(p, with_bias, options, seed);
}

FusedMlpProblem shape(std::uint32_t m, std::uint32_t k, std::uint32_t h, std::uint32_t n,
                      std::uint32_t tile_m = 0) {
  FusedMlpProblem p;
  p.m = m, p.k = k, p.h = h, p.n = n;
  p.tile_m = tile_m;
  return p;
}

TEST(FusedMlp, MatchesFloat64ReferenceWithWholeTiles) {
  check_fused_mlp(shape(128, 64, 256, 128), false, with_processors(4));
  check_fused_mlp(FusedMlpProblem{}, true, with_processors(4));  // the CLI's default problem
}

TEST(FusedMlp, MatchesFloat64ReferenceWithTilesClippedAtEveryEdge) {
  check_fused_mlp(shape(100, 72, 296, 40, 64), true, with_processors(4));
  check_fused_mlp(shape(65, 136, 136, 72, 128), false, with_processors(3));
}

TEST(FusedMlp, MatchesFloat64ReferenceWhenOneTileCoversEverything) {
  check_fused_mlp(shape(1, 8, 8, 8), true, with_processors(2));
}

TEST(FusedMlp, MatchesFloat64ReferenceUnderAdversarialInterleaving) {
  CpuOptions options = with_processors(4);
  TracedSeed const seed;  // of the interleaving and the inputs
  options.chaos_seed = seed | 1u;
  options.chaos_per_mille = 200;
  options.chaos_max_delay_us = 100;
  check_fused_mlp(shape(96, 40, 136, 56, 64), true, options, seed);
}

// Three row tiles of 64; the first layer split along K in two, three column tiles: each row
// tile's event waits for all six of its tasks, and releases exactly that row tile's output tiles.
TEST(FusedMlp, OutputTilesWaitForEverySplitOfTheirOwnRowTile) {
  FusedMlpProblem p = shape(150, 128, 296, 200);
  p.activation = GemmActivation::gelu_tanh;
  g::GemmConfig layer1{};
  layer1.block_m = 64, layer1.block_n = 128, layer1.splits = 2, layer1.stages = 2;
  g::GemmConfig layer2 = layer1;
  layer2.splits = 1;
  std::uint32_t const row_tiles = 3, hidden_tasks = 3 * 2, output_tasks = 2;

  TracedSeed const seed;
  std::mt19937 rng(seed);
  MlpInputs const in = random_mlp_inputs(p, rng);
  HostMlp mlp(p, in, true, {layer1, layer2});
  Graph const gr = mlp.graph();
  ASSERT_EQ(gr.events.size(), row_tiles);
  ASSERT_EQ(gr.tasks.size(), row_tiles * (hidden_tasks + output_tasks));
  std::uint32_t const first_output = row_tiles * hidden_tasks;
  for (std::uint32_t i = 0; i < row_tiles; ++i) {
    EXPECT_EQ(gr.events[i].expected, hidden_tasks) << "row tile " << i;
    std::vector<TaskId> const succ(gr.successors.begin() + gr.events[i].succ_begin,
                                   gr.successors.begin() + gr.events[i].succ_end);
    ASSERT_EQ(succ.size(), output_tasks) << "row tile " << i;
    for (TaskId const t : succ) {
      ASSERT_GE(t, first_output);
      auto const& pl = gr.tasks[t].as<tasks::GemmTile::Payload>();
      EXPECT_EQ(pl.a_row0 / 64, i);
      EXPECT_EQ(gr.gate_counts[t], 1u);
      EXPECT_EQ(gr.tasks[t].header.event, kNoEvent);
      EXPECT_EQ(gr.tasks[t].header.priority, 1u);
    }
  }
  for (TaskId t = 0; t < first_output; ++t) {
    auto const& pl = gr.tasks[t].as<tasks::GemmTile::Payload>();
    EXPECT_EQ(gr.tasks[t].header.event, pl.a_row0 / 64);
    EXPECT_EQ(gr.gate_counts[t], 0u);
  }
  EXPECT_EQ(gr.roots.size(), first_output);

  std::vector<double> const ref =
      examples::reference_fused_mlp(p, in.x.data(), in.w1.data(), in.w2.data(), in.b1.data());
  CpuExecutor<MlpPipeline> ex(one_rank(gr), with_processors(4));
  mlp.poison();
  ex.run();
  EXPECT_LT(examples::relative_error(mlp.y, ref), kBf16Tolerance);
}

// Both layers take the first layer's tile height (or tile_m), each its own width.
TEST(FusedMlp, BothLayersShareTheTileHeight) {
  for (std::uint32_t tile_m : {0u, 64u, 128u}) {
    FusedMlpProblem const p = shape(4096, 4096, 1024, 64, tile_m);
    auto const tiles = examples::choose_fused_mlp_tiles(p, 131, g::MmaPath::wgmma);
    EXPECT_EQ(tiles.layer1.block_m, tiles.layer2.block_m);
    if (tile_m) {
      EXPECT_EQ(tiles.layer1.block_m, tile_m);
    }
    EXPECT_TRUE(tiles.layer1.shape_supported());
    EXPECT_TRUE(tiles.layer2.shape_supported());
    EXPECT_EQ(g::config_problem(tiles.layer1, p.k), "");
    EXPECT_EQ(g::config_problem(tiles.layer2, p.h), "");
  }
}

TEST(FusedMlp, RejectsLayersOfDifferentTileHeights) {
  FusedMlpProblem const p = shape(100, 64, 64, 64);
  std::mt19937 rng(1);
  MlpInputs const in = random_mlp_inputs(p, rng);
  g::GemmConfig tall{}, short_tiles{};
  tall.block_m = 128, tall.block_n = 128, tall.stages = 2;
  short_tiles.block_m = 64, short_tiles.block_n = 128, short_tiles.stages = 2;
  HostMlp const mlp(p, in, false, {tall, short_tiles});
  EXPECT_TRUE(mentions(error_of([&] { mlp.graph(); }), "rows high"));
}

// A small ReLU layer can zero every hidden unit, and its reference is then all zeros: exact
// zeros match it, anything else does not (the error used to be 0 / 0).
TEST(FusedMlp, RelativeErrorAgainstAnAllZeroReference) {
  std::vector<double> const zero(3, 0.0);
  EXPECT_EQ(examples::relative_error(std::vector<float>(3, 0.0f), zero), 0.0);
  EXPECT_FALSE(examples::relative_error(std::vector<float>{0.0f, 1e-3f, 0.0f}, zero) <
               kFp32Tolerance);
  EXPECT_FALSE(examples::relative_error(std::vector<float>{0.0f, kNaN, 0.0f}, zero) <
               kFp32Tolerance);
}

TEST(FusedMlp, RejectsWhatTheTileTaskCannotRun) {
  FusedMlpProblem p;
  p.m = 0;
  EXPECT_TRUE(mentions(error_of([&] { examples::validate(p); }), "m = 0"));
  p = FusedMlpProblem{};
  p.h = 100;
  EXPECT_TRUE(mentions(error_of([&] { examples::validate(p); }), "multiples of 8"));
  p = FusedMlpProblem{};
  p.tile_m = 96;
  EXPECT_TRUE(mentions(error_of([&] { examples::validate(p); }), "64 or 128 rows"));
}

TEST(TileMatmul, PayloadCarriesTheTileAndItsOperands) {
  std::vector<float> a(10 * 20), b(20 * 30), c(10 * 40), bias(30);
  tasks::MatmulOperands op;
  op.a = a.data(), op.b = b.data(), op.c = c.data(), op.bias = bias.data();
  op.m = 10, op.n = 30, op.k = 17, op.lda = 20, op.ldb = 30, op.ldc = 40;
  op.activation = Activation::silu;
  Tile const t = TileGrid{10, 30, 4, 8}.tile(2, 3);  // rows 8..9, cols 24..29: clipped both ways
  TileMatmul::Payload const p = TileMatmul::tile_payload(op, t);
  EXPECT_EQ(p.a, a.data() + 8 * 20);
  EXPECT_EQ(p.b, b.data() + 24);
  EXPECT_EQ(p.c, c.data() + 8 * 40 + 24);
  EXPECT_EQ(p.bias, bias.data() + 24);
  EXPECT_EQ(p.k(), 17u);
  EXPECT_EQ(p.lda(), 20u);
  EXPECT_EQ(p.ldb(), 30u);
  EXPECT_EQ(p.ldc(), 40u);
  EXPECT_EQ(p.rows(), 2u);
  EXPECT_EQ(p.cols(), 6u);
  EXPECT_EQ(p.activation(), Activation::silu);
}

TEST(TileMatmul, PayloadRejectsWhatItCannotEncode) {
  std::vector<float> buffer(16);
  auto operands = [&](std::uint32_t m, std::uint32_t n, std::uint32_t k, std::uint32_t lda) {
    tasks::MatmulOperands op;
    op.a = op.b = op.c = buffer.data();  // never dereferenced: every call below throws
    op.m = m, op.n = n, op.k = k, op.lda = lda, op.ldb = n, op.ldc = n;
    return op;
  };
  auto message = [](tasks::MatmulOperands const& op, Tile const& t) {
    return error_of([&] { TileMatmul::tile_payload(op, t); });
  };
  EXPECT_TRUE(
      mentions(message(operands(4, 4, 4, 4), TileGrid{8, 4, 4, 4}.tile(1, 0)), "outside C"));
  EXPECT_TRUE(mentions(message(operands(4, 4, 4, 3), TileGrid{4, 4, 4, 4}.tile(0, 0)),
                       "leading dimensions"));
  std::uint32_t const too_long = TileMatmul::kMaxExtent + 1;
  EXPECT_TRUE(mentions(message(operands(4, 4, too_long, too_long), TileGrid{4, 4, 4, 4}.tile(0, 0)),
                       "at most"));
  EXPECT_TRUE(mentions(message(operands(5000, 4, 4, 4), TileGrid{5000, 4, 4096, 4}.tile(0, 0)),
                       "per side"));
}

// Sub-matrices of larger buffers: the tile must read and write only inside its view, with bias
// and activation applied per column.
TEST(TileMatmul, StridedOperandsWithBiasMatchFloat64Reference) {
  TracedSeed const seed;
  std::mt19937 rng(seed);
  StridedMatmul const mm(rng);
  std::vector<float> c(std::size_t{mm.m} * mm.ldc, kNaN);
  tasks::MatmulOperands const op = mm.operands(mm.a.data(), mm.b.data(), mm.bias.data(), c.data());
  GraphBuilder builder;
  TileGrid{mm.m, mm.n, 32, 16}.for_each([&](Tile const& t) {
    builder.add_task(ExamplesPipeline::make<TileMatmul>(TileMatmul::tile_payload(op, t)));
  });
  CpuExecutor<ExamplesPipeline> ex(one_rank(builder.build()), with_processors(3));
  ex.run();
  mm.expect_matches_reference(c);
}

std::vector<double> reference_softmax(std::vector<float> const& in, std::uint32_t rows,
                                      std::uint32_t cols) {
  std::vector<double> out(in.size());
  for (std::uint32_t r = 0; r < rows; ++r) {
    float const* x = in.data() + std::size_t{r} * cols;
    double* y = out.data() + std::size_t{r} * cols;
    double max = x[0];
    for (std::uint32_t c = 1; c < cols; ++c) max = std::fmax(max, double(x[c]));
    double sum = 0.0;
    for (std::uint32_t c = 0; c < cols; ++c) sum += (y[c] = std::exp(double(x[c]) - max));
    for (std::uint32_t c = 0; c < cols; ++c) y[c] /= sum;
  }
  return out;
}

// A task type defined outside runtime/ and tasks/, one block of rows per task; logits large
// enough that exp without the max shift would overflow.
TEST(RowSoftmax, MatchesFloat64ReferenceOnLargeLogits) {
  TracedSeed const seed;
  std::mt19937 rng(seed);
  struct Case {
    std::uint32_t rows, cols, rows_per_task;
  };
  for (Case const cs : {Case{333, 1000, 16}, Case{64, 7, 5}, Case{1, 1, 1}}) {
    SCOPED_TRACE(std::to_string(cs.rows) + "x" + std::to_string(cs.cols));
    std::vector<float> in = uniform(rng, std::size_t{cs.rows} * cs.cols, 200.0f);
    std::vector<double> const ref = reference_softmax(in, cs.rows, cs.cols);
    std::vector<float> out(in.size(), kNaN);
    GraphBuilder builder;
    TileGrid{cs.rows, cs.cols, cs.rows_per_task, cs.cols}.for_each([&](Tile const& t) {
      RowSoftmax::Payload const p{in.data() + std::size_t{t.row0} * cs.cols,
                                  out.data() + std::size_t{t.row0} * cs.cols,
                                  t.rows,
                                  cs.cols,
                                  cs.cols,
                                  cs.cols};
      builder.add_task(ExamplesPipeline::make<RowSoftmax>(p));
    });
    CpuExecutor<ExamplesPipeline> ex(one_rank(builder.build()), with_processors(4));
    ex.run();
    EXPECT_LT(examples::relative_error(out, ref), kFp32Tolerance);
  }
}

}  // namespace
}  // namespace loom::test
