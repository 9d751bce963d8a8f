// The bf16 tile GEMM task inside the persistent kernel, against float64 references: both MMA paths
// (wgmma + TMA, and the mma.sync fallback forced on the same GPU), every tile shape, every
// epilogue, several experts with row counts 1..tile height, K and N off the tile grid, split-K.
// Outputs are NaN-poisoned before each launch; every valid element must be written, and every
// byte outside the valid rows and columns must still be poison afterwards.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>

#include "runtime/cuda/device_buffer.hpp"
#include "runtime/cuda/gpu_executor.cuh"
#include "tasks/gemm/device_gemm.hpp"
#include "tasks/gemm/heuristic.hpp"
#include "tests/gpu/gpu_test_util.cuh"
#include "tests/seed.hpp"

namespace {

namespace g = loom::tasks::gemm;
using loom::tasks::GemmRunTile;
using loom::tasks::GemmTallTile;
using loom::tasks::GemmTile;
using loom::tasks::GemmWideRunTile;
using loom::tasks::GemmWideTile;
using GemmPipeline = loom::Pipeline<GemmTile>;
using GemmRunPipeline = loom::Pipeline<GemmRunTile>;
using GemmWidePipeline = loom::Pipeline<GemmWideTile>;
using GemmWideRunPipeline = loom::Pipeline<GemmWideRunTile>;
using GemmTallPipeline = loom::Pipeline<GemmTallTile>;

struct Case {
  std::string name;
  std::uint32_t experts = 1, n = 128, k = 128;
  std::vector<std::uint32_t> rows;  // rows of A per expert (0 allowed)
  g::OutputType out = g::OutputType::bf16;
  g::GemmActivation act = g::GemmActivation::none;
  bool bias = false, scale = false;
  std::uint16_t block_m = 128, block_n = 128;
  std::uint8_t splits = 1, stages = 0;  // 0: the deepest that fits
  g::MmaPath path = g::MmaPath::wgmma;
  std::uint8_t overlap = 1;
  std::uint32_t chains = 0;  // > 0: tiles strung into chains (local dispatch)
  std::uint32_t run = 1;     // N-tiles per task
  bool run_type = false;     // through the run task type even with run = 1
};

std::ostream& operator<<(std::ostream& os, Case const& c) {
  return os << c.name;
}

constexpr std::uint32_t kGapRows = 3;  // NaN rows of A between experts: never read as data
constexpr std::uint32_t kPadCols = 8;  // C columns past n_out: never written

std::vector<g::Bf16> random_bf16(std::size_t n, std::mt19937& rng, float scale) {
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<g::Bf16> v(n);
  for (auto& x : v) x = g::to_bf16(d(rng));
  return v;
}

std::vector<float> random_floats(std::size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

template <class Pipeline, class Task>
void run_case_with(Case const& c, int launches) {
  loom::test::TracedSeed const seed;
  SCOPED_TRACE(c.name);
  std::mt19937 rng(seed);
  bool const swiglu = c.act == g::GemmActivation::swiglu;
  std::uint32_t const n_out = swiglu ? c.n / 2 : c.n;
  std::uint32_t const ldc = n_out + kPadCols;
  std::uint32_t const eb = c.out == g::OutputType::bf16 ? 2 : 4;

  // A pool: each expert's rows, then kGapRows rows of NaN.
  std::vector<std::uint32_t> row0(c.experts);
  std::uint32_t a_rows = 0;
  for (std::uint32_t e = 0; e < c.experts; ++e) row0[e] = a_rows, a_rows += c.rows[e] + kGapRows;
  auto a = random_bf16(std::size_t{a_rows} * c.k, rng, 1.0f);
  for (std::uint32_t e = 0; e < c.experts; ++e)
    for (std::uint32_t r = c.rows[e]; r < c.rows[e] + kGapRows; ++r)
      for (std::uint32_t kk = 0; kk < c.k; ++kk)
        a[std::size_t{row0[e] + r} * c.k + kk] = g::Bf16{0x7FC0};
  auto const b = random_bf16(std::size_t{c.experts} * c.n * c.k, rng, 1.0f / std::sqrt(float(c.k)));
  auto const bias = random_floats(std::size_t{c.experts} * c.n, rng, -0.5f, 0.5f);
  auto const scale = random_floats(a_rows, rng, 0.5f, 1.5f);

  loom::DeviceBuffer<g::Bf16> da(a), db(b);
  loom::DeviceBuffer<float> dbias(bias), dscale(scale);
  loom::DeviceBuffer<unsigned char> dc(std::size_t{a_rows} * ldc * eb);

  g::GemmDesc desc;
  desc.a = da.get();
  desc.a_rows = a_rows;
  desc.b = db.get();
  desc.experts = c.experts;
  desc.n = c.n;
  desc.k = c.k;
  desc.c = dc.get();
  desc.ldc = ldc;
  desc.output = c.out;
  desc.bias = c.bias ? dbias.get() : nullptr;
  desc.row_scale = c.scale ? dscale.get() : nullptr;
  desc.activation = c.act;
  g::GemmConfig cfg;
  cfg.block_m = c.block_m;
  cfg.block_n = c.block_n;
  cfg.splits = c.splits;
  cfg.path = c.path;
  cfg.overlap = c.overlap;
  cfg.stages = static_cast<std::uint8_t>(c.stages ? c.stages : cfg.max_stages());
  g::DeviceGemm gemm(desc, cfg);

  loom::GraphBuilder builder;
  std::uint32_t slot = 0, tasks = 0;
  for (std::uint32_t e = 0; e < c.experts; ++e)
    if (c.rows[e] > 0)
      tasks +=
          g::add_gemm_tiles<Pipeline, Task>(builder, gemm, {e, row0[e], row0[e], c.rows[e]}, slot,
                                            loom::kNoEvent, {}, g::kRasterGroupM, c.chains, c.run);
  ASSERT_GT(tasks, 0u);
  loom::GpuExecutor<Pipeline> ex(builder.build());

  // float64 reference of the valid region.
  std::vector<double> ref(std::size_t{a_rows} * n_out, 0.0);
  for (std::uint32_t e = 0; e < c.experts; ++e) {
    std::vector<double> acc(c.n);
    for (std::uint32_t r = 0; r < c.rows[e]; ++r) {
      std::uint32_t const ar = row0[e] + r;
      for (std::uint32_t j = 0; j < c.n; ++j) {
        double s = 0;
        for (std::uint32_t kk = 0; kk < c.k; ++kk)
          s += double(g::to_float(a[std::size_t{ar} * c.k + kk])) *
               double(g::to_float(b[(std::size_t{e} * c.n + j) * c.k + kk]));
        acc[j] = s + (c.bias ? double(bias[std::size_t{e} * c.n + j]) : 0.0);
      }
      double const sc = c.scale ? double(scale[ar]) : 1.0;
      for (std::uint32_t o = 0; o < n_out; ++o) {
        double const v = swiglu
                             ? g::swiglu(acc[g::swiglu_gate_column(o)], acc[g::swiglu_up_column(o)])
                             : g::activate(c.act, acc[o]);
        ref[std::size_t{ar} * n_out + o] = v * sc;
      }
    }
  }
  std::vector<char> valid_row(a_rows, 0);
  for (std::uint32_t e = 0; e < c.experts; ++e)
    for (std::uint32_t r = 0; r < c.rows[e]; ++r) valid_row[row0[e] + r] = 1;

  std::vector<unsigned char> first;
  for (int launch = 0; launch < launches; ++launch) {
    dc.fill_bytes(0xFF);  // NaN in bf16 and fp32
    ex.run();
    auto const out = dc.download();
    double num = 0, den = 0, max_abs = 0;
    std::size_t unwritten = 0, overwritten = 0;
    std::ostringstream bad;
    int shown = 0;
    for (std::uint32_t r = 0; r < a_rows; ++r) {
      for (std::uint32_t o = 0; o < ldc; ++o) {
        unsigned char const* p = out.data() + (std::size_t{r} * ldc + o) * eb;
        bool const inside = valid_row[r] && o < n_out;
        if (!inside) {
          for (std::uint32_t i = 0; i < eb; ++i) overwritten += p[i] != 0xFF;
          continue;
        }
        double got;
        if (eb == 2) {
          g::Bf16 h;
          std::memcpy(&h, p, 2);
          got = g::to_float(h);
        } else {
          float f;
          std::memcpy(&f, p, 4);
          got = f;
        }
        double const want = ref[std::size_t{r} * n_out + o];
        if (std::isnan(got)) {
          ++unwritten;
          if (shown < 8) bad << " unwritten(" << r << "," << o << ")", ++shown;
          continue;
        }
        double const d = got - want;
        if (std::fabs(d) > 0.05 * (1.0 + std::fabs(want)) && shown < 8)
          bad << " (" << r << "," << o << "): " << got << " vs " << want, ++shown;
        num += d * d, den += want * want;
        max_abs = std::max(max_abs, std::fabs(d));
      }
    }
    double const err = std::sqrt(num / std::max(den, 1e-30));
    double const tol = c.out == g::OutputType::bf16 ? 1e-2 : 1e-4;
    EXPECT_EQ(unwritten, 0u) << "launch " << launch << bad.str();
    EXPECT_EQ(overwritten, 0u) << "launch " << launch << ": bytes outside the valid rows/columns";
    EXPECT_LT(err, tol) << "launch " << launch << ", max abs error " << max_abs << bad.str();
    std::printf("[ gemm     ] %-44s tasks %5u  rel err %.2e  max abs %.2e\n", c.name.c_str(), tasks,
                err, max_abs);
    if (launch == 0)
      first = out;
    else
      EXPECT_TRUE(out == first) << "launch " << launch << " differs bitwise from launch 0";
  }
}

// Runs of N-tiles go through the run task type, single tiles through GemmTile (192-row ones
// through GemmTallTile).
void run_case(Case const& c, int launches = 2) {
  bool const runs = c.run > 1 || c.run_type;
  if (c.block_m == 192)
    run_case_with<GemmTallPipeline, GemmTallTile>(c, launches);
  else if (c.block_n == 224 && runs)
    run_case_with<GemmWideRunPipeline, GemmWideRunTile>(c, launches);
  else if (c.block_n == 224)
    run_case_with<GemmWidePipeline, GemmWideTile>(c, launches);
  else if (runs)
    run_case_with<GemmRunPipeline, GemmRunTile>(c, launches);
  else
    run_case_with<GemmPipeline, GemmTile>(c, launches);
}

Case make(std::string name, std::uint16_t bm, std::uint16_t bn, g::MmaPath path,
          g::GemmActivation act = g::GemmActivation::none,
          g::OutputType out = g::OutputType::bf16) {
  Case c;
  c.name = std::move(name);
  c.block_m = bm, c.block_n = bn, c.path = path, c.act = act, c.out = out;
  c.experts = 3;
  c.rows = {bm * 2u + 17u, 1u, bm - 1u};
  c.n = 2u * bn + 64u;  // a partial last N tile
  c.k = 200;            // K not a multiple of 64
  c.bias = true, c.scale = true;
  return c;
}

std::vector<Case> all_cases() {
  using A = g::GemmActivation;
  using O = g::OutputType;
  using P = g::MmaPath;
  std::vector<Case> v;
  for (P path : {P::wgmma, P::mma_sync}) {
    std::string const p = g::to_string(path);
    // Every tile shape.
    for (auto [bm, bn] : {std::pair<int, int>{128, 64},
                          {128, 128},
                          {128, 224},
                          {128, 256},
                          {64, 128},
                          {64, 256},
                          {192, 256}})
      v.push_back(make(p + "_tile" + std::to_string(bm) + "x" + std::to_string(bn),
                       static_cast<std::uint16_t>(bm), static_cast<std::uint16_t>(bn), path));
    // Every epilogue, both output types.
    for (A act : {A::none, A::relu, A::gelu_tanh, A::swiglu})
      for (O out : {O::bf16, O::fp32})
        v.push_back(make(p + "_" + g::to_string(act) + (out == O::bf16 ? "_bf16" : "_fp32"), 128,
                         128, path, act, out));
    // Every epilogue on the tall tile (two blocks a warpgroup, finished one after the other).
    for (A act : {A::none, A::relu, A::gelu_tanh, A::swiglu})
      for (O out : {O::bf16, O::fp32})
        v.push_back(make(
            p + "_" + g::to_string(act) + (out == O::bf16 ? "_bf16" : "_fp32") + "_tile192x256",
            192, 256, path, act, out));
    // SwiGLU on the N split and the widest tile.
    v.push_back(make(p + "_swiglu_tile64x256", 64, 256, path, A::swiglu));
    v.push_back(make(p + "_swiglu_tile128x256", 128, 256, path, A::swiglu, O::fp32));
    v.push_back(make(p + "_swiglu_tile128x224", 128, 224, path, A::swiglu));
    // The 224-column tile split in two (28 accumulator vectors a thread, added 4 at a time) and
    // in three (a vector at a time), with K not a multiple of 64.
    {
      Case c = make(p + "_splitk2_gelu_tile128x224", 128, 224, path, A::gelu_tanh, O::fp32);
      c.k = 7 * 64 + 40, c.splits = 2;
      v.push_back(c);
      Case d = make(p + "_splitk3_tile128x224", 128, 224, path);
      d.k = 9 * 64 + 8, d.splits = 3;
      v.push_back(d);
    }
    // Split-K, with K not a multiple of 64 and a short last split.
    {
      Case c = make(p + "_splitk3_gelu", 128, 64, path, A::gelu_tanh);
      c.k = 9 * 64 + 24, c.splits = 3;
      v.push_back(c);
      Case d = make(p + "_splitk4_swiglu_tile64x128", 64, 128, path, A::swiglu, O::fp32);
      d.k = 1024, d.splits = 4;
      v.push_back(d);
    }
    // No bias, no scale; K smaller than one block.
    {
      Case c = make(p + "_plain_k8", 128, 128, path);
      c.k = 8, c.bias = false, c.scale = false;
      v.push_back(c);
    }
  }
  // Shallow pipelines (wgmma): the stage ring wraps many times.
  {
    Case c = make("wgmma_two_stages", 128, 256, P::wgmma, A::relu);
    c.stages = 2, c.k = 1024;
    v.push_back(c);
    Case d = make("wgmma_three_stages_tile64x256", 64, 256, P::wgmma);
    d.stages = 3, d.k = 640;
    v.push_back(d);
    // Each stage released right after its own MMAs (no group kept in flight).
    Case e = make("wgmma_no_overlap_gelu", 128, 128, P::wgmma, A::gelu_tanh);
    e.overlap = 0, e.k = 1000;
    v.push_back(e);
    Case f = make("wgmma_no_overlap_splitk_tile128x256", 128, 256, P::wgmma);
    f.overlap = 0, f.k = 1024, f.splits = 2;
    v.push_back(f);
    // More than two splits of the widest tile: the last split's run-time loops over the other
    // four partials, one vector of its 128 accumulators at a time (K blocks 4, 4, 4, 4 and 2).
    Case g = make("wgmma_splitk5_tile128x256", 128, 256, P::wgmma, A::relu);
    g.k = 17 * 64 + 40, g.splits = 5;
    v.push_back(g);
    // Split-K in the run task type (as whole GEMMs use it), where a staged tile ends with the
    // stage of its last K block: one K block per split stages it at stage 3 of 6, five K blocks at
    // stage 2.
    for (std::uint32_t per : {1u, 5u}) {
      Case h = make("wgmma_run_type_splitk3_kblocks" + std::to_string(per) + "_tile128x128", 128,
                    128, P::wgmma, A::gelu_tanh);
      h.k = 3 * per * 64 - 8, h.splits = 3, h.run_type = true;
      v.push_back(h);
    }
    // Tiles strung into chains (each task's event gates the next of its chain), split-K included.
    Case chained = make("wgmma_chained_splitk_swiglu", 128, 64, P::wgmma, A::swiglu);
    chained.k = 640, chained.splits = 2, chained.chains = 5;
    v.push_back(chained);
    Case chained_sync = make("mma_sync_chained_tile64x128", 64, 128, P::mma_sync, A::relu, O::fp32);
    chained_sync.chains = 3;
    v.push_back(chained_sync);
  }
  // Runs of N-tiles per task (the last one partial): the staged tile takes one stage (SwiGLU
  // bf16), several (fp32), or all of them (two stages), and the next tile's loads fill the rest
  // meanwhile; one K block per tile makes the producer wait for every delivery.
  for (P path : {P::wgmma, P::mma_sync}) {
    std::string const p = std::string(g::to_string(path)) + "_run";
    for (auto [bm, bn] :
         {std::pair<int, int>{128, 64}, {128, 128}, {128, 224}, {128, 256}, {64, 128}, {64, 256}}) {
      Case c = make(p + "3_tile" + std::to_string(bm) + "x" + std::to_string(bn),
                    static_cast<std::uint16_t>(bm), static_cast<std::uint16_t>(bn), path);
      c.run = 3;
      v.push_back(c);
    }
    Case swiglu = make(p + "2_swiglu_tile128x256", 128, 256, path, A::swiglu);
    swiglu.n = 6 * 256, swiglu.k = 1000, swiglu.run = 2;
    v.push_back(swiglu);
    Case fp32 = make(p + "4_fp32_gelu_tile128x256", 128, 256, path, A::gelu_tanh, O::fp32);
    fp32.n = 5 * 256, fp32.k = 512, fp32.run = 4;
    v.push_back(fp32);
    Case down = make(p + "4_fp32_tile64x256", 64, 256, path, A::none, O::fp32);
    down.n = 8 * 256, down.k = 768, down.run = 4;
    v.push_back(down);
    Case one_block = make(p + "5_k64_relu_tile128x128", 128, 128, path, A::relu);
    one_block.n = 9 * 128, one_block.k = 64, one_block.run = 5;
    v.push_back(one_block);
  }
  {
    Case c = make("wgmma_run3_two_stages_tile128x256", 128, 256, P::wgmma, A::relu);
    c.stages = 2, c.k = 1024, c.n = 7 * 256, c.run = 3;
    v.push_back(c);
    Case d = make("wgmma_run2_chained_swiglu_tile64x256", 64, 256, P::wgmma, A::swiglu);
    d.n = 4 * 256, d.k = 448, d.run = 2, d.chains = 4;
    v.push_back(d);
  }
  return v;
}

class GpuGemm : public ::testing::TestWithParam<Case> {};

TEST_P(GpuGemm, MatchesFloat64Reference) {
  LOOM_REQUIRE_GPU();
  run_case(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuGemm, ::testing::ValuesIn(all_cases()),
                         [](auto const& info) { return info.param.name; });

// One expert per valid-row count 1..block_m: every partial tile height in one launch.
TEST(GpuGemmRows, EveryValidRowCountOfATile) {
  LOOM_REQUIRE_GPU();
  for (g::MmaPath path : {g::MmaPath::wgmma, g::MmaPath::mma_sync}) {
    for (std::uint16_t bm : {std::uint16_t{128}, std::uint16_t{64}, std::uint16_t{192}}) {
      Case c;
      c.name = std::string("rows_1_to_") + std::to_string(bm) + "_" + g::to_string(path);
      c.block_m = bm, c.block_n = bm == 128 ? 64 : bm == 64 ? 128 : 256, c.path = path;
      c.experts = bm;
      for (std::uint32_t r = 1; r <= bm; ++r) c.rows.push_back(r);
      c.n = 128, c.k = 136;
      c.act = g::GemmActivation::swiglu, c.bias = true, c.scale = true;
      run_case(c, 1);
    }
  }
}

// The 128x256 tile's consumers borrow the producer warpgroup's registers (setmaxnreg). With one
// K block the producer is done at once and its idle warps ask for their registers back right
// away: the return must wait for the consumers, or a warp of them waits for ever (a hang no
// watchdog can report). Thousands of such tiles over several launches.
TEST(GpuGemmRegisterSplit, ShortWideTilesGiveBorrowedRegistersBack) {
  LOOM_REQUIRE_GPU();
  Case c;
  c.name = "register_split_128x256_k64";
  c.block_m = 128, c.block_n = 256;
  c.experts = 16;
  c.rows.assign(c.experts, 4 * 128);
  c.n = 1024, c.k = 64;
  run_case(c, 20);
  c.name = "register_split_128x256_k64_run4";
  c.run = 4;
  run_case(c, 20);
  c.name = "register_split_192x256_k64";  // the tall tile's split (232 / 40)
  c.block_m = 192, c.run = 1;
  c.rows.assign(c.experts, 3 * 192);
  run_case(c, 20);
}

// A run task stores whole bf16 tiles with TMA; a task released by its completion reads them
// (here by TMA, as the next GEMM's A) in the same launch. H = X · W1ᵀ, then Y = H · W2ᵀ with
// every Y tile after every H tile; H is poisoned before each launch, so a store not yet visible
// when the second GEMM loads shows up in Y. The last M tile is partial (staged path).
TEST(GpuGemmRuns, TilesStoredByTmaAreSeenByTheNextGemm) {
  LOOM_REQUIRE_GPU();
  loom::test::TracedSeed const seed;
  std::mt19937 rng(seed);
  std::uint32_t const m = 3 * 128 + 40, k = 512, hidden = 4 * 256, n = 3 * 256;
  auto const x = random_bf16(std::size_t{m} * k, rng, 1.0f);
  auto const w1 = random_bf16(std::size_t{hidden} * k, rng, 1.0f / std::sqrt(float(k)));
  auto const w2 = random_bf16(std::size_t{n} * hidden, rng, 1.0f / std::sqrt(float(hidden)));
  loom::DeviceBuffer<g::Bf16> dx(x), dw1(w1), dw2(w2);
  loom::DeviceBuffer<g::Bf16> dh(std::size_t{m} * hidden), dy(std::size_t{m} * n);
  g::GemmConfig cfg;
  cfg.block_m = 128, cfg.block_n = 256, cfg.stages = static_cast<std::uint8_t>(cfg.max_stages());
  g::GemmDesc first;
  first.a = dx.get(), first.a_rows = m, first.b = dw1.get(), first.n = hidden, first.k = k;
  first.c = dh.get(), first.activation = g::GemmActivation::relu;
  g::GemmDesc second;
  second.a = dh.get(), second.a_rows = m, second.b = dw2.get(), second.n = n, second.k = hidden;
  second.c = dy.get();
  g::DeviceGemm up(first, cfg), down(second, cfg);

  loom::GraphBuilder builder;
  std::uint32_t slot = 0;
  std::uint32_t const up_tasks = ((m + 127) / 128) * 2;  // runs of 2 of the 4 N tiles
  loom::EventId const h_done = builder.add_event(up_tasks);
  std::uint32_t const added = g::add_gemm_tiles<GemmRunPipeline, GemmRunTile>(
      builder, up, {0, 0, 0, m}, slot, h_done, {}, g::kRasterGroupM, 0, 2);
  EXPECT_EQ(added, up_tasks);
  g::add_gemm_tiles<GemmRunPipeline, GemmRunTile>(builder, down, {0, 0, 0, m}, slot, loom::kNoEvent,
                                                  {h_done}, g::kRasterGroupM, 0, 3);
  loom::GpuExecutor<GemmRunPipeline> ex(builder.build());

  for (int launch = 0; launch < 2; ++launch) {
    dh.fill_bytes(0xFF);  // NaN
    dy.fill_bytes(0xFF);
    ex.run();
    auto const h = dh.download();
    auto const y = dy.download();
    double num_h = 0, den_h = 0, num_y = 0, den_y = 0;
    std::size_t nan = 0;
    for (std::uint32_t r = 0; r < m; ++r) {
      for (std::uint32_t j = 0; j < hidden; ++j) {
        double s = 0;
        for (std::uint32_t kk = 0; kk < k; ++kk)
          s += double(g::to_float(x[std::size_t{r} * k + kk])) *
               double(g::to_float(w1[std::size_t{j} * k + kk]));
        double const want = std::max(s, 0.0), got = g::to_float(h[std::size_t{r} * hidden + j]);
        nan += std::isnan(got);
        num_h += (got - want) * (got - want), den_h += want * want;
      }
      // Y from the H the device wrote: this checks the second GEMM on its own inputs.
      for (std::uint32_t j = 0; j < n; ++j) {
        double s = 0;
        for (std::uint32_t kk = 0; kk < hidden; ++kk)
          s += double(g::to_float(h[std::size_t{r} * hidden + kk])) *
               double(g::to_float(w2[std::size_t{j} * hidden + kk]));
        double const got = g::to_float(y[std::size_t{r} * n + j]);
        nan += std::isnan(got);
        num_y += (got - s) * (got - s), den_y += s * s;
      }
    }
    EXPECT_EQ(nan, 0u) << "launch " << launch;
    EXPECT_LT(std::sqrt(num_h / den_h), 1e-2) << "launch " << launch << ": H";
    EXPECT_LT(std::sqrt(num_y / den_y), 1e-2) << "launch " << launch << ": Y";
  }
}

// The host heuristic's choices (split-K and narrow tiles for small M) compute the same function.
TEST(GpuGemmHeuristic, ChosenConfigurationsAreCorrect) {
  LOOM_REQUIRE_GPU();
  for (auto [m, n, k] : {std::tuple{96u, 512u, 2048u}, std::tuple{300u, 1024u, 512u},
                         std::tuple{1000u, 768u, 256u}}) {
    g::GemmShape s;
    s.m = m, s.n = n, s.k = k;
    g::GemmConfig const cfg = g::choose_gemm_config(s);
    Case c;
    c.name = "heuristic_" + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) +
             "_tile" + std::to_string(cfg.block_m) + "x" + std::to_string(cfg.block_n) + "_split" +
             std::to_string(cfg.splits);
    c.block_m = cfg.block_m, c.block_n = cfg.block_n, c.splits = cfg.splits, c.stages = cfg.stages;
    c.experts = 1, c.rows = {m}, c.n = n, c.k = k;
    c.act = g::GemmActivation::gelu_tanh, c.bias = true;
    run_case(c);
  }
}

// The device-side payload check (dynamic tasks skip the host's validation): a tile naming an
// expert B does not hold fails the launch with a message naming the task type.
TEST(GpuGemmErrors, BadTileIsReportedAsATaskFailure) {
  LOOM_REQUIRE_GPU();
  std::vector<g::Bf16> a(64 * 64, g::to_bf16(1.0f)), b(64 * 64, g::to_bf16(1.0f));
  loom::DeviceBuffer<g::Bf16> da(a), db(b);
  loom::DeviceBuffer<g::Bf16> dc(64 * 64);
  g::GemmDesc desc;
  desc.a = da.get(), desc.a_rows = 64, desc.b = db.get(), desc.n = 64, desc.k = 64;
  desc.c = dc.get();
  g::GemmConfig cfg;
  cfg.block_m = 128, cfg.block_n = 64, cfg.stages = 2;
  g::DeviceGemm gemm(desc, cfg);
  loom::tasks::GemmTileCoord t;
  t.rows = 64;
  auto p = GemmTile::payload(gemm.host_view(), gemm.device(), t);
  p.expert = 7;  // past the one expert B holds
  loom::GraphBuilder builder;
  builder.add_task(GemmPipeline::make<GemmTile>(p));
  loom::GpuExecutor<GemmPipeline> ex(builder.build());
  try {
    ex.run();
    ADD_FAILURE() << "expected the bad tile to fail the launch";
  } catch (loom::Error const& e) {
    EXPECT_NE(std::string(e.what()).find("gemm_tile"), std::string::npos) << e.what();
  }
}

}  // namespace
