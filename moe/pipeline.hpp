// The MoE layer as a Loom pipeline: its task types, and the static graph every call runs (route
// tasks for every token block up to max_tokens, then one plan; the plan emits the gathers of the
// call's token blocks, and everything after them is emitted at run time from the routing).
#pragma once

#include "moe/expert_gemms.hpp"
#include "moe/expert_tasks.hpp"
#include "moe/plan_task.hpp"
#include "moe/route_task.hpp"
#include "runtime/graph.hpp"
#include "runtime/pipeline.hpp"

namespace loom::moe {

using MoEPipeline = Pipeline<RouteTile, RouteTokens, PlanExperts, GatherTokens, ExpertUp,
                             ExpertUpRun, ExpertDown, CombineTokens>;

// The shape-derived part of a view (no pointers), and the type ids for dynamic emission. With
// wgmma expert tiles and a shape routes_on_tile admits the router runs on the tensor cores
// (tile_router: up to kRouteTileTokens tokens per route task). Otherwise, with `spread_routes`,
// few route groups split the router's slices over several tasks (the layer's own route tasks;
// expert-parallel dispatch routes each of its groups whole).
MoEView make_view_shape(MoEConfig const& config, ExpertGemmConfigs const& gemms,
                        bool spread_routes = true);

// The shapes of a one-GPU layer: `main` with the M-tile height chosen from max_tokens, and
// `short_tiles` (has_short) with 64-row M-tiles for the calls of few tokens when main's are
// taller. Both have the larger max_mtiles and up_tasks_bound, so the buffers and the dynamic bound
// cover either. With route tasks that can each have one of the executor's `processors` (0: not
// known) from the launch's start (the launch's roots: no RouteTile before them), both views have
// route_gathers: the route tasks plan and gather the call themselves (moe/route_gather.hpp).
// Bind both views' buffers alike, then point main.short_view at short_tiles' copy.
struct LayerShapes {
  MoEView main{}, short_tiles{};
  ExpertGemmConfigs gemms{}, short_gemms{};
  bool has_short = false;

  // Rows per expert M-tile of a call of `tokens` tokens: the choice PlanExperts::tiles_view makes
  // on the executor.
  std::uint32_t mtile_rows(std::uint32_t tokens) const {
    return has_short && tokens <= main.short_tokens ? short_tiles.tile_rows : main.tile_rows;
  }
};
LayerShapes make_layer_shapes(MoEConfig const& config, tasks::gemm::MmaPath path,
                              std::uint32_t processors = 0);

// Adds a route group's route task; with the router on the tensor cores (`tiled`), after that
// group's RouteTile, make_tile(e) completing event e. Shared by the one-GPU and expert-parallel
// graphs.
template <class MakeTile>
void add_route_task(GraphBuilder& b, Task const& route, bool tiled, MakeTile make_tile) {
  if (!tiled) {
    b.add_task(route);
    return;
  }
  EventId const tile_done = b.add_event(1);
  b.add_task(make_tile(tile_done));
  b.add_task(route, {tile_done});
}

// The graph over a view that lives in the executor's memory at `view`: a route task per route
// group (after that group's RouteTile with the router on the tensor cores), then the plan; where
// the route tasks gather (route_gathers), the route tasks alone.
Graph build_moe_graph(MoEView const& shape, MoEView const* view);

// Dynamic tasks one call may emit: every possible up and down tile and every combine.
std::uint32_t dynamic_bound(MoEView const& shape);

}  // namespace loom::moe
