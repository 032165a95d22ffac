// Exports a TorchScript model from Python for tests (the system python3 has torch).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace cleave {

// Runs `/usr/bin/python3` with `import torch, torch.nn as nn`, evaluates `module_expr`
// (e.g. "nn.Sequential(nn.Flatten(), nn.Linear(784, 10))") with torch's seed 0 and saves
// torch.jit.script of it to a temporary file named `name`. Returns the path, or "" if
// the export failed.
inline std::string ExportTorchScript(const std::string& name, const std::string& module_expr) {
  const std::string path = (std::filesystem::temp_directory_path() / name).string();
  const std::string cmd = "/usr/bin/python3 -c \"import torch, torch.nn as nn; "
                          "torch.manual_seed(0); torch.jit.script(" +
                          module_expr + ").save('" + path + "')\"";
  return std::system(cmd.c_str()) == 0 ? path : "";
}

}  // namespace cleave
