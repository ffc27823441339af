#pragma once

#include <cstdint>

#include "zfeed/util/bytes.h"

namespace zfeed {

// CRC-32C (Castagnoli), as the crc32c codec stores it.
uint32_t crc32c(ByteView data);

}  // namespace zfeed
