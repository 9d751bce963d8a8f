#include "moe/ep_pipeline.hpp"

#include <algorithm>

#include "moe/pipeline.hpp"

namespace loom::moe {

void validate_placement(MoEConfig const& c, std::uint32_t world) {
  validate(c);
  if (world == 0 || world > static_cast<std::uint32_t>(kMaxRanks))
    throw Error("loom: expert parallelism over " + std::to_string(world) +
                " ranks: supported are 1 to " + std::to_string(kMaxRanks));
  if (c.experts % world != 0)
    throw Error("loom: experts=" + std::to_string(c.experts) + " do not divide evenly over " +
                std::to_string(world) + " ranks");
}

std::uint32_t ep_pool_rows(MoEConfig const& c, std::uint32_t world) {
  std::uint32_t const per_token = std::min(c.top_k, c.experts / world);
  std::uint64_t const rows = std::uint64_t{world} * c.max_tokens * per_token;
  if (rows >= (std::uint64_t{1} << 31))
    throw Error("loom: an expert-parallel rank could receive " + std::to_string(rows) +
                " rows per call; lower max_tokens");
  return static_cast<std::uint32_t>(rows);
}

namespace {

// The layer on `world` ranks as one problem: every rank's tokens over all experts.
MoEConfig whole_problem(MoEConfig const& c, std::uint32_t world) {
  MoEConfig whole = c;
  whole.max_tokens = c.max_tokens * world;
  return whole;
}

}  // namespace

EpGemms choose_ep_gemms(MoEConfig const& c, std::uint32_t world, tasks::gemm::MmaPath path) {
  MoEConfig const whole = whole_problem(c, world);
  EpGemms g;
  g.main = choose_expert_gemms(whole, path);
  g.has_short = short_expert_gemms(whole, path, g.short_tiles);
  // Single up tiles at every height: the expert-parallel layer was measured with them, and its
  // pipeline has no run type (ExpertUpRun).
  g.main.up_run = g.short_tiles.up_run = 1;
  return g;
}

EpView make_ep_shape(MoEConfig const& c, EpPlacement placement, EpGemms const& gemms) {
  validate_placement(c, placement.world);
  if (placement.rank >= placement.world)
    throw Error("loom: rank " + std::to_string(placement.rank) + " outside a world of " +
                std::to_string(placement.world));
  EpView ep{};
  ep.local = make_view_shape(c, gemms.main, /*spread_routes=*/false);
  ep.rank = placement.rank;
  ep.world = placement.world;
  ep.local_experts = c.experts / placement.world;
  ep.pool_rows = ep_pool_rows(c, placement.world);
  ep.local.max_mtiles = ep.pool_rows / ep.local.tile_rows + ep.local_experts;
  if (gemms.has_short) ep.local.short_rows = gemms.short_tiles.up.block_m;
  ep.local.mtile_group = kMTileGroup;
  ep.local.up_type = EpPipeline::id<ExpertUp>;
  ep.local.down_type = EpPipeline::id<ExpertDownRemote>;
  ep.local.combine_type = EpPipeline::id<CombineTokens>;
  ep.gather_type = EpPipeline::id<GatherArrivals>;
  ep.combine_batch_type = EpPipeline::id<CombineArrived>;
  ep.combine_tile_type = EpPipeline::id<CombineGroupTile>;
  // A few processors send (kSendTasks, each claiming kSendClaim chunks at a time): over the
  // links they keep them busy while the rest gather and multiply what has landed, and one rank
  // copies its rows within its own memory as fast. Never more tasks than chunks can be: per
  // destination, its bins' rows in token blocks.
  std::uint32_t const chunks = placement.world * (ep.local.max_blocks + ep.local_experts - 1);
  ep.send_tasks = std::min(chunks, kSendTasks);
  return ep;
}

std::uint32_t ep_dynamic_bound(EpView const& ep) {
  MoEView const& v = ep.local;
  return ep.world * ep.chunk_capacity() + v.max_mtiles * (v.up_tasks + v.down_tiles) +
         v.max_blocks + ep.local_experts;
}

Graph build_ep_graph(EpView const& shape, EpView const* view) {
  GraphBuilder b;
  // Each route arrives itself once its counts are in.
  EventOptions explicit_arrivals;
  explicit_arrivals.dynamic_arrivals = true;
  EventId const routed = b.add_event(shape.local.max_routes, explicit_arrivals);
  if (routed != shape.routed_event)
    throw Error("loom: the EP graph's routed event is #" + std::to_string(routed) +
                ", the view names #" + std::to_string(shape.routed_event));
  // The route tile reads the rank's view as a layer's: its first member, local.
  auto const* local = reinterpret_cast<MoEView const*>(view);
  for (std::uint32_t group = 0; group < shape.local.max_routes; ++group)
    add_route_task(b, EpPipeline::make<RouteBlock>(EpBlockPayload{view, group}, kNoEvent, group),
                   shape.local.tile_router, [&](EventId done) {
                     return EpPipeline::make<RouteTile>(BlockPayload{local, group}, done, group);
                   });
  // The plan first: its counts message goes ahead of the rows.
  b.add_task(EpPipeline::make<PlanDispatch>(PlanDispatch::Payload{view}), {routed});
  for (std::uint32_t s = 0; s < shape.send_tasks; ++s)
    b.add_task(EpPipeline::make<SendBlocks>(SendPayload{view}, kNoEvent, s), {routed});
  b.set_dynamic_bound(ep_dynamic_bound(shape));
  return b.build();
}

}  // namespace loom::moe
