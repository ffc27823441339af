// Replacing a local Zarr store with --overwrite keeps the old store whole until the new one is
// complete: the new store is written to a hidden directory beside the old (on the same file
// system), and swapped into its place by rename when it is done. An interrupted run leaves the
// old store as it was, and the unfinished new one where the next run with --overwrite finds it.
#pragma once

#include <filesystem>

namespace zfeed::ingest {

// The directory a replacement of `output` is written to: ".NAME.zfeed-new" beside it.
std::filesystem::path replacement_path(const std::filesystem::path& output);

// Puts the complete store at `replacement` in the place of `output` (in one atomic rename where
// the file system can exchange two names, else two renames) and removes the old store. Throws
// Error naming both paths if the swap cannot be done (the new store is then left where it is).
void swap_in_replacement(const std::filesystem::path& output,
                         const std::filesystem::path& replacement);

// Whether `directory` holds a finished store: a root zarr.json and no zfeed progress record
// (".zfeed-*-progress.json", which convert and synth keep while they write).
bool is_complete_store(const std::filesystem::path& directory);

// A swap cut short between its two renames leaves no `output`, the old store at ".NAME.zfeed-old"
// and the new at ".NAME.zfeed-new": puts the new one in place (it was complete). Call before
// looking at `output`.
void finish_interrupted_swap(const std::filesystem::path& output);

}  // namespace zfeed::ingest
