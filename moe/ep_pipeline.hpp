// The expert-parallel MoE layer as a Loom pipeline (one per rank): its task types, its shape on
// P ranks, and the static graph every call runs on each rank (a route per token block; after
// them one plan and the send tasks; everything else is emitted at run time by tasks and the
// subscribers).
#pragma once

#include "moe/ep_receive.hpp"
#include "moe/ep_return.hpp"
#include "moe/expert_gemms.hpp"
#include "runtime/graph.hpp"
#include "runtime/pipeline.hpp"

namespace loom::moe {

using EpPipeline =
    Pipeline<RouteTile, RouteBlock, PlanDispatch, SendBlocks, GatherArrivals, ExpertUp,
             ExpertDownRemote, CombineTokens, CombineArrived, CombineGroupTile>;

// Send tasks of a rank (fewer when it has fewer chunks), each claiming kSendClaim chunks at a
// time (moe/ep_view.hpp). 24 x 4 leaves 40 processors more to the gathers and GEMMs than the
// 64 x 1 before it, and the layer was 3% faster at P = 4 (docs/ep.md, "The sends: several
// chunks a claim").
inline constexpr std::uint32_t kSendTasks = 24;

// How the layer is spread: `world` ranks, each with E / world experts and up to
// config.max_tokens tokens of its own per call.
struct EpPlacement {
  std::uint32_t rank = 0;
  std::uint32_t world = 1;
};

// Throws loom::Error unless the experts divide evenly over `world` ranks (1 .. kMaxRanks).
void validate_placement(MoEConfig const& config, std::uint32_t world);

// Expert rows one rank can receive per call: every token of every rank, once per local expert
// it picks (at most min(k, E_local) of them).
std::uint32_t ep_pool_rows(MoEConfig const& config, std::uint32_t world);

// A rank's GEMM tile configurations. `main` is chosen for the whole problem (all ranks' tokens
// over all experts), so every world size computes each row the same way. As on one GPU
// (make_layer_shapes), where those are 128 rows tall, `short_tiles` is the 64-row configuration
// that an expert's last M-tile of at most 64 rows runs on (short_expert_gemms over the whole
// problem; the view's short_rows and short_view); has_short is false where the tiles are short
// already.
struct EpGemms {
  ExpertGemmConfigs main{}, short_tiles{};
  bool has_short = false;
};
EpGemms choose_ep_gemms(MoEConfig const& config, std::uint32_t world,
                        tasks::gemm::MmaPath path = tasks::gemm::MmaPath::wgmma);

// The shape-derived part of a rank's view (no pointers), with the EP pipeline's type ids. Its
// short_rows is set where the configurations have short tiles (the layer points short_view at
// ep_short_view over its operands); short_tokens stays 0: the plan counts every call's M-tiles
// on the main view.
EpView make_ep_shape(MoEConfig const& config, EpPlacement placement, EpGemms const& gemms);

// A rank's short view: its local view `v` over the 64-row operands, without a short view of its
// own.
inline MoEView ep_short_view(MoEView v, tasks::gemm::GemmOperands const* up,
                             tasks::gemm::GemmOperands const* down) {
  v.short_rows = 0;
  v.short_view = nullptr;
  v.up_ops = up;
  v.down_ops = down;
  return v;
}

// Dynamic tasks one call may emit on a rank: a gather per possible chunk, every possible up and
// down tile, and the combines: one per token block without pairs, one per token block's worth of
// each combine group's tokens (at most max_blocks + E_local together).
std::uint32_t ep_dynamic_bound(EpView const& shape);

// The graph of one rank over a view that lives in the executor's memory at `view`.
Graph build_ep_graph(EpView const& shape, EpView const* view);

}  // namespace loom::moe
