// Host (CUDA): a GEMM's operands living on the device, and graph building over its tiles.
//
//   DeviceGemm gemm(desc, config);                  // validates, encodes TMA maps, uploads
//   std::uint32_t slot = 0;
//   add_gemm_tiles<MyPipeline>(builder, gemm, {expert, a_row0, c_row0, rows}, slot);
//
// The DeviceGemm must outlive every launch of graphs that use it. Split-K tiles share a workspace
// of `slots` partial-tile slots and arrival counters (zeroed here, left zeroed by each launch).
#pragma once

#include <algorithm>
#include <vector>

#include "runtime/cuda/device_buffer.hpp"
#include "runtime/graph.hpp"
#include "runtime/pipeline.hpp"
#include "tasks/gemm/tensor_map.hpp"
#include "tasks/gemm/tiling.hpp"

namespace loom::tasks::gemm {

class DeviceGemm {
 public:
  // `slots`: tiles that may be split at once in one launch; 0 picks enough for any row layout of
  // the A pool (ceil(a_rows / block_m) + experts row tiles, times the n tiles).
  DeviceGemm(GemmDesc const& desc, GemmConfig const& config, std::uint32_t slots = 0)
      : host_(make_operands(desc, config)) {
    if (config.path == MmaPath::wgmma) encode_tensor_maps(host_);
    if (config.splits > 1) {
      if (slots == 0) slots = host_.slots_for_any_rows();
      workspace_ =
          DeviceBuffer<float>(std::size_t{slots} * config.splits * config.block_m * config.block_n);
      counters_ = DeviceBuffer<std::uint32_t>(slots);
      counters_.fill_bytes(0);
      host_.workspace = workspace_.get();
      host_.counters = counters_.get();
      host_.slots = slots;
    }
    LOOM_CUDA(cudaMemcpy(ops_.get(), &host_, sizeof host_, cudaMemcpyHostToDevice));
  }

  GemmOperands const& host_view() const { return host_; }
  GemmOperands const* device() const { return ops_.get(); }
  GemmConfig const& config() const { return host_.config; }

 private:
  GemmOperands host_;
  DeviceBuffer<GemmOperands> ops_{1};
  DeviceBuffer<float> workspace_;
  DeviceBuffer<std::uint32_t> counters_;
};

// Adds the tile tasks of `block` to `builder` (order: gemm_tile_payloads with `group_m`) and
// returns how many were added. Tasks run after every event in `after`.
//
// chains == 0: independent tasks; each completes `completes` (if given): one arrival per task.
// chains > 0: task t joins chain t % chains, and each task's completion event gates the next task
// of its chain. A processor that finishes a tile then takes the next tile of its chain by local
// dispatch instead of a scheduler round trip: when many equal tiles finish together, processors
// otherwise wait for the scheduler to hand them their next task one at a time (~10 us for 131
// processors on an H200). Use the executor's processor count. Only the chain tails complete
// `completes`: min(tasks, chains) arrivals. run > 1: tasks of up to `run` n tiles each.
template <class Pipeline, class Task = GemmTile>
std::uint32_t add_gemm_tiles(GraphBuilder& builder, DeviceGemm const& gemm,
                             GemmRowBlock const& block, std::uint32_t& next_slot,
                             EventId completes = kNoEvent, std::vector<EventId> const& after = {},
                             std::uint32_t group_m = kRasterGroupM, std::uint32_t chains = 0,
                             std::uint32_t run = 1) {
  auto const payloads =
      gemm_tile_payloads<Task>(gemm.host_view(), gemm.device(), block, next_slot, group_m, run);
  std::size_t const n = payloads.size();
  std::vector<EventId> done(n, completes);
  if (chains > 0)
    for (std::size_t t = 0; t + chains < n; ++t) done[t] = builder.add_event(1);
  for (std::size_t t = 0; t < n; ++t) {
    loom::Task const task = Pipeline::template make<Task>(payloads[t], done[t]);
    if (chains > 0 && t >= chains)
      builder.add_task(task, {done[t - chains]});
    else
      builder.add_task(task, after);
  }
  return static_cast<std::uint32_t>(n);
}

}  // namespace loom::tasks::gemm
