#include "zfeed/tools/python_verb.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>

extern char** environ;

namespace zfeed::tools {
namespace {

namespace fs = std::filesystem;

const char* const kInterpreterNames[] = {"python3", "python"};

// The folder of the running executable, or empty where /proc/self/exe cannot be read.
fs::path own_folder() {
  std::error_code error;
  fs::path self = fs::read_symlink("/proc/self/exe", error);
  return error ? fs::path() : self.parent_path();
}

bool is_executable_file(const fs::path& path) {
  std::error_code error;
  return fs::is_regular_file(path, error) && ::access(path.c_str(), X_OK) == 0;
}

// Interpreters to try, in order: beside this executable, then on PATH.
std::vector<fs::path> candidate_interpreters() {
  std::vector<fs::path> candidates;
  fs::path folder = own_folder();
  if (!folder.empty()) {
    for (const char* name : kInterpreterNames) candidates.push_back(folder / name);
  }
  const char* path_variable = std::getenv("PATH");
  for (const char* name : kInterpreterNames) {
    std::istringstream folders(path_variable ? path_variable : "");
    std::string entry;
    while (std::getline(folders, entry, ':')) {
      if (entry.empty()) continue;
      fs::path candidate = fs::path(entry) / name;
      if (is_executable_file(candidate)) {
        candidates.push_back(candidate);
        break;
      }
    }
  }
  return candidates;
}

// Runs `python -c` to learn whether it can import `module` (its output is discarded).
bool can_import(const fs::path& python, const std::string& module) {
  std::string code = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('" +
                     module + "') else 3)";
  std::string interpreter = python.string();
  std::vector<char*> argv = {interpreter.data(), const_cast<char*>("-c"), code.data(), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t child = 0;
  int failed = ::posix_spawn(&child, interpreter.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (failed != 0) return false;
  int status = 0;
  while (::waitpid(child, &status, 0) < 0) {
    if (errno != EINTR) return false;
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

CLI::App* add_python_verb(CLI::App& app, const std::string& name, const std::string& description) {
  CLI::App* verb = app.add_subcommand(name, description);
  verb->set_help_flag();   // --help is the module's
  verb->allow_extras();    // every argument is the module's
  verb->prefix_command();  // ... even those that look like options
  return verb;
}

int exec_python_module(const std::string& module, const std::vector<std::string>& args) {
  std::vector<std::string> tried;
  for (const fs::path& python : candidate_interpreters()) {
    if (!is_executable_file(python)) {
      tried.push_back(python.string() + " (not there)");
      continue;
    }
    if (!can_import(python, module)) {
      tried.push_back(python.string() + " (cannot import " + module + ")");
      continue;
    }
    std::vector<std::string> words = {python.string(), "-m", module};
    words.insert(words.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& word : words) argv.push_back(word.data());
    argv.push_back(nullptr);
    ::execv(python.c_str(), argv.data());
    std::cerr << "zfeed: error: cannot run " << python.string() << ": " << std::strerror(errno)
              << "\n";
    return 127;
  }
  std::cerr << "zfeed: error: no Python that can import " << module << " was found; tried ";
  if (tried.empty()) std::cerr << "nothing (no python3 or python beside this command or on PATH)";
  for (size_t i = 0; i < tried.size(); ++i) std::cerr << (i ? ", " : "") << tried[i];
  std::cerr << ". Install the zfeed package (`make python`, or `pip install .`) into the "
               "environment of this "
               "command, or put such a Python first on PATH.\n";
  return 127;
}

}  // namespace zfeed::tools
