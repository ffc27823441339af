// Verbs of the `zfeed` command that run a Python module of the zfeed package (`zfeed bench`,
// `zfeed train`), with the interpreter of the environment the command was installed into.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace zfeed::tools {

// Adds a subcommand whose arguments, --help included, all go to the Python module untouched
// (read them back with `remaining()` once parsed).
CLI::App* add_python_verb(CLI::App& app, const std::string& name, const std::string& description);

// Replaces this process with `PYTHON -m module args...` (execv: signals, the exit status and
// stdin/stdout/stderr are the module's own). PYTHON is the first of python3 and python beside this
// executable (the folder of /proc/self/exe: .venv/bin for `pip install .`), then of python3 and
// python on PATH, that can import `module`. Returns only where none can or the exec fails: prints
// what it tried and returns 127.
int exec_python_module(const std::string& module, const std::vector<std::string>& args);

}  // namespace zfeed::tools
