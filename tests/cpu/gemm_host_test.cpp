// The bf16 tile GEMM task's host body on the CPU executor, against float64: every epilogue, both
// output types, several experts with row counts off the tile grid, K and N off the tile grid,
// split-K; plus the host-side checks (operands, tile payloads), the tile heuristic, and the sink
// hook with a user-defined sink.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "tasks/gemm/heuristic.hpp"
#include "tasks/gemm/tiling.hpp"
#include "tasks/gemm_tile.hpp"
#include "tests/cpu/test_support.hpp"

namespace loom::test {
namespace {

namespace g = tasks::gemm;
using tasks::GemmTile;
using GemmPipeline = Pipeline<GemmTile>;

struct HostGemm {
  std::uint32_t experts = 2, n = 96, k = 72;
  std::vector<std::uint32_t> rows = {130, 7};
  g::OutputType out = g::OutputType::bf16;
  g::GemmActivation act = g::GemmActivation::none;
  bool bias = true, scale = true;
  g::GemmConfig cfg{};
};

std::vector<g::Bf16> random_bf16(std::size_t n, std::mt19937& rng, float scale) {
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<g::Bf16> v(n);
  for (auto& x : v) x = g::to_bf16(d(rng));
  return v;
}

// Runs `h` through the CPU executor; returns the relative error against float64, and checks that
// nothing outside the valid rows and columns was written.
template <class Task = GemmTile>
double run_host_gemm(HostGemm const& h, std::uint32_t run = 1) {
  TracedSeed const seed;
  std::mt19937 rng(seed);
  bool const swiglu = h.act == g::GemmActivation::swiglu;
  std::uint32_t const n_out = swiglu ? h.n / 2 : h.n, ldc = n_out + 8;
  std::vector<std::uint32_t> row0;
  std::uint32_t a_rows = 0;
  for (std::uint32_t r : h.rows) row0.push_back(a_rows), a_rows += r + 2;
  auto const a = random_bf16(std::size_t{a_rows} * h.k, rng, 1.0f);
  auto const b = random_bf16(std::size_t{h.experts} * h.n * h.k, rng, 1.0f / std::sqrt(float(h.k)));
  std::uniform_real_distribution<float> ud(-0.5f, 0.5f), sd(0.5f, 1.5f);
  std::vector<float> bias(std::size_t{h.experts} * h.n), scale(a_rows);
  for (auto& x : bias) x = ud(rng);
  for (auto& x : scale) x = sd(rng);
  std::uint32_t const eb = h.out == g::OutputType::bf16 ? 2 : 4;
  std::vector<unsigned char> c(std::size_t{a_rows} * ldc * eb, 0xFF);

  g::GemmDesc d;
  d.a = a.data(), d.a_rows = a_rows, d.b = b.data(), d.experts = h.experts, d.n = h.n, d.k = h.k;
  d.c = c.data(), d.ldc = ldc, d.output = h.out, d.activation = h.act;
  d.bias = h.bias ? bias.data() : nullptr;
  d.row_scale = h.scale ? scale.data() : nullptr;
  g::GemmOperands op = g::make_operands(d, h.cfg);
  op.slots = 1024;  // the host body needs no workspace; payloads only check the slot range
  GraphBuilder builder;
  std::uint32_t slot = 0;
  for (std::uint32_t e = 0; e < h.experts; ++e)
    if (h.rows[e] > 0)
      for (auto const& p : g::gemm_tile_payloads<Task>(op, &op, {e, row0[e], row0[e], h.rows[e]},
                                                       slot, g::kRasterGroupM, run))
        builder.add_task(Pipeline<Task>::template make<Task>(p));
  CpuOptions options;
  options.processors = 3;
  std::vector<Graph> graphs;
  graphs.push_back(builder.build());
  CpuExecutor<Pipeline<Task>> ex(std::move(graphs), options);
  ex.run();

  double num = 0, den = 0;
  std::size_t outside_written = 0;
  std::vector<char> valid(a_rows, 0);
  for (std::uint32_t e = 0; e < h.experts; ++e)
    for (std::uint32_t r = 0; r < h.rows[e]; ++r) valid[row0[e] + r] = 1;
  for (std::uint32_t e = 0; e < h.experts; ++e) {
    for (std::uint32_t r = 0; r < h.rows[e]; ++r) {
      std::uint32_t const ar = row0[e] + r;
      std::vector<double> acc(h.n);
      for (std::uint32_t j = 0; j < h.n; ++j) {
        double s = 0;
        for (std::uint32_t kk = 0; kk < h.k; ++kk)
          s += double(g::to_float(a[std::size_t{ar} * h.k + kk])) *
               double(g::to_float(b[(std::size_t{e} * h.n + j) * h.k + kk]));
        acc[j] = s + (h.bias ? double(bias[std::size_t{e} * h.n + j]) : 0.0);
      }
      for (std::uint32_t o = 0; o < n_out; ++o) {
        double want = swiglu ? g::swiglu(acc[g::swiglu_gate_column(o)], acc[g::swiglu_up_column(o)])
                             : g::activate(h.act, acc[o]);
        if (h.scale) want *= scale[ar];
        unsigned char const* p = c.data() + (std::size_t{ar} * ldc + o) * eb;
        double got;
        if (eb == 2) {
          g::Bf16 x;
          std::memcpy(&x, p, 2);
          got = g::to_float(x);
        } else {
          float f;
          std::memcpy(&f, p, 4);
          got = f;
        }
        if (std::isnan(got)) return INFINITY;
        num += (got - want) * (got - want), den += want * want;
      }
    }
  }
  for (std::uint32_t r = 0; r < a_rows; ++r)
    for (std::uint32_t o = 0; o < ldc; ++o)
      if (!valid[r] || o >= n_out)
        for (std::uint32_t i = 0; i < eb; ++i)
          outside_written += c[(std::size_t{r} * ldc + o) * eb + i] != 0xFF;
  EXPECT_EQ(outside_written, 0u) << "bytes written outside the valid rows and columns";
  return std::sqrt(num / std::max(den, 1e-30));
}

TEST(GemmHost, EveryEpilogueMatchesFloat64) {
  for (auto act : {g::GemmActivation::none, g::GemmActivation::relu, g::GemmActivation::gelu_tanh,
                   g::GemmActivation::swiglu}) {
    for (auto out : {g::OutputType::bf16, g::OutputType::fp32}) {
      SCOPED_TRACE(std::string(g::to_string(act)) +
                   (out == g::OutputType::bf16 ? " bf16" : " fp32"));
      HostGemm h;
      h.act = act, h.out = out;
      h.cfg.block_m = 64, h.cfg.block_n = 128;
      EXPECT_LT(run_host_gemm(h), out == g::OutputType::bf16 ? 1e-2 : 1e-5);
    }
  }
}

// Every activation's name parses back to it; an unknown name is refused with the choices.
TEST(GemmHost, ActivationNamesRoundTrip) {
  for (auto a : {g::GemmActivation::none, g::GemmActivation::relu, g::GemmActivation::gelu_tanh,
                 g::GemmActivation::swiglu})
    EXPECT_EQ(g::parse_gemm_activation(g::to_string(a)), a);
  EXPECT_TRUE(mentions(error_of([] { g::parse_gemm_activation("silu"); }), "choose none, relu"));
}

TEST(GemmHost, SplitKAndEveryTileShapeMatchFloat64) {
  for (auto [bm, bn, splits] :
       {std::tuple{128, 64, 3}, std::tuple{128, 256, 1}, std::tuple{64, 256, 2},
        std::tuple{128, 128, 2}, std::tuple{128, 224, 1}, std::tuple{128, 224, 2},
        std::tuple{192, 256, 1}}) {
    HostGemm h;
    h.cfg.block_m = static_cast<std::uint16_t>(bm), h.cfg.block_n = static_cast<std::uint16_t>(bn);
    h.cfg.splits = static_cast<std::uint8_t>(splits);
    h.cfg.stages = static_cast<std::uint8_t>(h.cfg.max_stages());
    h.k = 328, h.n = 272, h.experts = 3, h.rows = {1, 0, 200};
    h.act = g::GemmActivation::swiglu, h.out = g::OutputType::fp32;
    double const err = h.cfg.wide()   ? run_host_gemm<tasks::GemmWideTile>(h)
                       : h.cfg.tall() ? run_host_gemm<tasks::GemmTallTile>(h)
                                      : run_host_gemm(h);
    EXPECT_LT(err, 1e-5) << bm << "x" << bn << " split " << splits;
  }
}

// Tasks of runs of N-tiles (the last run shorter) compute the same function.
TEST(GemmHost, RunsOfNTilesMatchFloat64) {
  for (std::uint32_t run : {2u, 3u, 5u}) {
    HostGemm h;
    h.cfg.block_m = 128, h.cfg.block_n = 64;
    h.cfg.stages = static_cast<std::uint8_t>(h.cfg.max_stages());
    h.k = 136, h.n = 7 * 64 + 32, h.experts = 2, h.rows = {140, 5};
    h.act = g::GemmActivation::swiglu;
    EXPECT_LT(run_host_gemm<tasks::GemmRunTile>(h, run), 1e-2) << "run " << run;
  }
}

TEST(GemmHost, RunHeuristicKeepsEveryProcessorBusy) {
  g::GemmConfig cfg;
  cfg.block_m = 128, cfg.block_n = 256;
  EXPECT_EQ(g::choose_gemm_run(cfg, 8192, 8192), 4u);  // 512 tasks: 4 waves of 4 tiles
  EXPECT_EQ(g::choose_gemm_run(cfg, 4096, 4096), 4u);  // 128 tasks: one wave of 4 tiles
  EXPECT_EQ(g::choose_gemm_run(cfg, 128, 7168), 1u);   // 28 tiles: runs would idle processors
  EXPECT_EQ(g::choose_gemm_run(cfg, 1024, 512), 1u);   // 2 n tiles, 16 tasks
  cfg.splits = 2;
  EXPECT_EQ(g::choose_gemm_run(cfg, 8192, 8192), 1u);
}

// Host buffers for an fp32-output GEMM of a_rows x n x k and its description (the contents are not
// read: for tests of what is accepted).
struct Fp32Operands {
  std::vector<g::Bf16> a, b;
  std::vector<float> c;
  g::GemmDesc d;
  Fp32Operands(std::uint32_t a_rows, std::uint32_t n, std::uint32_t k)
      : a(std::size_t{a_rows} * k), b(std::size_t{n} * k), c(std::size_t{a_rows} * n) {
    d.a = a.data(), d.a_rows = a_rows, d.b = b.data(), d.n = n, d.k = k, d.c = c.data();
    d.output = g::OutputType::fp32;
  }
  Fp32Operands(Fp32Operands const&) = delete;
  Fp32Operands& operator=(Fp32Operands const&) = delete;
};

TEST(GemmHost, RunPayloadsAreChecked) {
  HostGemm h;
  h.cfg.block_m = 128, h.cfg.block_n = 64;
  Fp32Operands const o(64, 256, 128);
  g::GemmDesc const& d = o.d;
  g::GemmOperands op = g::make_operands(d, h.cfg);
  tasks::GemmTileCoord t;
  t.rows = 64, t.n_tile = 2, t.count = 3;  // tiles 2, 3, 4 of 4
  EXPECT_THROW(tasks::GemmRunTile::payload(op, &op, t), Error);
  t.count = 0;
  EXPECT_THROW(tasks::GemmRunTile::payload(op, &op, t), Error);
  t.count = 2;
  EXPECT_NO_THROW(tasks::GemmRunTile::payload(op, &op, t));
  EXPECT_THROW(GemmTile::payload(op, &op, t), Error);  // a single-tile task type
  h.cfg.splits = 2;
  g::GemmOperands split = g::make_operands(d, h.cfg);
  split.slots = 1;
  EXPECT_THROW(tasks::GemmRunTile::payload(split, &split, t), Error);
}

// A task type built without split-K refuses split configurations, on the host and in the payload
// check the device shares.
TEST(GemmHost, TaskTypesWithoutSplitKRefuseSplits) {
  using NoSplit = tasks::GemmTileTask<g::LocalTileSink, false, false>;
  Fp32Operands const o(64, 128, 128);
  g::GemmDesc const& d = o.d;
  g::GemmConfig cfg;
  cfg.block_m = 64, cfg.block_n = 128;
  tasks::GemmTileCoord t;
  t.rows = 64;
  g::GemmOperands op = g::make_operands(d, cfg);
  EXPECT_NO_THROW(NoSplit::payload(op, &op, t));
  cfg.splits = 2;
  g::GemmOperands split = g::make_operands(d, cfg);
  split.slots = 1;
  EXPECT_NO_THROW(GemmTile::payload(split, &split, t));
  EXPECT_TRUE(mentions(error_of([&] { NoSplit::payload(split, &split, t); }), "does not split K"));
  NoSplit::Payload const p = NoSplit::payload(op, &op, t);
  EXPECT_FALSE(NoSplit::bad_payload(p, op));
  EXPECT_TRUE(NoSplit::bad_payload(p, split));  // operands changed after the payload was made
}

// The 128x224 tile has task types of their own (a kernel of their own), which take no other tile.
TEST(GemmHost, WideTilesRunOnTheWideTaskTypesOnly) {
  Fp32Operands const o(64, 448, 128);
  g::GemmDesc const& d = o.d;
  g::GemmConfig cfg;
  cfg.block_m = 128, cfg.block_n = 224, cfg.stages = 4;
  tasks::GemmTileCoord t;
  t.rows = 64;
  g::GemmOperands const wide = g::make_operands(d, cfg);
  cfg.block_n = 128;
  g::GemmOperands const narrow = g::make_operands(d, cfg);
  EXPECT_NO_THROW(tasks::GemmWideTile::payload(wide, &wide, t));
  EXPECT_NO_THROW(tasks::GemmWideRunTile::payload(wide, &wide, t));
  EXPECT_NO_THROW(GemmTile::payload(narrow, &narrow, t));
  EXPECT_TRUE(mentions(error_of([&] { GemmTile::payload(wide, &wide, t); }), "wide task types"));
  EXPECT_TRUE(
      mentions(error_of([&] { tasks::GemmRunTile::payload(wide, &wide, t); }), "wide task types"));
  EXPECT_TRUE(mentions(error_of([&] { tasks::GemmWideTile::payload(narrow, &narrow, t); }),
                       "only 128x224 tiles"));
  // Operands changed after the payload was made: refused where the task runs, too.
  EXPECT_TRUE(GemmTile::bad_payload(GemmTile::payload(narrow, &narrow, t), wide));
  EXPECT_TRUE(
      tasks::GemmWideTile::bad_payload(tasks::GemmWideTile::payload(wide, &wide, t), narrow));
}

// The 192x256 tile runs on the task types built for it, without split-K.
TEST(GemmHost, TallTilesRunOnTheTallTaskTypesWithoutSplitK) {
  Fp32Operands const o(400, 512, 128);
  g::GemmDesc const& d = o.d;
  g::GemmConfig cfg;
  cfg.block_m = 192, cfg.block_n = 256, cfg.stages = 3;
  EXPECT_EQ(cfg.max_stages(), 3u);  // three 56 KB stages in the stage area
  tasks::GemmTileCoord t;
  t.rows = 192;
  g::GemmOperands const tall = g::make_operands(d, cfg);
  using NoSplit = tasks::GemmTileTask<g::LocalTileSink, false, false, false, true>;
  EXPECT_NO_THROW(tasks::GemmTallTile::payload(tall, &tall, t));
  EXPECT_NO_THROW(NoSplit::payload(tall, &tall, t));
  EXPECT_TRUE(mentions(error_of([&] { GemmTile::payload(tall, &tall, t); }), "built with kTall"));
  EXPECT_TRUE(
      mentions(error_of([&] { tasks::GemmRunTile::payload(tall, &tall, t); }), "built with kTall"));
  t.rows = 193;
  EXPECT_TRUE(mentions(error_of([&] { tasks::GemmTallTile::payload(tall, &tall, t); }),
                       "rows must be 1..192"));
  cfg.splits = 2;
  EXPECT_TRUE(mentions(error_of([&] { g::make_operands(d, cfg); }), "it takes no split"));
  cfg.splits = 1, cfg.stages = 2;
  EXPECT_TRUE(mentions(error_of([&] { g::make_operands(d, cfg); }), "pipeline has 3"));
  cfg.stages = 3, cfg.block_n = 128;
  EXPECT_TRUE(mentions(error_of([&] { g::make_operands(d, cfg); }), "192x256"));
  // Refused where the task runs, too.
  GemmTile::Payload plain{};
  plain.ops = &tall, plain.rows = 150;
  EXPECT_TRUE(GemmTile::bad_payload(plain, tall));
  tasks::GemmTallTile::Payload single{};
  single.ops = &tall, single.rows = 150;
  EXPECT_FALSE(tasks::GemmTallTile::bad_payload(single, tall));
}

// The wgmma pipeline is inlined into the kernel, never a call (ptxas would serialize it).
TEST(GemmHost, TileTaskTypesAreInlinedIntoTheKernel) {
  using Run = tasks::GemmRunTile;
  using NoSplit = tasks::GemmTileTask<g::LocalTileSink, false, false>;
  EXPECT_FALSE(GemmPipeline::called<GemmTile>);
  EXPECT_FALSE((Pipeline<Run, NoSplit>::called<Run>));
  EXPECT_FALSE((Pipeline<Run, NoSplit>::called<NoSplit>));
}

// B's loads are evict_first exactly when the GEMM has one row tile: then no other tile reads a
// tile's columns of B (split-K's splits read disjoint K blocks).
TEST(GemmHost, OnlyAGemmOfOneRowTileStreamsB) {
  Fp32Operands const o(300, 256, 256);
  g::GemmConfig cfg;
  cfg.block_m = 128, cfg.block_n = 64;
  for (std::uint32_t splits : {1u, 2u}) {
    cfg.splits = splits;
    g::GemmOperands op = g::make_operands(o.d, cfg);
    op.slots = 64;
    for (std::uint32_t rows : {1u, 128u, 129u, 300u}) {
      std::uint32_t slot = 0;
      auto const tiles = g::gemm_tile_payloads<GemmTile>(op, &op, {0, 0, 0, rows}, slot);
      ASSERT_EQ(tiles.size(), std::size_t{(rows + 127) / 128} * 4 * splits);
      g::L2Hint const want = rows <= 128 ? g::L2Hint::evict_first : g::L2Hint::normal;
      for (auto const& p : tiles) EXPECT_EQ(p.b_l2, want) << rows << " rows, split " << p.split;
    }
  }
}

// C's rows bound the run task's TMA stores: a_rows unless given.
TEST(GemmHost, CRowsDefaultToTheRowsOfA) {
  std::vector<g::Bf16> a(64 * 128), b(256 * 128), c(96 * 256);
  g::GemmDesc d;
  d.a = a.data(), d.a_rows = 64, d.b = b.data(), d.n = 256, d.k = 128, d.c = c.data();
  g::GemmConfig cfg;
  EXPECT_EQ(g::make_operands(d, cfg).c_rows, 64u);
  d.c_rows = 96;
  EXPECT_EQ(g::make_operands(d, cfg).c_rows, 96u);
  EXPECT_EQ(g::make_operands(d, cfg).c_map_ready, 0u);  // encoded on the device side only
}

// A user sink: writes each tile's rows, reversed left to right, into C. Shows the hook's contract
// (rows and cols valid, c_row0 / c_col0 placing the tile) without a device body.
struct MirroringSink {
  static void deliver_host(g::StagedTile const& t, g::GemmOperands const& op, TaskContext&) {
    auto* c = static_cast<unsigned char*>(op.c);
    for (std::uint32_t r = 0; r < t.rows; ++r)
      for (std::uint32_t j = 0; j < t.cols; ++j)
        std::memcpy(c + (std::size_t{t.c_row0 + r} * op.ldc + (op.n_out - 1 - (t.c_col0 + j))) *
                            t.elem_bytes,
                    t.data + std::size_t{r} * t.row_stride + std::size_t{j} * t.elem_bytes,
                    t.elem_bytes);
  }
};

TEST(GemmHost, SinkReceivesEveryFinishedTileOnce) {
  // The mirrored output must be exactly the local sink's output reversed.
  HostGemm h;
  h.cfg.block_m = 64, h.cfg.block_n = 128;
  h.out = g::OutputType::fp32, h.act = g::GemmActivation::relu;
  h.experts = 1, h.rows = {100}, h.n = 384, h.k = 64;
  std::uint32_t const a_rows = 102, ldc = h.n;
  TracedSeed const seed;
  std::mt19937 rng(seed);
  auto const a = random_bf16(std::size_t{a_rows} * h.k, rng, 1.0f);
  auto const b = random_bf16(std::size_t{h.n} * h.k, rng, 1.0f);
  std::vector<float> local(std::size_t{a_rows} * ldc, -1.0f), mirrored(local);
  auto run = [&](auto task, std::vector<float>& c) {
    using Task = decltype(task);
    g::GemmDesc d;
    d.a = a.data(), d.a_rows = a_rows, d.b = b.data(), d.n = h.n, d.k = h.k, d.c = c.data();
    d.output = h.out, d.activation = h.act;
    g::GemmOperands op = g::make_operands(d, h.cfg);
    GraphBuilder builder;
    std::uint32_t slot = 0;
    for (auto const& p : g::gemm_tile_payloads<Task>(op, &op, {0, 0, 0, 100}, slot))
      builder.add_task(Pipeline<Task>::template make<Task>(p));
    std::vector<Graph> graphs;
    graphs.push_back(builder.build());
    CpuExecutor<Pipeline<Task>> ex(std::move(graphs), CpuOptions{});
    ex.run();
  };
  run(GemmTile{}, local);
  run(tasks::GemmTileTask<MirroringSink>{}, mirrored);
  for (std::uint32_t r = 0; r < a_rows; ++r)
    for (std::uint32_t j = 0; j < h.n; ++j)
      ASSERT_EQ(std::memcmp(&local[std::size_t{r} * ldc + j],
                            &mirrored[std::size_t{r} * ldc + (h.n - 1 - j)], 4),
                0)
          << "row " << r << " column " << j;
}

TEST(GemmHost, BadOperandsAreRejectedWithTheReason) {
  Fp32Operands const o(64, 64, 72);
  g::GemmDesc const& d = o.d;
  g::GemmConfig cfg;
  cfg.block_m = 128, cfg.block_n = 64, cfg.stages = 4;
  EXPECT_TRUE(succeeds([&] { g::make_operands(d, cfg); }));
  auto with = [&](auto edit) {
    g::GemmDesc e = d;
    g::GemmConfig f = cfg;
    edit(e, f);
    return error_of([&] { g::make_operands(e, f); });
  };
  EXPECT_TRUE(mentions(with([](auto& e, auto&) { e.k = 70; }), "multiple of 8"));
  EXPECT_TRUE(mentions(with([](auto& e, auto&) { e.n = 60; }), "n=60"));
  EXPECT_TRUE(
      mentions(with([](auto& e, auto&) { e.n = 56, e.activation = g::GemmActivation::swiglu; }),
               "multiple of 16 for swiglu"));
  EXPECT_TRUE(mentions(with([](auto&, auto& f) { f.block_n = 32; }), "not one of"));
  EXPECT_TRUE(mentions(with([](auto&, auto& f) { f.stages = 9; }), "stages"));
  EXPECT_TRUE(mentions(with([](auto&, auto& f) { f.splits = 3; }), "split-K 3"));
  EXPECT_TRUE(mentions(with([](auto& e, auto&) { e.ldc = 60; }), "ldc=60"));
  EXPECT_TRUE(mentions(with([](auto& e, auto&) { e.b = nullptr; }), "must all be given"));

  g::GemmOperands const op = g::make_operands(d, cfg);
  auto tile = [&](auto edit) {
    tasks::GemmTileCoord t;
    t.rows = 64;
    edit(t);
    return error_of([&] { GemmTile::payload(op, &op, t); });
  };
  EXPECT_TRUE(succeeds([&] { tile([](auto&) {}); }));
  EXPECT_TRUE(mentions(tile([](auto& t) { t.rows = 0; }), "rows must be 1..128"));
  EXPECT_TRUE(mentions(tile([](auto& t) { t.a_row0 = 1; }), "run past the 64 rows"));
  EXPECT_TRUE(mentions(tile([](auto& t) { t.expert = 1; }), "expert out of range"));
  EXPECT_TRUE(mentions(tile([](auto& t) { t.n_tile = 1; }), "n tile out of range"));
  EXPECT_TRUE(mentions(tile([](auto& t) { t.split = 1; }), "split out of range"));
}

std::uint32_t task_count(g::GemmShape const& s, g::GemmConfig const& c) {
  return ((s.m + c.block_m - 1) / c.block_m) * ((s.n + c.block_n - 1) / c.block_n) * c.splits;
}

TEST(GemmHeuristic, LargeProblemsGetTheWidestTile) {
  g::GemmShape s;
  s.m = s.n = s.k = 8192;
  g::GemmConfig const c = g::choose_gemm_config(s);
  EXPECT_EQ(c.block_m, 128);
  EXPECT_EQ(c.block_n, 256);
  EXPECT_EQ(c.splits, 1);
  EXPECT_EQ(c.stages, 4);
}

// The tiling each benchmarked shape ran fastest with on an H200 in sweeps of tiles and splits
// (docs/gemm.md, "Split-K summed in registers", "A 224-column tile" and "The heuristic's L2
// ceiling"; the last adds ten medium shapes, which the model gets within 6% of their fastest). A
// change to the model that moves one of these needs a new sweep.
TEST(GemmHeuristic, BenchmarkedShapesGetTheirMeasuredTiling) {
  struct Case {
    std::uint32_t m, n, k, out_bytes;
    std::uint16_t block_m, block_n;
    std::uint8_t splits;
  };
  Case const cases[] = {
      {128, 2048, 2048, 2, 128, 64, 4},
      {256, 2048, 2048, 2, 128, 64, 2},
      {512, 2048, 2048, 2, 128, 64, 1},
      {128, 7168, 7168, 2, 128, 128, 2},
      {256, 7168, 7168, 2, 128, 128, 1},
      {512, 7168, 7168, 2, 128, 224, 1},
      {1024, 1024, 4096, 4, 128, 128, 2},  // the fused MLP example's second layer
      // medium shapes of the sweep with the L2 ceiling (with the wide tile where N = 7168)
      {384, 7168, 7168, 2, 128, 224, 1},
      {2048, 7168, 4096, 2, 128, 224, 1},
      {512, 4096, 7168, 2, 128, 128, 1},
      {384, 4096, 16384, 2, 128, 128, 1},
  };
  g::GemmDeviceModel dev;
  dev.wide_tile = true;  // as the benchmark runs it
  for (Case const& e : cases) {
    g::GemmShape s;
    s.m = e.m, s.n = e.n, s.k = e.k, s.out_bytes = e.out_bytes;
    g::GemmConfig const c = g::choose_gemm_config(s, dev);
    SCOPED_TRACE(std::to_string(e.m) + "x" + std::to_string(e.n) + "x" + std::to_string(e.k) +
                 ": " + std::to_string(c.block_m) + "x" + std::to_string(c.block_n) + " split " +
                 std::to_string(c.splits));
    EXPECT_EQ(c.block_m, e.block_m);
    EXPECT_EQ(c.block_n, e.block_n);
    EXPECT_EQ(c.splits, e.splits);
    EXPECT_EQ(g::config_problem(c, s.k), "");
  }
}

// The default model (no wide tile) on medium shapes where every SM fills its stages from L2 at
// once: 128x256 tiles where they keep most processors busy, 128x128 where they would leave many
// idle, and no split-K once the unsplit tiles occupy most processors (H200 sweep, docs/gemm.md,
// "The heuristic's L2 ceiling").
TEST(GemmHeuristic, MediumShapesWithoutTheWideTile) {
  struct Case {
    std::uint32_t m, n, k;
    std::uint16_t block_n;
  };
  Case const cases[] = {{2048, 7168, 7168, 256},
                        {1024, 14336, 7168, 256},
                        {768, 4096, 4096, 256},
                        {256, 8192, 7168, 128},
                        {1024, 2048, 7168, 128}};
  for (Case const& e : cases) {
    g::GemmShape s;
    s.m = e.m, s.n = e.n, s.k = e.k;
    g::GemmConfig const c = g::choose_gemm_config(s);
    SCOPED_TRACE(std::to_string(e.m) + "x" + std::to_string(e.n) + "x" + std::to_string(e.k));
    EXPECT_EQ(c.block_m, 128);
    EXPECT_EQ(c.block_n, e.block_n);
    EXPECT_EQ(c.splits, 1);
  }
}

// Split-K still serves a product of few tiles over a long K: unsplit, 8 tasks would leave all
// but 8 processors idle for the whole product.
TEST(GemmHeuristic, FewTilesOverALongKAreSplit) {
  g::GemmDeviceModel const dev;
  g::GemmShape s;
  s.m = 128, s.n = 512, s.k = 16384;
  g::GemmConfig const c = g::choose_gemm_config(s, dev);
  EXPECT_GT(c.splits, 1);
  EXPECT_GE(task_count(s, c), dev.processors / 2);
  EXPECT_EQ(g::config_problem(c, s.k), "");
}

// f(shape, the model's choice for it) over every shape of the grid ms x ns x ks.
template <class F>
void for_each_choice(std::initializer_list<std::uint32_t> ms,
                     std::initializer_list<std::uint32_t> ns,
                     std::initializer_list<std::uint32_t> ks, F const& f,
                     g::GemmDeviceModel const& dev = {}) {
  for (std::uint32_t m : ms)
    for (std::uint32_t n : ns)
      for (std::uint32_t k : ks) {
        g::GemmShape s;
        s.m = m, s.n = n, s.k = k;
        SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k));
        f(s, g::choose_gemm_config(s, dev));
      }
}

// The 128x256 tile's last split adds more than one other partial a vector at a time, a round
// trip to L2 each (docs/gemm.md, "Split-K summed in registers"), and the 128x224 tile split in two
// ran behind unsplit 128x128 tiles ("A 224-column tile"): whatever the shape, the model splits
// the first at most in two and never the second. It picks the second only when asked to.
TEST(GemmHeuristic, TheWidestTilesAreSplitLittleOrNot) {
  g::GemmDeviceModel wide;
  wide.wide_tile = true;
  std::uint32_t wide_picks = 0;
  for (g::GemmDeviceModel const& dev : {g::GemmDeviceModel{}, wide})
    for_each_choice(
        {64u, 200u, 384u, 768u, 4096u}, {1024u, 2048u, 7168u, 16384u},
        {1024u, 7168u, 16384u, 65536u},
        [&](g::GemmShape const&, g::GemmConfig const& c) {
          if (c.block_m == 128 && c.block_n == 256) {
            EXPECT_LE(c.splits, 2);
          }
          if (c.wide()) {
            EXPECT_TRUE(dev.wide_tile);
            EXPECT_EQ(c.splits, 1);
            ++wide_picks;
          }
        },
        dev);
  EXPECT_GT(wide_picks, 0u);
}

TEST(GemmHeuristic, EveryChoiceIsAValidConfiguration) {
  for_each_choice({1u, 63u, 200u, 1000u, 5000u}, {8u, 136u, 1024u, 7168u}, {8u, 64u, 200u, 4096u},
                  [](g::GemmShape const& s, g::GemmConfig const& c) {
                    EXPECT_EQ(g::config_problem(c, s.k), "");
                  });
}

}  // namespace
}  // namespace loom::test
