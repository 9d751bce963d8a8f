// GemmTile: one output tile of a batched bf16 GEMM with a fused epilogue,
//
//   C[c_row0 + r][cols of tile] = epilogue(A[a_row0 + r][:] · B[expert][rows of tile][:]ᵀ)
//
// for r < rows (1..block_m): rows past `rows` are never read as data (TMA reads may cover them,
// their results are dropped) and never written. A task of GemmTileTask<Sink, true> (GemmRunTile)
// may compute a run of `count` consecutive N-tiles over the same rows: on the wgmma path the next
// tile's loads then overlap the current tile's epilogue and delivery
// (tasks/gemm/device/mainloop_wgmma.cuh), and with LocalTileSink whole bf16 tiles leave by TMA
// stores that complete while the next tile computes (store_tile_boxes, device/epilogue.cuh).
// Single-tile task types (kRuns = false) compile none of that: their tile costs less where runs do
// not pay (docs/gemm.md). The operands, the tile configuration and the epilogue (bf16/fp32 output,
// bias, row scale, none/relu/gelu/swiglu) are shared by all tiles of one GEMM in a device-memory
// GemmOperands (tasks/gemm/operands.hpp) that the payload points to. Build operands with
// tasks/gemm/device_gemm.hpp (GPU) or make_operands (CPU executor).
//
// Device: 384 threads. On the wgmma path warps 0..7 are two consumer warpgroups (wgmma
// m64nWNk16, accumulators in registers) and lane 0 of warp 8 (warpgroup 2) is the TMA producer
// feeding a multi-stage mbarrier pipeline; on the mma.sync path every thread loads and warps 0..7
// compute. The pipeline's block must be exactly 384 threads (checked): with the 128x256 tile the
// consumers take registers from the producer warpgroup (setmaxnreg 208 / 88, back to 168 at the
// end). Both paths finish through the same epilogue into a staged tile that the Sink delivers
// (sink.hpp). The 192x256 tile (GemmConfig::tall), on task types built with kTall, gives each
// consumer warpgroup two blocks (config.hpp) and its consumers 232 registers (setmaxnreg 232 / 40).
// Design, measurements and limits: docs/gemm.md.
// Split-K (config.splits > 1): split s sums K blocks [s·per, (s+1)·per) and stores its raw
// accumulators to the workspace; the last split to finish a tile adds the others' into its
// registers in split order (deterministic) and runs the unsplit epilogue.
//
// Host: the same function in float from the bf16 inputs; the task of the last split computes the
// whole K range and the other splits do nothing.
#pragma once

#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime/context.hpp"
#include "runtime/error.hpp"
#include "tasks/gemm/epilogue_math.hpp"
#include "tasks/gemm/operands.hpp"
#include "tasks/gemm/sink.hpp"

#if defined(__CUDACC__)
#include "tasks/gemm/device/epilogue.cuh"
#include "tasks/gemm/device/mainloop_mma_sync.cuh"
#include "tasks/gemm/device/mainloop_wgmma.cuh"
#endif

namespace loom::tasks {

// Where one tile task sits in its GEMM.
struct GemmTileCoord {
  std::uint32_t expert = 0;
  std::uint32_t a_row0 = 0;  // first row of A (and of row_scale)
  std::uint32_t c_row0 = 0;  // first row of C it writes
  std::uint32_t rows = 0;    // valid rows, 1..block_m
  std::uint32_t n_tile = 0;  // columns [n_tile·block_n, ...) of B
  std::uint32_t count = 1;   // N-tiles n_tile .. n_tile + count - 1 (a run; 1 with split-K)
  std::uint32_t split = 0;   // K split, 0..splits-1
  std::uint32_t slot = 0;    // split-K workspace slot (unique per tile in flight); 0 if no split
  std::uint64_t sink_tag = 0;
  // How its loads of B rank in L2: evict_first when no other tile reads its columns of B.
  gemm::L2Hint b_l2 = gemm::L2Hint::normal;
};

// A task type for GEMMs that never split K (kSplitK = false) compiles none of split-K's epilogue
// and refuses split configurations: in a kernel of many task types, each instruction left out is
// one fewer competing for the instruction cache.
//
// A wide task type (kWide) computes 128x224 tiles and only those (gemm::GemmConfig::wide): N =
// 7168 = 32 x 224, an M-tile's 32 N-tiles where 256 columns give 28 and leave a seventh of 131
// processors idle. It is a type of its own, so its kernel is one of its own: compiled beside the
// other widths, the 224-column code took the kernel's local accesses from 179-187 to 282, and
// 128x128 tiles split in two ran 1-5% slower (docs/gemm.md, "A 224-column tile").
// A task type built with kTall also takes the 192x256 tile (gemm::GemmConfig::tall), single
// tiles without split-K: its K loop and epilogue are compiled only into such types' kernels
// (GemmTallTile).
template <class Sink = gemm::LocalTileSink, bool kRuns = false, bool kSplitK = true,
          bool kWide = false, bool kTall = false>
struct GemmTileTask {
  static_assert(!kTall || (!kRuns && !kWide), "the tall tile runs on single-tile, narrow types");
  static constexpr char const* name = "gemm_tile";
  static constexpr unsigned threads = gemm::kThreads;
  // A run task that stores into C (LocalTileSink) stores whole bf16 tiles with TMA from buffers
  // after the stages (gemm::kRunAreaBytes): the consumers go on with the next tile while the
  // stores complete, and the stages keep the next tile's K blocks. Other sinks deliver a staged
  // tile (sink.hpp).
  static constexpr bool kStoreBoxes = kRuns && std::is_same_v<Sink, gemm::LocalTileSink>;
  // Control words (mbarriers, a broadcast flag), alignment slack to 1024 bytes, then the stages.
  static constexpr unsigned kControlBytes = 256;
  // The stages (and staged tiles, and with kStoreBoxes the store buffers), 1024-byte aligned.
  static constexpr std::uint32_t kAreaBytes =
      kStoreBoxes ? gemm::kRunAreaBytes : gemm::kStageAreaBytes;
  static constexpr unsigned shared_bytes = kControlBytes + 1024 + kAreaBytes;

  struct Payload {
    gemm::GemmOperands const* ops;
    std::uint64_t sink_tag;
    std::uint32_t expert;
    std::uint32_t a_row0;
    std::uint32_t c_row0;
    std::uint32_t n_tile;
    std::uint32_t slot;
    std::uint16_t rows;
    std::uint16_t split;
    std::uint16_t count = 1;  // N-tiles in the run, >= 1
    gemm::L2Hint b_l2 = gemm::L2Hint::normal;
  };
  static_assert(sizeof(Payload) <= 48);

  // Checks `t` against the host copy `op` of the operands that `device_op` points to. Throws
  // loom::Error naming the field.
  static Payload payload(gemm::GemmOperands const& op, gemm::GemmOperands const* device_op,
                         GemmTileCoord const& t) {
    auto const fail = [&](std::string const& what) {
      throw Error("loom: gemm tile (expert " + std::to_string(t.expert) + ", rows " +
                  std::to_string(t.a_row0) + "+" + std::to_string(t.rows) + ", n tile " +
                  std::to_string(t.n_tile) + ", split " + std::to_string(t.split) + "): " + what);
    };
    gemm::GemmConfig const& cfg = op.config;
    if (!device_op) fail("no operands");
    if (t.rows == 0 || t.rows > cfg.block_m) fail("rows must be 1.." + std::to_string(cfg.block_m));
    if (std::uint64_t{t.a_row0} + t.rows > op.a_rows)
      fail("rows run past the " + std::to_string(op.a_rows) + " rows of A");
    if (t.expert >= op.experts) fail("expert out of range (" + std::to_string(op.experts) + ")");
    if (t.n_tile >= op.n_tiles())
      fail("n tile out of range (" + std::to_string(op.n_tiles()) + " tiles of " +
           std::to_string(cfg.block_n) + ")");
    if (t.count == 0 || t.count > 0xFFFFu || std::uint64_t{t.n_tile} + t.count > op.n_tiles())
      fail("a run of " + std::to_string(t.count) + " n tiles must be 1.." +
           std::to_string(op.n_tiles() - t.n_tile));
    if (t.count > 1 && !kRuns) fail("this task type takes one n tile per task (use GemmRunTile)");
    if (t.count > 1 && cfg.splits > 1) fail("a run of n tiles cannot be split along K");
    if (cfg.splits > 1 && !kSplitK) fail("this task type does not split K (kSplitK is false)");
    if (cfg.wide() != kWide)
      fail(kWide ? "a wide task type takes only 128x224 tiles"
                 : "128x224 tiles run on the wide task types (GemmWideTile, GemmWideRunTile)");
    if (cfg.tall() && !kTall)
      fail("192x256 tiles run on the task types built with kTall (GemmTallTile)");
    if (cfg.tall() && cfg.splits > 1) fail("a 192x256 tile cannot be split along K");
    if (t.split >= cfg.splits) fail("split out of range (" + std::to_string(cfg.splits) + ")");
    if (cfg.splits > 1 && t.slot >= op.slots)
      fail("split-K slot " + std::to_string(t.slot) + " but the workspace has " +
           std::to_string(op.slots));
    Payload p{};
    p.ops = device_op;
    p.sink_tag = t.sink_tag;
    p.expert = t.expert;
    p.a_row0 = t.a_row0;
    p.c_row0 = t.c_row0;
    p.n_tile = t.n_tile;
    p.slot = t.slot;
    p.rows = static_cast<std::uint16_t>(t.rows);
    p.split = static_cast<std::uint16_t>(t.split);
    p.count = static_cast<std::uint16_t>(t.count);
    p.b_l2 = t.b_l2;
    return p;
  }

  // The words of a device-side failure (TaskContext::fail with a GemmFailure code).
  static std::string describe_failure(std::uint32_t code, std::uint64_t a, std::uint64_t b) {
    switch (code) {
      case 1:
        return "tile outside its operands (rows " + std::to_string(a) + ", expert " +
               std::to_string(b >> 32) + ", n tiles " + std::to_string(b & 0xFFFFu) + "+" +
               std::to_string((b >> 16) & 0xFFFFu) + ")";
      case 2:
        return pipeline_barrier_name(a) + " (parity " + std::to_string(b) +
               ") never completed: a TMA load or a consumer stalled";
      case 3:
        return "the wgmma path needs an sm_90a build on a Hopper GPU; choose MmaPath::mma_sync";
      case 4:
        return "block of " + std::to_string(a) + " threads; gemm_tile needs exactly " +
               std::to_string(b) + " (a pipeline type with a larger block?)";
      case 5:
        return "a 192x256 tile's shared memory starts at shared address " + std::to_string(a) +
               ", not at the block's dynamic shared memory (" + std::to_string(b) +
               "): it runs only where the task's shared memory is the block's";
      default:
        return "unknown gemm failure " + std::to_string(code);
    }
  }

  // Payload checks shared by host and device (the host builder checked them too).
  LOOM_HD static bool bad_payload(Payload const& p, gemm::GemmOperands const& op) {
    gemm::GemmConfig const& cfg = op.config;
    return p.rows == 0 || p.rows > cfg.block_m || p.expert >= op.experts || p.count == 0 ||
           p.n_tile + p.count > op.n_tiles() || p.split >= cfg.splits ||
           (p.count > 1 && (cfg.splits > 1 || !kRuns)) || (cfg.splits > 1 && !kSplitK) ||
           cfg.wide() != kWide || (cfg.tall() && (!kTall || cfg.splits > 1)) ||
           std::uint64_t{p.a_row0} + p.rows > op.a_rows;
  }
  LOOM_HD static std::uint64_t bad_payload_word(Payload const& p) {
    return std::uint64_t{p.expert} << 32 | std::uint64_t{p.count} << 16 | (p.n_tile & 0xFFFFu);
  }

  static void host(Payload const& p, TaskContext& ctx) {
    if (bad_payload(p, *p.ops)) {
      ctx.fail(1, p.rows, bad_payload_word(p));
      return;
    }
    if (p.split + 1u != p.ops->config.splits) return;
    for (std::uint32_t t = 0; t < p.count; ++t) host_tile(p, p.n_tile + t, ctx);
  }

 private:
  static std::string pipeline_barrier_name(std::uint64_t which) {
    using gemm::kMaxStages;
    if (which == gemm::kDrainedBarrier) return "the staged-tile barrier";
    return std::string(which < kMaxStages ? "full" : "empty") + " barrier of stage " +
           std::to_string(which % kMaxStages);
  }

  static void host_tile(Payload const& p, std::uint32_t n_tile, TaskContext& ctx) {
    using namespace gemm;
    GemmOperands const& op = *p.ops;
    GemmConfig const& cfg = op.config;
    std::uint32_t const n0 = n_tile * cfg.block_n;
    std::uint32_t const b_cols = std::min<std::uint32_t>(cfg.block_n, op.n - n0);
    std::uint32_t const rows = p.rows;
    std::vector<float> acc(std::size_t{rows} * b_cols, 0.0f);
    std::vector<float> a_row(op.k);
    for (std::uint32_t r = 0; r < rows; ++r) {
      Bf16 const* a = op.a + std::size_t{p.a_row0 + r} * op.lda;
      for (std::uint32_t kk = 0; kk < op.k; ++kk) a_row[kk] = to_float(a[kk]);
      for (std::uint32_t j = 0; j < b_cols; ++j) {
        Bf16 const* b = op.b + (std::size_t{p.expert} * op.n + n0 + j) * op.k;
        float sum = 0.0f;
        for (std::uint32_t kk = 0; kk < op.k; ++kk) sum += a_row[kk] * to_float(b[kk]);
        acc[std::size_t{r} * b_cols + j] = sum;
      }
    }
    bool const swiglu = op.activation == GemmActivation::swiglu;
    std::uint32_t const out_cols = swiglu ? b_cols / 2 : b_cols;
    std::uint32_t const eb = op.out_bytes();
    std::vector<unsigned char> staged(std::size_t{rows} * out_cols * eb);
    float const* bias = op.bias ? op.bias + std::size_t{p.expert} * op.n + n0 : nullptr;
    for (std::uint32_t r = 0; r < rows; ++r) {
      float const scale = op.row_scale ? op.row_scale[p.a_row0 + r] : 1.0f;
      float const* acc_row = acc.data() + std::size_t{r} * b_cols;
      for (std::uint32_t o = 0; o < out_cols; ++o) {
        float v;
        if (swiglu) {
          std::uint32_t const gc = swiglu_gate_column(o), uc = swiglu_up_column(o);
          v = gemm::swiglu(acc_row[gc] + (bias ? bias[gc] : 0.0f),
                           acc_row[uc] + (bias ? bias[uc] : 0.0f));
        } else {
          v = activate(op.activation, acc_row[o] + (bias ? bias[o] : 0.0f));
        }
        v *= scale;
        unsigned char* dst = staged.data() + (std::size_t{r} * out_cols + o) * eb;
        if (op.output == OutputType::bf16) {
          Bf16 const h = to_bf16(v);
          std::memcpy(dst, &h, 2);
        } else {
          std::memcpy(dst, &v, 4);
        }
      }
    }
    StagedTile const tile{
        staged.data(), out_cols * eb, rows, out_cols, eb, p.c_row0, n_tile * op.out_tile_cols(),
        p.sink_tag};
    Sink::deliver_host(tile, op, ctx);
  }

 public:
#if defined(__CUDACC__)
  // Called by every thread of the processor block (blockDim.x >= threads; threads past `threads`
  // join the block barriers only). Uses shared_bytes of ctx.shared_memory(). Always inlined, as
  // are run and run_tall: a body left as a call holds wgmma of its own, and ptxas then serializes
  // every wgmma of the kernel (C7510; scripts/sass_check.py fails such a build).
  __device__ LOOM_INLINE static void device(Payload const& p, TaskContext& ctx) {
    using namespace gemm;
    GemmOperands const& op = *p.ops;
    GemmConfig const cfg = op.config;
    if (bad_payload(p, op)) {
      if (threadIdx.x == 0)
        ctx.fail(static_cast<std::uint32_t>(impl::GemmFailure::bad_tile), p.rows,
                 bad_payload_word(p));
      return;
    }
    if (blockDim.x != threads) {  // the register split below assumes exactly this block
      if (threadIdx.x == 0)
        ctx.fail(static_cast<std::uint32_t>(impl::GemmFailure::block_size), blockDim.x, threads);
      return;
    }
#if !LOOM_HAS_WGMMA
    if (cfg.path == MmaPath::wgmma) {
      if (threadIdx.x == 0) ctx.fail(static_cast<std::uint32_t>(impl::GemmFailure::no_wgmma), 0, 0);
      return;
    }
#endif
    impl::TileJob job;
    job.expert = p.expert;
    job.a_row0 = p.a_row0;
    job.c_row0 = p.c_row0;
    job.rows = p.rows;
    job.n_tile = p.n_tile;
    job.split = p.split;
    job.slot = p.slot;
    job.n0 = p.n_tile * cfg.block_n;
    std::uint32_t const k_blocks = op.k_blocks();
    std::uint32_t const per = split_k_blocks_per(k_blocks, cfg.splits);
    job.k_block_begin = p.split * per;
    job.k_block_count = min(per, k_blocks - job.k_block_begin);
    job.sink_tag = p.sink_tag;
    job.b_l2 = p.b_l2;
    if constexpr (kWide) {
      run<224>(op, job, p.count, ctx);
    } else if (kTall && cfg.tall()) {
      if constexpr (kTall) run_tall(op, job, ctx);
    } else {
      switch (cfg.warp_n()) {
        case 64:
          run<64>(op, job, p.count, ctx);
          break;
        case 128:
          run<128>(op, job, p.count, ctx);
          break;
        default:
          run<256>(op, job, p.count, ctx);
          break;
      }
    }
    // This thread's shared-memory writes and reads come before the next task's TMA writes.
    ptx::fence_proxy_async_shared();
  }

 private:
  // The tiles of a run, n_tile .. n_tile + tiles - 1 of `job`.
  template <int WN>
  __device__ LOOM_INLINE static void run(gemm::GemmOperands const& op,
                                         gemm::impl::TileJob const& job, std::uint32_t tiles,
                                         TaskContext& ctx) {
    using namespace gemm;
    GemmConfig const cfg = op.config;
    impl::PipelineSmem const sm = pipeline_smem(ctx);
    auto* const flag = reinterpret_cast<std::uint32_t*>(sm.drained + 1);
    unsigned const thread = threadIdx.x, warp = thread / 32u;
    impl::WarpTile const wt = impl::warp_tile(cfg, warp);
    // In the M split a warpgroup whose 64 rows are all invalid skips its MMAs.
    bool const active = cfg.split_n() || job.rows > 64u * (warp / 4u);
    bool const wgmma = cfg.path == MmaPath::wgmma;
    // The 128x224 and 128x256 tiles' 112 and 128 accumulators a thread need more than the 168
    // registers of entry: their consumers borrow the producer warpgroup's (setmaxnreg), and both
    // give them back at the end.
    constexpr bool kReconfigure = WN >= 224;

    // Where tile t of a run stages its finished rows: stages plan.first(t) on. A single-tile task
    // stages at the start of the stage area.
    impl::StagingPlan const plan = impl::StagingPlan::make(
        cfg, job.k_block_count, cfg.block_m * impl::finished_row_stride(op));

    if (wgmma && thread == 0) init_barriers(cfg, sm);
    __syncthreads();
    if (thread >= kConsumerThreads) {  // producer warpgroup
      if constexpr (kReconfigure) ptx::setmaxnreg_dec<kProducerRegs>();
      if (wgmma) {
        if (thread == kConsumerThreads)
          impl::produce_tiles(op, job, kRuns ? tiles : 1u, plan, sm, ctx);
        __syncwarp();
      } else if constexpr (kRuns) {
        float unused[WN / 2];
        for (std::uint32_t t = 0; t < tiles; ++t) {
          impl::mma_sync_mainloop<WN, false>(unused, op, next_tile(job, cfg, t), sm.stages, wt,
                                             false);
          __syncthreads();  // the consumers have delivered tile t
        }
      } else {
        float unused[WN / 2];
        impl::mma_sync_mainloop<WN, false>(unused, op, job, sm.stages, wt, false);
      }
      // Not before the consumers have given the borrowed registers back: asked for earlier, the
      // pool could hand them to this warpgroup again (its three idle warps get here at once) and
      // leave consumer warps waiting for ever, the others stuck in a warpgroup-wide wgmma.
      if constexpr (kReconfigure) {
        ptx::named_barrier_sync(impl::kRegisterBarrier, kThreads);
        ptx::setmaxnreg_inc<kEntryRegs>();
      }
    } else {  // consumer warpgroups
      if constexpr (kReconfigure) ptx::setmaxnreg_inc<kConsumerRegs>();
      float acc[WN / 2];
      std::uint32_t stage = 0, phase = 0;
      // Whole tiles by TMA (kStoreBoxes): every tile of a run has the same rows.
      bool const boxes = kStoreBoxes && wgmma && store_boxes<WN>(op, job);
      std::uint32_t boxes_stored = 0;
      std::uint32_t const buffers = ptx::smem_address(sm.stages) + cfg.stages * cfg.stage_bytes() +
                                    (thread / 128u) * 2u * gemm::kStoreBoxBytes;
      if constexpr (!kRuns) {
        if (wgmma)
          impl::consume_tiles<WN>(acc, op, job, sm, ctx, warp, active, stage, phase);
        else
          impl::mma_sync_mainloop<WN, true>(acc, op, job, sm.stages, wt, active);
        finish<WN>(acc, op, job, sm.stages, wt, flag, ctx);
      }
      for (std::uint32_t t = 0; kRuns && t < tiles; ++t) {
        impl::TileJob const tile = next_tile(job, cfg, t);
        if (wgmma)
          impl::consume_tiles<WN>(acc, op, tile, sm, ctx, warp, active, stage, phase);
        else
          impl::mma_sync_mainloop<WN, true>(acc, op, tile, sm.stages, wt, active);
        if (boxes) {
          // Nothing of this tile goes to the stages: the producer may fill them at once.
          __syncwarp();
          if (thread % 32u == 0) ptx::mbarrier_arrive(sm.drained);
          impl::store_tile_boxes<WN>(acc, op, tile, wt, thread % 32u, thread % 128u, buffers,
                                     boxes_stored);
          continue;
        }
        finish<WN>(acc, op, tile, wgmma ? sm.stages + plan.first(t) * cfg.stage_bytes() : sm.stages,
                   wt, flag, ctx);
        if (wgmma) {
          // This warp's reads of the staged tile come before the producer's TMA writes there.
          ptx::fence_proxy_async_shared();
          __syncwarp();
          if (thread % 32u == 0) ptx::mbarrier_arrive(sm.drained);
        } else {
          __syncthreads();  // the producer warpgroup's next loads overwrite the staged tile
        }
      }
      // The task's stores have written C before it completes, and have read their buffers
      // before another task reuses the shared memory.
      if (boxes && thread % 128u == 0) ptx::bulk_wait_all_written();
      if constexpr (kReconfigure) {
        ptx::setmaxnreg_dec<kEntryRegs>();
        ptx::named_barrier_arrive(impl::kRegisterBarrier, kThreads);
      }
    }
    __syncthreads();
    if (wgmma && thread == 0) inval_barriers(cfg, sm);
  }

  // The control words and the stages in the task's shared memory.
  __device__ static gemm::impl::PipelineSmem pipeline_smem(TaskContext& ctx) {
    auto* const raw = static_cast<unsigned char*>(ctx.shared_memory());
    gemm::impl::PipelineSmem sm;
    sm.full = reinterpret_cast<std::uint64_t*>(raw);
    sm.empty = sm.full + gemm::kMaxStages;
    sm.drained = sm.empty + gemm::kMaxStages;
    sm.stages = reinterpret_cast<unsigned char*>(
        (reinterpret_cast<std::uintptr_t>(raw) + kControlBytes + 1023u) & ~std::uintptr_t{1023});
    return sm;
  }
  // The same placement of the stages after the control words, for a shared address.
  __device__ static std::uint32_t stage_area(std::uint32_t shared_address) {
    return (shared_address + kControlBytes + 1023u) & ~1023u;
  }
  // One thread: the pipeline's barriers (and a run's `drained`) before the first load, and
  // invalidated once the task is done with them.
  __device__ static void init_barriers(gemm::GemmConfig const& cfg,
                                       gemm::impl::PipelineSmem const& sm) {
    for (std::uint32_t s = 0; s < cfg.stages; ++s) {
      gemm::ptx::mbarrier_init(sm.full + s, 1);
      gemm::ptx::mbarrier_init(sm.empty + s, gemm::kConsumerThreads / 32);
    }
    if constexpr (kRuns) gemm::ptx::mbarrier_init(sm.drained, gemm::kConsumerThreads / 32);
    gemm::ptx::fence_mbarrier_init();
  }
  __device__ static void inval_barriers(gemm::GemmConfig const& cfg,
                                        gemm::impl::PipelineSmem const& sm) {
    for (std::uint32_t s = 0; s < cfg.stages; ++s) {
      gemm::ptx::mbarrier_inval(sm.full + s);
      gemm::ptx::mbarrier_inval(sm.empty + s);
    }
    if constexpr (kRuns) gemm::ptx::mbarrier_inval(sm.drained);
  }

  // One 192x256 tile (GemmConfig::tall): each consumer warp holds its head fragment (16 x 256)
  // and its tail fragment (16 x 128), 192 accumulators a thread, with the registers the producer
  // warpgroup gives up (setmaxnreg kTallConsumerRegs / kTallProducerRegs, back to kEntryRegs at
  // the end, as run's 128x256 tile does).
  __device__ LOOM_INLINE static void run_tall(gemm::GemmOperands const& op,
                                              gemm::impl::TileJob const& job, TaskContext& ctx) {
    using namespace gemm;
    GemmConfig const cfg = op.config;
    impl::PipelineSmem const sm = pipeline_smem(ctx);
    unsigned const thread = threadIdx.x, warp = thread / 32u;
    impl::WarpTile const head_wt = impl::warp_tile(cfg, warp), tail_wt = impl::tail_warp_tile(warp);
    bool const wgmma = cfg.path == MmaPath::wgmma;
    // The stage area's address as ptxas knows it, so that the K loop holds no register for it.
    std::uint32_t const base = stage_area(ptx::dynamic_smem_address());
    if (wgmma && ptx::smem_address(sm.stages) != base) {
      if (thread == 0)
        ctx.fail(static_cast<std::uint32_t>(impl::GemmFailure::shared_memory),
                 ptx::smem_address(ctx.shared_memory()), ptx::dynamic_smem_address());
      return;
    }
    if (wgmma && thread == 0) init_barriers(cfg, sm);
    __syncthreads();
    if (thread >= kConsumerThreads) {  // producer warpgroup
      ptx::setmaxnreg_dec<kTallProducerRegs>();
      if (wgmma) {
        if (thread == kConsumerThreads)
          impl::produce_tiles(op, job, 1u, impl::StagingPlan{cfg.stages, job.k_block_count, 1u}, sm,
                              ctx);
        __syncwarp();
      } else {
        float unused_head[128], unused_tail[impl::kTallTailCols / 2];
        impl::mma_sync_mainloop<256, false>(unused_head, op, job, sm.stages, head_wt, false);
        impl::mma_sync_mainloop<impl::kTallTailCols, false>(unused_tail, op, job, sm.stages,
                                                            tail_wt, false);
      }
      ptx::named_barrier_sync(impl::kRegisterBarrier, kThreads);
      ptx::setmaxnreg_inc<kEntryRegs>();
    } else {  // consumer warpgroups
      ptx::setmaxnreg_inc<kTallConsumerRegs>();
      float head[128], tail[impl::kTallTailCols / 2];
      if (wgmma) {
        impl::consume_tall_tile(head, tail, op, job, sm, base, ctx, warp);
      } else {  // two passes over K, one a block: the fallback is correct, not fast
        impl::mma_sync_mainloop<256, true>(head, op, job, sm.stages, head_wt, true);
        impl::mma_sync_mainloop<impl::kTallTailCols, true>(tail, op, job, sm.stages, tail_wt, true);
      }
      ptx::named_barrier_sync(impl::kEpilogueBarrier, kConsumerThreads);
      std::uint32_t const staging = ptx::smem_address(sm.stages);
      impl::with_activation(op.activation, [&](auto act) {
        constexpr GemmActivation kAct = decltype(act)::value;
        impl::finish_fragments<impl::kTallTailCols, kAct>(tail, op, job, tail_wt, thread % 32u,
                                                          staging);
        impl::finish_fragments<256, kAct>(head, op, job, head_wt, thread % 32u, staging);
      });
      ptx::named_barrier_sync(impl::kEpilogueBarrier, kConsumerThreads);
      deliver_staged(op, job, sm.stages, ctx);
      ptx::setmaxnreg_dec<kEntryRegs>();
      ptx::named_barrier_arrive(impl::kRegisterBarrier, kThreads);
    }
    __syncthreads();
    if (wgmma && thread == 0) inval_barriers(cfg, sm);
  }

  // Consumer threads, after the finished tile is staged at `staging`: the sink delivers it.
  __device__ static void deliver_staged(gemm::GemmOperands const& op,
                                        gemm::impl::TileJob const& job, unsigned char* staging,
                                        TaskContext& ctx) {
    std::uint32_t const c_col0 = job.n_tile * op.out_tile_cols();
    gemm::StagedTile const tile{staging,        gemm::impl::finished_row_stride(op),
                                job.rows,       min(op.out_tile_cols(), op.n_out - c_col0),
                                op.out_bytes(), job.c_row0,
                                c_col0,         job.sink_tag};
    Sink::deliver(tile, op, ctx, threadIdx.x);
  }

  // Whether a run's tiles go to C by TMA (kStoreBoxes): bf16 C with its map, no split-K, every
  // row of the tile valid and inside C, a warpgroup's output columns whole boxes, and room for the
  // buffers after the stages.
  template <int WN>
  __device__ static bool store_boxes(gemm::GemmOperands const& op, gemm::impl::TileJob const& job) {
    gemm::GemmConfig const& cfg = op.config;
    return op.c_map_ready && cfg.splits == 1 && job.rows == cfg.block_m &&
           std::uint64_t{job.c_row0} + cfg.block_m <= op.c_rows &&
           gemm::impl::store_boxes_fit<WN>(op.activation) &&
           cfg.stages * cfg.stage_bytes() + gemm::kStoreBufferBytes <= gemm::kRunAreaBytes;
  }

  // Tile t of the run that starts at `job`.
  __device__ static gemm::impl::TileJob next_tile(gemm::impl::TileJob job,
                                                  gemm::GemmConfig const& cfg, std::uint32_t t) {
    job.n_tile += t;
    job.n0 += t * cfg.block_n;
    return job;
  }

  // Consumer threads: the finished tile into the staging tile (reusing the stage area once both
  // warpgroups are done with it; with split-K, in the last split, after the partials are summed
  // in registers), then the sink.
  template <int WN>
  __device__ static void finish(float (&acc)[WN / 2], gemm::GemmOperands const& op,
                                gemm::impl::TileJob const& job, unsigned char* staging,
                                gemm::impl::WarpTile const& wt, std::uint32_t* flag,
                                TaskContext& ctx) {
    using namespace gemm;
    unsigned const thread = threadIdx.x, lane = thread % 32u;
    if (kSplitK && op.config.splits > 1) {
      if (!impl::publish_partial<WN>(acc, op, job, wt, thread, flag)) return;
      impl::add_partials<WN>(acc, op, job, wt, thread);
    }
    ptx::named_barrier_sync(impl::kEpilogueBarrier, kConsumerThreads);
    impl::finish_fragments<WN>(acc, op, job, wt, lane, ptx::smem_address(staging));
    ptx::named_barrier_sync(impl::kEpilogueBarrier, kConsumerThreads);
    deliver_staged(op, job, staging, ctx);
  }
#endif
};

using GemmTile = GemmTileTask<>;
using GemmRunTile = GemmTileTask<gemm::LocalTileSink, true>;
using GemmWideTile = GemmTileTask<gemm::LocalTileSink, false, true, true>;
using GemmWideRunTile = GemmTileTask<gemm::LocalTileSink, true, true, true>;
using GemmTallTile = GemmTileTask<gemm::LocalTileSink, false, true, false, true>;

}  // namespace loom::tasks
