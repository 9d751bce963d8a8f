#include "moe/pipeline.hpp"

namespace loom::moe {

MoEView make_view_shape(MoEConfig const& c) {
  validate(c);
  MoEView v{};
  v.hidden = c.hidden;
  v.ffn = c.ffn;
  v.experts = c.experts;
  v.top_k = c.top_k;
  v.up_cols = c.up_columns();
  v.up_tiles = v.up_cols / kTileCols;
  v.down_tiles = c.hidden / kTileCols;
  v.max_tokens = c.max_tokens;
  v.max_blocks = (c.max_tokens + kTokenBlock - 1) / kTokenBlock;
  v.max_mtiles = max_mtiles(c.max_tokens, c.top_k, c.experts);
  v.activation = c.activation;
  v.score = c.router;
  v.renormalize = c.renormalize;
  v.up_type = MoEPipeline::id<ExpertUp>;
  v.down_type = MoEPipeline::id<ExpertDown>;
  v.combine_type = MoEPipeline::id<CombineTokens>;
  return v;
}

std::uint32_t dynamic_bound(MoEView const& v) {
  return v.max_mtiles * (v.up_tiles + v.down_tiles) + v.max_blocks;
}

Graph build_moe_graph(MoEConfig const& c, MoEView const* view) {
  MoEView const shape = make_view_shape(c);
  GraphBuilder b;
  EventId const routed = b.add_event(shape.max_blocks);
  EventId const planned = b.add_event(1);
  for (std::uint32_t block = 0; block < shape.max_blocks; ++block)
    b.add_task(MoEPipeline::make<RouteTokens>(BlockPayload{view, block}, routed, block));
  b.add_task(MoEPipeline::make<PlanExperts>(PlanExperts::Payload{view}, planned), {routed});
  for (std::uint32_t block = 0; block < shape.max_blocks; ++block)
    b.add_task(MoEPipeline::make<GatherTokens>(BlockPayload{view, block}, kNoEvent, block),
               {planned});
  b.set_dynamic_bound(dynamic_bound(shape));
  return b.build();
}

}  // namespace loom::moe
