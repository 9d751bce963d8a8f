// The examples on the CPU executor: the fused MLP (TileMatmul tiles with per-row-block events)
// against its float64 reference over shapes that clip tiles, every activation and both policies;
// the graph's dependency structure; TileMatmul's payload packing and strided operands; and the
// user-defined RowSoftmax task against a float64 softmax.
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "examples/custom_task/row_softmax.hpp"
#include "examples/fused_mlp/fused_mlp.hpp"
#include "tasks/tile_matmul.hpp"
#include "tests/cpu/test_support.hpp"

namespace loom::test {
namespace {

using examples::FusedMlpProblem;
using examples::RowSoftmax;
using tasks::Activation;
using tasks::TileMatmul;

using ExamplesPipeline = Pipeline<TileMatmul, RowSoftmax>;

constexpr double kFp32Tolerance = 1e-5;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr Activation kActivations[] = {Activation::none, Activation::relu, Activation::gelu_tanh,
                                       Activation::silu};
constexpr SchedulingPolicy kPolicies[] = {SchedulingPolicy::fifo, SchedulingPolicy::priority};

std::vector<float> uniform(std::mt19937& rng, std::size_t count, float scale) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(count);
  for (float& e : v) e = dist(rng);
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
  std::vector<float> x, w1, w2, b1;
};

MlpInputs random_mlp_inputs(FusedMlpProblem const& p, std::mt19937& rng) {
  return MlpInputs{uniform(rng, std::size_t{p.m} * p.k, 1.0f),
                   uniform(rng, std::size_t{p.k} * p.h, 1.0f / std::sqrt(float(p.k))),
                   uniform(rng, std::size_t{p.h} * p.n, 1.0f / std::sqrt(float(p.h))),
                   uniform(rng, p.h, 0.5f)};
}

// Runs the fused MLP for every activation and both policies, fresh inputs per activation, Y and
// the hidden layer poisoned before every launch.
void check_fused_mlp(FusedMlpProblem p, bool with_bias, CpuOptions const& options) {
  std::uint32_t const seed = fresh_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937 rng(seed);
  for (Activation act : kActivations) {
    SCOPED_TRACE(tasks::to_string(act));
    p.activation = act;
    MlpInputs const in = random_mlp_inputs(p, rng);
    float const* b1 = with_bias ? in.b1.data() : nullptr;
    std::vector<double> const ref =
        examples::reference_fused_mlp(p, in.x.data(), in.w1.data(), in.w2.data(), b1);
    std::vector<float> hidden(std::size_t{p.m} * p.h), y(std::size_t{p.m} * p.n);
    CpuExecutor<ExamplesPipeline> ex(
        one_rank(examples::build_fused_mlp_graph<ExamplesPipeline>(
            p, in.x.data(), in.w1.data(), in.w2.data(), hidden.data(), y.data(), b1)),
        options);
    for (SchedulingPolicy policy : kPolicies) {
      SCOPED_TRACE(to_string(policy));
      std::fill(hidden.begin(), hidden.end(), kNaN);
      std::fill(y.begin(), y.end(), kNaN);
      ex.run(policy);
      EXPECT_LT(examples::relative_error(y, ref), kFp32Tolerance);
    }
  }
}

FusedMlpProblem shape(std::uint32_t m, std::uint32_t k, std::uint32_t h, std::uint32_t n,
                      std::uint32_t tile_m, std::uint32_t tile_h, std::uint32_t tile_n) {
  FusedMlpProblem p;
  p.m = m, p.k = k, p.h = h, p.n = n;
  p.tile_m = tile_m, p.tile_h = tile_h, p.tile_n = tile_n;
  return p;
}

TEST(FusedMlp, MatchesFloat64ReferenceWithWholeTiles) {
  check_fused_mlp(shape(128, 64, 256, 96, 32, 64, 32), false, with_processors(4));
  check_fused_mlp(FusedMlpProblem{}, true, with_processors(4));  // the CLI's default problem
}

TEST(FusedMlp, MatchesFloat64ReferenceWithTilesClippedAtEveryEdge) {
  check_fused_mlp(shape(100, 70, 300, 33, 32, 48, 16), true, with_processors(4));
  check_fused_mlp(shape(65, 129, 130, 67, 64, 64, 64), false, with_processors(3));
}

TEST(FusedMlp, MatchesFloat64ReferenceWhenOneTileCoversEverything) {
  check_fused_mlp(shape(1, 5, 7, 3, 64, 64, 64), true, with_processors(2));
}

TEST(FusedMlp, MatchesFloat64ReferenceUnderAdversarialInterleaving) {
  CpuOptions options = with_processors(4);
  options.chaos_seed = fresh_seed() | 1u;
  options.chaos_per_mille = 200;
  options.chaos_max_delay_us = 100;
  SCOPED_TRACE("chaos seed " + std::to_string(options.chaos_seed));
  check_fused_mlp(shape(96, 40, 130, 50, 16, 32, 16), true, options);
}

TEST(FusedMlp, OutputTilesWaitOnlyForTheirOwnHiddenRowBlock) {
  FusedMlpProblem const p = shape(100, 8, 300, 33, 32, 48, 16);
  std::uint32_t const row_tiles = 4, hidden_col_tiles = 7, output_col_tiles = 3;
  std::vector<float> x(std::size_t{p.m} * p.k), w1(std::size_t{p.k} * p.h),
      w2(std::size_t{p.h} * p.n), hidden(std::size_t{p.m} * p.h), y(std::size_t{p.m} * p.n);
  Graph const g = examples::build_fused_mlp_graph<ExamplesPipeline>(
      p, x.data(), w1.data(), w2.data(), hidden.data(), y.data());
  ASSERT_EQ(g.events.size(), row_tiles);
  ASSERT_EQ(g.tasks.size(), row_tiles * (hidden_col_tiles + output_col_tiles));
  for (std::uint32_t i = 0; i < row_tiles; ++i) {
    EXPECT_EQ(g.events[i].expected, hidden_col_tiles) << "row block " << i;
    // Its successors: exactly the output tiles of row block i, each gated by this event alone.
    std::vector<TaskId> const succ(g.successors.begin() + g.events[i].succ_begin,
                                   g.successors.begin() + g.events[i].succ_end);
    ASSERT_EQ(succ.size(), output_col_tiles) << "row block " << i;
    for (std::uint32_t j = 0; j < output_col_tiles; ++j) {
      TaskId const expected = row_tiles * hidden_col_tiles + i * output_col_tiles + j;
      EXPECT_EQ(succ[j], expected);
      EXPECT_EQ(g.gate_counts[expected], 1u);
      EXPECT_EQ(g.tasks[expected].header.event, kNoEvent);
    }
    for (std::uint32_t j = 0; j < hidden_col_tiles; ++j) {
      TaskId const t = i * hidden_col_tiles + j;
      EXPECT_EQ(g.tasks[t].header.event, i);
      EXPECT_EQ(g.gate_counts[t], 0u);
    }
  }
  EXPECT_EQ(g.roots.size(), row_tiles * hidden_col_tiles);
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

TEST(FusedMlp, RejectsZeroExtents) {
  FusedMlpProblem p;
  p.tile_h = 0;
  EXPECT_TRUE(mentions(error_of([&] { examples::validate(p); }), "tile_h = 0"));
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

// Sub-matrices of larger buffers (lda > k, ldb > n, ldc > n): the tile must read and write only
// inside its view, with bias and activation applied per column.
TEST(TileMatmul, StridedOperandsWithBiasMatchFloat64Reference) {
  std::uint32_t const seed = fresh_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937 rng(seed);
  std::uint32_t const m = 70, n = 45, k = 90, lda = 101, ldb = 52, ldc = 61;
  std::vector<float> const a = uniform(rng, std::size_t{m} * lda, 1.0f);
  std::vector<float> const b = uniform(rng, std::size_t{k} * ldb, 0.1f);
  std::vector<float> const bias = uniform(rng, n, 1.0f);
  std::vector<float> c(std::size_t{m} * ldc, kNaN);
  tasks::MatmulOperands op;
  op.a = a.data(), op.b = b.data(), op.c = c.data(), op.bias = bias.data();
  op.m = m, op.n = n, op.k = k, op.lda = lda, op.ldb = ldb, op.ldc = ldc;
  op.activation = Activation::gelu_tanh;
  GraphBuilder builder;
  TileGrid{m, n, 32, 16}.for_each([&](Tile const& t) {
    builder.add_task(ExamplesPipeline::make<TileMatmul>(TileMatmul::tile_payload(op, t)));
  });
  CpuExecutor<ExamplesPipeline> ex(one_rank(builder.build()), with_processors(3));
  ex.run();

  std::vector<float> out;
  std::vector<double> ref;
  for (std::uint32_t r = 0; r < m; ++r) {
    for (std::uint32_t col = 0; col < n; ++col) {
      double sum = bias[col];
      for (std::uint32_t kk = 0; kk < k; ++kk)
        sum += double(a[std::size_t{r} * lda + kk]) * double(b[std::size_t{kk} * ldb + col]);
      ref.push_back(tasks::activate(Activation::gelu_tanh, sum));
      out.push_back(c[std::size_t{r} * ldc + col]);
    }
    for (std::uint32_t col = n; col < ldc; ++col)
      ASSERT_TRUE(std::isnan(c[std::size_t{r} * ldc + col])) << "row " << r << " col " << col;
  }
  EXPECT_LT(examples::relative_error(out, ref), kFp32Tolerance);
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
  std::uint32_t const seed = fresh_seed();
  SCOPED_TRACE(seed_trace(seed));
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
