// Small helpers for the local paths the commands take: "file://" URLs, trailing separators, and
// making renames durable.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace zfeed {

// Whether `path_or_url` names a local path: no scheme, or "file://".
bool is_local_path(std::string_view path_or_url);

// "file:///x" as the path "/x"; anything else as given.
std::string strip_file_scheme(std::string_view path_or_url);

// The path in normal form without a trailing separator ("./out.zarr/" is "out.zarr"), so that its
// file name is its last component.
std::filesystem::path without_trailing_separator(const std::filesystem::path& path);

// Makes the entries of `directory` (renames, new files) durable: fsync of the directory. Best
// effort: a file system that cannot sync a directory is left as it is.
void sync_directory(const std::filesystem::path& directory);

}  // namespace zfeed
