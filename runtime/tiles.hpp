// Tile-range helpers for building graphs over matrices: a grid of tiles over rows x cols with the
// last tile of each dimension clipped.
#pragma once

#include <algorithm>

#include "runtime/config.hpp"

namespace loom {

struct Tile {
  std::uint32_t row_tile, col_tile;  // tile coordinates
  std::uint32_t row0, col0;          // first element
  std::uint32_t rows, cols;          // extent, clipped at the matrix edge
};

struct TileGrid {
  std::uint32_t rows, cols, tile_rows, tile_cols;

  LOOM_HD constexpr std::uint32_t row_tiles() const { return (rows + tile_rows - 1) / tile_rows; }
  LOOM_HD constexpr std::uint32_t col_tiles() const { return (cols + tile_cols - 1) / tile_cols; }
  LOOM_HD constexpr std::uint32_t count() const { return row_tiles() * col_tiles(); }

  LOOM_HD constexpr Tile tile(std::uint32_t row_tile, std::uint32_t col_tile) const {
    std::uint32_t const r0 = row_tile * tile_rows, c0 = col_tile * tile_cols;
    return Tile{
        row_tile, col_tile, r0, c0, std::min(tile_rows, rows - r0), std::min(tile_cols, cols - c0)};
  }
  // Row-major tile index.
  LOOM_HD constexpr Tile at(std::uint32_t index) const {
    return tile(index / col_tiles(), index % col_tiles());
  }

  template <class Fn>
  void for_each(Fn&& fn) const {
    for (std::uint32_t i = 0; i < row_tiles(); ++i)
      for (std::uint32_t j = 0; j < col_tiles(); ++j) fn(tile(i, j));
  }
};

}  // namespace loom
