#include "moe/pipeline.hpp"

#include <algorithm>

namespace loom::moe {

namespace {

// Few route groups each streaming the whole router leave most SMs idle while the router is read
// many times over: then a group is kRouteGroupTokens tokens and its slices are split over up to
// kRouteTasks / groups parts, the last of which sums them and picks the experts.
void spread_route_groups(MoEView& v) {
  std::uint32_t const blocks = std::max(1u, kRouteGroupTokens / v.token_block);
  std::uint32_t const groups = (v.max_blocks + blocks - 1) / blocks;
  std::uint32_t const parts = std::min(v.route_slices, kRouteTasks / groups);
  if (parts < 2 || v.route_slices > kMaxRouteSlices) return;
  std::uint32_t const part_slices = (v.route_slices + parts - 1) / parts;
  std::size_t const staged =
      std::size_t{kRouteGroupTokens} *
          (part_slices * kRouteSliceChunks * 64 + kRouteRowPad + 4 * v.experts) +
      16;
  if (staged > kRouteSharedBytes) return;
  v.route_blocks = blocks;
  v.max_routes = groups;
  v.route_part_slices = part_slices;
  v.route_parts = (v.route_slices + v.route_part_slices - 1) / v.route_part_slices;
}

}  // namespace

MoEView make_view_shape(MoEConfig const& c, ExpertGemmConfigs const& gemms, bool spread_routes) {
  validate(c);
  if (gemms.up.block_m != gemms.down.block_m)
    throw Error("loom: the expert GEMMs must share one M-tile height (up " +
                std::to_string(gemms.up.block_m) + ", down " + std::to_string(gemms.down.block_m) +
                ")");
  MoEView v{};
  v.hidden = c.hidden;
  v.ffn = c.ffn;
  v.experts = c.experts;
  v.top_k = c.top_k;
  v.up_cols = c.up_columns();
  v.up_tiles = (v.up_cols + gemms.up.block_n - 1) / gemms.up.block_n;
  v.up_run = gemms.up_run;
  v.up_tasks = (v.up_tiles + v.up_run - 1) / v.up_run;
  v.up_tasks_bound = v.up_tasks;
  v.down_tiles = (c.hidden + gemms.down.block_n - 1) / gemms.down.block_n;
  v.tile_rows = gemms.up.block_m;
  v.mtile_group = kMTileGroup;
  // A completed group is named by (expert << 16 | first M-tile) on the device.
  if (c.max_tokens / v.tile_rows >= (1u << 16))
    throw Error("loom: MoEConfig: max_tokens=" + std::to_string(c.max_tokens) +
                " gives an expert more than 65535 M-tiles of " + std::to_string(v.tile_rows) +
                " rows");
  v.max_tokens = c.max_tokens;
  v.token_block = token_block_for(c.max_tokens, c.hidden, c.experts);
  v.route_blocks = route_blocks_for(c.max_tokens, v.token_block, c.hidden, c.experts);
  v.tile_router =
      gemms.up.path == tasks::gemm::MmaPath::wgmma && routes_on_tile(c.hidden, c.experts);
  if (!v.tile_router &&
      v.token_block * v.route_blocks * route_bytes_per_token(c.hidden, c.experts) + 16 >
          kRouteSharedBytes)
    throw Error("loom: MoEConfig: hidden=" + std::to_string(c.hidden) +
                " with experts=" + std::to_string(c.experts) + " needs more than " +
                std::to_string(kRouteSharedBytes) + " bytes of router staging per token");
  v.max_blocks = (c.max_tokens + v.token_block - 1) / v.token_block;
  v.max_call_blocks = call_blocks_capacity(v.max_blocks);
  v.max_routes = (v.max_blocks + v.route_blocks - 1) / v.route_blocks;
  v.route_slices = (c.hidden / 32 + kRouteSliceChunks - 1) / kRouteSliceChunks;
  v.route_segments = std::min(RouteTokens::split_of(c.experts, kRouteWarps), v.route_slices);
  v.route_parts = 1;
  v.route_part_slices = v.route_slices;
  if (v.tile_router) {
    v.route_blocks = tile_route_blocks_for(c.max_tokens, v.token_block);
    v.max_routes = (v.max_blocks + v.route_blocks - 1) / v.route_blocks;
  } else if (spread_routes) {
    spread_route_groups(v);
  }
  v.route_rounds = 1;
  if (!v.tile_router && v.route_parts == 1)
    while (route_tasks(v) > kRouteTasks) v.route_rounds *= 2;
  v.max_mtiles = max_mtiles(c.max_tokens, c.top_k, c.experts, v.tile_rows);
  v.activation = c.activation;
  v.score = c.router;
  v.renormalize = c.renormalize;
  v.gather_type = MoEPipeline::id<GatherTokens>;
  v.up_type = v.up_run > 1 ? MoEPipeline::id<ExpertUpRun> : MoEPipeline::id<ExpertUp>;
  v.down_type = MoEPipeline::id<ExpertDown>;
  v.combine_type = MoEPipeline::id<CombineTokens>;
  return v;
}

LayerShapes make_layer_shapes(MoEConfig const& c, tasks::gemm::MmaPath path,
                              std::uint32_t processors) {
  LayerShapes s;
  s.gemms = choose_expert_gemms(c, path);
  s.main = make_view_shape(c, s.gemms);
  // Route tasks that are the launch's roots, each on a processor of its own, gather.
  std::uint32_t const routes = route_tasks(s.main) * s.main.route_parts;
  if (!s.main.tile_router && routes <= processors) s.main.route_gathers = routes;
  s.has_short = short_expert_gemms(c, path, s.short_gemms);
  if (!s.has_short) return s;
  s.short_tiles = make_view_shape(c, s.short_gemms);
  s.short_tiles.route_gathers = s.main.route_gathers;
  s.main.max_mtiles = s.short_tiles.max_mtiles =
      std::max(s.main.max_mtiles, s.short_tiles.max_mtiles);
  s.main.up_tasks_bound = s.short_tiles.up_tasks_bound =
      std::max(s.main.up_tasks, s.short_tiles.up_tasks);
  // The largest call with at most kShortMTileRows rows per expert on average.
  s.main.short_tokens = kShortMTileRows * c.experts / c.top_k;
  s.main.short_rows = s.short_tiles.tile_rows;
  return s;
}

std::uint32_t dynamic_bound(MoEView const& v) {
  return v.max_mtiles * (v.up_tasks_bound + v.down_tiles) +
         PlanExperts::block_tasks(v) * v.max_call_blocks;  // + combines (and gathers)
}

Graph build_moe_graph(MoEView const& shape, MoEView const* view) {
  GraphBuilder b;
  std::uint32_t const routes = route_tasks(shape) * shape.route_parts;
  if (shape.route_gathers) {
    for (std::uint32_t route = 0; route < routes; ++route)
      b.add_task(MoEPipeline::make<RouteTokens>(BlockPayload{view, route}, kNoEvent, route));
    b.set_dynamic_bound(dynamic_bound(shape));
    return b.build();
  }
  EventId const routed = b.add_event(routes);
  for (std::uint32_t route = 0; route < routes; ++route)
    add_route_task(b, MoEPipeline::make<RouteTokens>(BlockPayload{view, route}, routed, route),
                   shape.tile_router, [&](EventId done) {
                     return MoEPipeline::make<RouteTile>(BlockPayload{view, route}, done, route);
                   });
  b.add_task(MoEPipeline::make<PlanExperts>(PlanExperts::Payload{view}), {routed});
  b.set_dynamic_bound(dynamic_bound(shape));
  return b.build();
}

}  // namespace loom::moe
