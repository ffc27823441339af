// How the loader writes values into a batch: cast from the stored data type to the output type,
// normalized on the way (loader/cast.h's per-element code, shared with the GPU kernel).
#pragma once

#include <cstddef>
#include <cstdint>

#include "zfeed/codec/data_type.h"
#include "zfeed/loader/cast.h"

namespace zfeed::loader {

// Casts (and normalizes) `count` values of `type` at `src` into `out` values at `dst`. src may
// equal dst when both elements have the same size (float32 in place).
void cast_values(const uint8_t* src, DataType type, uint8_t* dst, OutputType out, size_t count,
                 Normalization normalization);

// The same values, written with non-temporal (streaming) stores where dst is large enough: a
// batch is written once and read next by the consumer or the copy to the GPU, never by the
// writing thread, so a store that neither reads the line first nor keeps it in cache halves the
// memory traffic (at 16 threads the batch writes pressed on memory bandwidth). src and dst must
// not overlap. Plain stores on targets without SSE2.
void stream_values(const uint8_t* src, DataType type, uint8_t* dst, OutputType out, size_t count,
                   Normalization normalization);

}  // namespace zfeed::loader
