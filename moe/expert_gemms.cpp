#include "moe/expert_gemms.hpp"

namespace loom::moe {

using namespace tasks::gemm;

namespace {

ExpertGemmConfigs expert_gemms(std::uint32_t block_m, MmaPath path) {
  GemmConfig g{};
  g.block_m = block_m;
  g.block_n = 256;
  g.splits = 1;
  g.path = path;
  g.stages = static_cast<std::uint8_t>(g.max_stages());
  return ExpertGemmConfigs{g, g, block_m == 64 ? kShortUpRun : 1u};
}

}  // namespace

ExpertGemmConfigs choose_expert_gemms(MoEConfig const& c, MmaPath path) {
  return expert_gemms(short_mtiles(c, c.max_tokens) ? 64 : 128, path);
}

bool short_expert_gemms(MoEConfig const& c, MmaPath path, ExpertGemmConfigs& out) {
  if (short_mtiles(c, c.max_tokens)) return false;
  out = expert_gemms(64, path);
  check_short_gemms(choose_expert_gemms(c, path), out);
  return true;
}

void check_short_gemms(ExpertGemmConfigs const& tall, ExpertGemmConfigs const& short_tiles) {
  auto const check = [](char const* gemm, GemmConfig const& t, GemmConfig const& s) {
    if (t.block_n != s.block_n)
      throw Error(std::string("loom: the ") + gemm +
                  " GEMM's short M-tiles must use the tall ones' N-tiles (" +
                  std::to_string(s.block_n) + " columns against " + std::to_string(t.block_n) +
                  "): an expert's last M-tile is emitted with the layer's N-tile count");
  };
  check("up", tall.up, short_tiles.up);
  check("down", tall.down, short_tiles.down);
}

GemmDesc up_gemm_desc(MoEConfig const& c, bf16 const* pool, bf16 const* w1, bf16* h,
                      ExpertSide side) {
  GemmDesc d;
  d.a = reinterpret_cast<Bf16 const*>(pool);
  d.a_rows = side.pool_rows;
  d.b = reinterpret_cast<Bf16 const*>(w1);
  d.experts = side.experts;
  d.n = c.up_columns();
  d.k = c.hidden;
  d.c = h;
  d.ldc = c.ffn;
  d.output = OutputType::bf16;
  d.activation = c.activation == Activation::swiglu ? GemmActivation::swiglu
                 : c.activation == Activation::gelu ? GemmActivation::gelu_tanh
                                                    : GemmActivation::relu;
  return d;
}

GemmDesc down_gemm_desc(MoEConfig const& c, bf16 const* h, bf16 const* w2, bf16* y,
                        ExpertSide side) {
  GemmDesc d;
  d.a = reinterpret_cast<Bf16 const*>(h);
  d.a_rows = side.pool_rows;
  d.b = reinterpret_cast<Bf16 const*>(w2);
  d.experts = side.experts;
  d.n = c.hidden;
  d.k = c.ffn;
  d.c = y;  // the sink writes rows to their (slot, token) place; C names the buffer
  d.ldc = c.hidden;
  d.output = OutputType::bf16;
  d.activation = GemmActivation::none;
  return d;
}

}  // namespace loom::moe
